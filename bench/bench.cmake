# Benchmarks, each built as build/bench/<name> (wherever this file is included from); the
# Python drivers beside them run them and their peers and print the ratios.
# Included from the root CMakeLists.txt; include_guard makes a second include harmless.
include_guard(GLOBAL)

# dtrain_bench(NAME SOURCE [LIBS ...]): an executable linked with dtrain (and LIBS).
function(dtrain_bench name source)
  add_executable(${name} ${PROJECT_SOURCE_DIR}/bench/${source})
  target_link_libraries(${name} PRIVATE dtrain ${ARGN})
  dtrain_use_torch_pch(${name})
  target_compile_options(${name} PRIVATE ${DTRAIN_WARNINGS})
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)
endfunction()

# The all-reduce worker; bench/allreduce_bench.py runs it under `dtrain run` and compares with
# torch.distributed under torchrun.
dtrain_bench(allreduce_bench allreduce_bench.cpp)

# Distributor round trip vs `dtrain run` of the same work.
dtrain_bench(distributor_bench distributor_bench.cpp)
target_compile_definitions(distributor_bench PRIVATE DTRAIN_LAUNCHER_BIN="$<TARGET_FILE:dtrain_cli>")

# ZeRO: CPU Adam vs torch::optim::Adam and memcpy; memory and throughput by stage.
dtrain_bench(zero_bench zero_bench.cpp)
target_compile_definitions(zero_bench PRIVATE DTRAIN_LAUNCHER_BIN="$<TARGET_FILE:dtrain_cli>")

# The cost of one timeline span, off and on (Google Benchmark); bench/timeline_bench.py turns
# it into the overhead per training step.
find_package(benchmark QUIET)
if(benchmark_FOUND)
  dtrain_bench(timeline_span_bench timeline_span_bench.cpp benchmark::benchmark)
else()
  message(WARNING "Google Benchmark is missing (apt-get install libbenchmark-dev; scripts/setup.sh "
    "does): timeline_span_bench is not built")
endif()

# Model parallelism: pipeline bubble vs (P-1)/(M+P-1), tensor-parallel memory per rank.
dtrain_bench(model_parallel_bench model_parallel_bench.cpp)

# hvd's DistributedOptimizer vs DDP, and fusion on vs off (run under dtrain run).
dtrain_bench(horovod_bench horovod_bench.cpp)

# Collective diagnosis: flight recorder + stall watchdog (info) and DETAIL vs off.
dtrain_bench(diagnosis_bench diagnosis_bench.cpp)

# dtrain::tune scheduling overhead per trial with a trivial trainable; bench/tune_bench.py
# runs it beside Ray Tune's and prints the ratio.
dtrain_bench(tune_overhead_bench tune_overhead.cpp)

# The job's store at 256-8,192 ranks against PyTorch 2.x's libuv TCPStore server (the venv's);
# no libtorch: the store is part of dtrain::core.
add_executable(store_bench ${PROJECT_SOURCE_DIR}/bench/store_bench.cpp)
target_link_libraries(store_bench PRIVATE dtrain_core)
target_include_directories(store_bench PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_compile_options(store_bench PRIVATE ${DTRAIN_WARNINGS})
set_target_properties(store_bench PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)
# dtrain::data's delivery rate (bench/data_bench.py: vs Petastorm and a PyTorch DataLoader over
# pyarrow, and the example's MLP from Parquet vs from memory).
if(DTRAIN_HAVE_DATA)
  dtrain_bench(data_bench data_bench.cpp dtrain_data)
endif()

# One process training on one GPU (bench/gpu_bench.py runs it beside bench/gpu_train_peer.py).
# Built everywhere; it refuses to run without a GPU.
dtrain_bench(gpu_train_bench gpu_train_bench.cpp)
if(TARGET dtrain::cuda)
  # --graph: the step as a CUDA graph (ATen's CUDAGraph), in CUDA builds.
  target_link_libraries(gpu_train_bench PRIVATE dtrain::cuda)
  target_compile_definitions(gpu_train_bench PRIVATE DTRAIN_BENCH_CUDA_GRAPH)
endif()
