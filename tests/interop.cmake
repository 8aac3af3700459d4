# The launcher with real PyTorch on both sides (python3-torch's DDP and torchrun).
dtrain_test(launcher_interop_test LABELS interop
  SOURCES interop/launcher_interop_test.cpp launcher/subprocess.cpp)
dtrain_test_programs(launcher_interop_test HELLO_WORKER_BIN hello_worker TEST_WORKER_BIN test_worker)
add_dependencies(launcher_interop_test dtrain_cli hello_worker test_worker)
# The venv-only scenarios (its torchrun, a PyTorch 2.x script restarted 20 times, ~100 s) run
# in one build.
dtrain_test_once(launcher_interop_test torch2 MATCHING "AsUnderTorchrun|AsTorchDistributedLaunch|RestartTwentyTimes|AsDocumented")
