# Collective diagnosis (src/diagnosis): flight recorder, stall report, DETAIL mode.

# Ranks as threads over one HashStore.
dtrain_test(diagnosis_test LABELS diagnosis SOURCES diagnosis/diagnosis_test.cpp TORCH)

# Real processes under `dtrain run`: the worker picks its misbehaviour with --mode.
add_executable(diagnosis_worker diagnosis/diagnosis_worker.cpp)
target_link_libraries(diagnosis_worker PRIVATE dtrain)
dtrain_use_torch_pch(diagnosis_worker)
target_compile_options(diagnosis_worker PRIVATE ${DTRAIN_WARNINGS})
dtrain_test(diagnosis_mp_test LABELS diagnosis
  SOURCES diagnosis/diagnosis_mp_test.cpp launcher/subprocess.cpp)
dtrain_test_programs(diagnosis_mp_test DIAGNOSIS_WORKER_BIN diagnosis_worker)
add_dependencies(diagnosis_mp_test diagnosis_worker dtrain_cli)
