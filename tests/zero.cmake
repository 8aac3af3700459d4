# ZeRO (#11): the config (no libtorch), the engine's rules with ranks as threads, and parity
# with DDP over real processes through the launcher.
dtrain_test(zero_config_test LABELS zero SOURCES zero/config_test.cpp launcher/subprocess.cpp)
add_dependencies(zero_config_test dtrain_cli)
dtrain_test(zero_engine_test LABELS zero SOURCES zero/engine_test.cpp launcher/subprocess.cpp TORCH)
dtrain_test_programs(zero_engine_test DTRAIN_ZERO_HELPER dtrain_zero_tool)
add_dependencies(zero_engine_test dtrain_zero_tool dtrain_cli)
add_executable(zero_worker zero/zero_worker.cpp)
target_link_libraries(zero_worker PRIVATE dtrain CLI11::CLI11)
dtrain_use_torch_pch(zero_worker)
dtrain_test(zero_parity_test LABELS zero SOURCES zero/parity_test.cpp launcher/subprocess.cpp TORCH)
dtrain_test_programs(zero_parity_test ZERO_WORKER_BIN zero_worker)
add_dependencies(zero_parity_test zero_worker dtrain_cli)
# The DeepSpeedDistributor: the test binary is its own worker; ds_program is a program-mode target.
add_executable(ds_program zero/ds_program.cpp)
target_link_libraries(ds_program PRIVATE dtrain CLI11::CLI11)
dtrain_use_torch_pch(ds_program)
dtrain_test(deepspeed_distributor_test LABELS zero SOURCES zero/deepspeed_distributor_test.cpp launcher/subprocess.cpp TORCH)
dtrain_test_programs(deepspeed_distributor_test DS_PROGRAM_BIN ds_program)
add_dependencies(deepspeed_distributor_test ds_program dtrain_cli)
# Against Spark's DeepspeedTorchDistributor (the venv's pyspark; the same launcher either way).
dtrain_test_once(deepspeed_distributor_test torch2 MATCHING "AsSparks")
# The Fashion-MNIST example with --deepspeed (real data, real processes).
dtrain_test(zero_example_test LABELS zero SOURCES zero/example_test.cpp launcher/subprocess.cpp)
dtrain_test_programs(zero_example_test FASHION_MNIST_BIN fashion_mnist)
add_dependencies(zero_example_test fashion_mnist dtrain_cli)
# Stage 3's per-submodule fetch: resident bytes between units, prefetch order, bytes sent.
dtrain_test(zero_stage3_fetch_test LABELS zero SOURCES zero/stage3_fetch_test.cpp TORCH)
# The user's own torch::optim optimizer on the partitions (DeepSpeed's client optimizer).
dtrain_test(zero_client_optimizer_test LABELS zero SOURCES zero/client_optimizer_test.cpp TORCH)
# Configs, schedulers and optimizers against DeepSpeed's own: DeepSpeedConfig at each world size
# and deepspeed.initialize once per config (the venv's DeepSpeed, one Python process for every
# case; its CPU Adam and FusedAdam ops are JIT-built once into ~/.cache/torch_extensions).
dtrain_test(zero_deepspeed_reference_test LABELS zero SOURCES zero/deepspeed_reference_test.cpp TORCH)
# Training side by side with DeepSpeed itself: 2 ranks, stages 1-3, its CPU optimizers.
add_executable(ds_parity_worker zero/ds_parity_worker.cpp)
target_link_libraries(ds_parity_worker PRIVATE dtrain)
dtrain_use_torch_pch(ds_parity_worker)
dtrain_test(zero_deepspeed_parity_test LABELS zero SOURCES zero/deepspeed_parity_test.cpp launcher/subprocess.cpp TORCH)
dtrain_test_programs(zero_deepspeed_parity_test DS_PARITY_WORKER_BIN ds_parity_worker)
add_dependencies(zero_deepspeed_parity_test ds_parity_worker dtrain_cli)
# The checkpoint file format: exact round trip, one-line errors for bad files.
dtrain_test(zero_checkpoint_format_test LABELS zero SOURCES zero/checkpoint_format_test.cpp launcher/subprocess.cpp TORCH)
add_dependencies(zero_checkpoint_format_test dtrain_cli dtrain_zero_tool)
# Partitioned construction (zero_init.h): shards equal to a whole construction, stage-3 training
# from them, and a 168M-parameter model built and trained on 4 ranks below its fp32 size in RSS.
add_executable(partitioned_worker zero/partitioned_worker.cpp)
target_link_libraries(partitioned_worker PRIVATE dtrain CLI11::CLI11)
dtrain_use_torch_pch(partitioned_worker)
dtrain_test(zero_partitioned_init_test LABELS zero SOURCES zero/partitioned_init_test.cpp launcher/subprocess.cpp TORCH)
dtrain_test_programs(zero_partitioned_init_test PARTITIONED_WORKER_BIN partitioned_worker)
add_dependencies(zero_partitioned_init_test partitioned_worker dtrain_cli)
# Peak RSS per rank at dtrain's default settings (issue 28's bounds), measured by the benchmark's
# worker; where the benchmarks are built (CI's tree is). ~70 s; what it bounds is the engine's
# partitioning, not libtorch's, so once, on the 2.x build.
if(TARGET zero_bench)
  add_test(NAME zero.peak_rss_at_defaults
    COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/zero/peak_rss_test.py $<TARGET_FILE:dtrain_cli> $<TARGET_FILE:zero_bench>)
  set_tests_properties(zero.peak_rss_at_defaults PROPERTIES LABELS "zero;torch2_only" TIMEOUT 900)
endif()
# The engine's GradScaler (fp16 torch_autocast) against torch.amp.GradScaler in the venv.
dtrain_test(zero_grad_scaler_test LABELS zero SOURCES zero/grad_scaler_test.cpp launcher/subprocess.cpp TORCH)
# The progress output's pieces: the throughput timer on a test clock, get_mom() of client optimizers.
dtrain_test(zero_progress_test LABELS zero SOURCES zero/progress_test.cpp TORCH)
