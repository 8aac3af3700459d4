# DistributedDataParallel: ranks as threads (unit).
dtrain_test(ddp_test LABELS unit SOURCES unit/ddp_test.cpp TORCH)
# Parity with one process, through the real launcher (multi-process).
add_executable(parity_worker parallel/parity_worker.cpp)
target_link_libraries(parity_worker PRIVATE dtrain CLI11::CLI11)
dtrain_use_torch_pch(parity_worker)
dtrain_test(ddp_parity_test LABELS parallel SOURCES parallel/ddp_parity_test.cpp launcher/subprocess.cpp TORCH)
dtrain_test_programs(ddp_parity_test PARITY_WORKER_BIN parity_worker)
add_dependencies(ddp_parity_test parity_worker dtrain_cli)
