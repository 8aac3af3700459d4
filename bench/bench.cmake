# Benchmarks. The all-reduce benchmark worker (bench/allreduce_bench.cpp); bench/allreduce_bench.py runs
# it under `dtrain run` and compares with torch.distributed under torchrun.
# Included from the root CMakeLists.txt; include_guard makes a second include harmless.
include_guard(GLOBAL)

add_executable(allreduce_bench ${PROJECT_SOURCE_DIR}/bench/allreduce_bench.cpp)
target_link_libraries(allreduce_bench PRIVATE dtrain)
target_compile_options(allreduce_bench PRIVATE ${DTRAIN_WARNINGS})
# Always build/bench/allreduce_bench, wherever this file is included from.
set_target_properties(allreduce_bench PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)

# Distributor round trip vs `dtrain run` of the same work (bench/distributor_bench.cpp).
add_executable(distributor_bench ${PROJECT_SOURCE_DIR}/bench/distributor_bench.cpp)
target_link_libraries(distributor_bench PRIVATE dtrain)
target_compile_options(distributor_bench PRIVATE ${DTRAIN_WARNINGS})
target_compile_definitions(distributor_bench PRIVATE DTRAIN_LAUNCHER_BIN="$<TARGET_FILE:dtrain_cli>")
set_target_properties(distributor_bench PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)

# ZeRO: CPU Adam vs torch::optim::Adam and memcpy; memory and throughput by stage (bench/zero_bench.cpp).
add_executable(zero_bench ${PROJECT_SOURCE_DIR}/bench/zero_bench.cpp)
target_link_libraries(zero_bench PRIVATE dtrain)
target_compile_options(zero_bench PRIVATE ${DTRAIN_WARNINGS})
set_target_properties(zero_bench PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)
