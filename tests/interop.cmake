# The launcher with real PyTorch on both sides (python3-torch's DDP and torchrun).
dtrain_test(launcher_interop_test LABELS interop
  SOURCES interop/launcher_interop_test.cpp launcher/subprocess.cpp)
dtrain_test_programs(launcher_interop_test HELLO_WORKER_BIN hello_worker)
add_dependencies(launcher_interop_test dtrain_cli hello_worker)
