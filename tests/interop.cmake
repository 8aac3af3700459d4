# The launcher with real PyTorch on both sides (python3-torch's DDP and torchrun).
dtrain_test(launcher_interop_test LABELS interop
  SOURCES interop/launcher_interop_test.cpp launcher/subprocess.cpp)
target_compile_definitions(launcher_interop_test PRIVATE HELLO_WORKER_BIN="$<TARGET_FILE:hello_worker>")
add_dependencies(launcher_interop_test dtrain_cli hello_worker)
