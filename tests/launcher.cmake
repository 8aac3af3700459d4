# The launcher (`dtrain run`, src/launch).

# A worker without libtorch whose flags are behaviours (see its header comment).
add_library(preload_probe SHARED launcher/preload_probe.cpp)
add_library(dlopen_probe MODULE launcher/dlopen_probe.cpp)
# A stand-in for CUDA's driver (soname libcuda.so.1) that preload_probe loads on request.
add_library(fake_libcuda MODULE launcher/fake_libcuda.cpp)
target_link_options(fake_libcuda PRIVATE "LINKER:-soname,libcuda.so.1")
add_executable(test_worker launcher/test_worker.cpp)
target_link_libraries(test_worker PRIVATE dtrain_core preload_probe)
target_link_options(test_worker PRIVATE "LINKER:--export-dynamic-symbol=dtrain_forkserver_prepare")

# In-process: flag parsing and validation, output fan-in, rank layout, rendezvous.
dtrain_test(launch_options_test LABELS unit SOURCES unit/launch_options_test.cpp)

# Real processes through the real `dtrain` binary on loopback.
dtrain_test(launcher_test LABELS launcher
  SOURCES launcher/launcher_test.cpp launcher/subprocess.cpp)
dtrain_test_programs(launcher_test TEST_WORKER_BIN test_worker PRELOAD_PROBE_LIB preload_probe DLOPEN_PROBE_LIB dlopen_probe
  FAKE_LIBCUDA_LIB fake_libcuda)
# The tests execute these; building launcher_test must build them too.
add_dependencies(launcher_test test_worker dtrain_cli dtrain_forkserver dlopen_probe fake_libcuda)
# Nothing here links libtorch (the `dtrain` binary, test_worker, the fork server's preload): the
# same programs on both builds, so once.
dtrain_test_once(launcher_test torch2)
# Every launcher test again with the workers forked from a fork server (test_worker does
# not link libtorch, so "auto" spawns it).
gtest_discover_tests(launcher_test TEST_PREFIX "forkserver." TEST_LIST launcher_test_forkserver_TESTS
  PROPERTIES LABELS launcher ENVIRONMENT "DTRAIN_TEST_START_METHOD=forkserver" DISCOVERY_TIMEOUT 60)
dtrain_test_once(launcher_test torch2 LIST launcher_test_forkserver_TESTS)

# `dtrain deepspeed` against the venv's real `deepspeed` launcher (DeepSpeed 0.19.8 on its CPU
# accelerator), on the same Python and C++ workers, flag set by flag set.
add_executable(ds_env_worker launcher/ds_env_worker.cpp)
target_link_libraries(ds_env_worker PRIVATE nlohmann_json::nlohmann_json)
dtrain_test(deepspeed_launcher_test LABELS launcher
  SOURCES launcher/deepspeed_launcher_test.cpp launcher/subprocess.cpp)
dtrain_test_programs(deepspeed_launcher_test DS_ENV_WORKER_BIN ds_env_worker
  CLUSTER_WORKER_BIN cluster_worker)
add_dependencies(deepspeed_launcher_test dtrain_cli dtrain_forkserver)
# The launchers' behaviour does not depend on libtorch (DeepSpeed's side is the venv's either
# way; ~100 s, most of it DeepSpeed's launcher starting), so once.
dtrain_test_once(deepspeed_launcher_test torch2)
