# The launcher (`dtrain run`, src/launch).

# A worker without libtorch whose flags are behaviours (see its header comment).
add_executable(test_worker launcher/test_worker.cpp)
target_link_libraries(test_worker PRIVATE dtrain_core)

# In-process: flag parsing and validation, output fan-in, rank layout, rendezvous.
dtrain_test(launch_options_test LABELS unit SOURCES unit/launch_options_test.cpp)

# Real processes through the real `dtrain` binary on loopback.
dtrain_test(launcher_test LABELS launcher
  SOURCES launcher/launcher_test.cpp launcher/subprocess.cpp)
target_compile_definitions(launcher_test PRIVATE TEST_WORKER_BIN="$<TARGET_FILE:test_worker>")
# The tests execute these; building launcher_test must build them too.
add_dependencies(launcher_test test_worker dtrain_cli)
