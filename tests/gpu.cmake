# GPUs (issue #26): built in every CUDA build (so CI compiles them), registered with CTest only
# where the build has CUDA and a GPU is visible (cmake/libtorch.cmake says which at configure
# time: DTRAIN_REGISTER_GPU_TESTS). scripts/gpu_check.sh runs them on the GPU machine.
if(NOT DTRAIN_WITH_CUDA)
  return()
endif()
add_executable(gpu_worker gpu/gpu_worker.cpp)
target_link_libraries(gpu_worker PRIVATE dtrain dtrain::cuda)
dtrain_use_torch_pch(gpu_worker)
target_compile_options(gpu_worker PRIVATE ${DTRAIN_WARNINGS})

if(DTRAIN_REGISTER_GPU_TESTS)
  dtrain_test(gpu_test LABELS gpu SOURCES gpu/gpu_test.cpp launcher/subprocess.cpp TORCH)
else()
  # Compiled, not registered: the same sources, never run on a machine without a GPU.
  add_executable(gpu_test gpu/gpu_test.cpp)
  target_include_directories(gpu_test PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
  target_link_libraries(gpu_test PRIVATE GTest::gtest dtrain dtrain_test_torch_env
                        dtrain_test_subprocess dtrain_test_paths nlohmann_json::nlohmann_json)
  dtrain_use_torch_pch(gpu_test)
endif()
dtrain_test_programs(gpu_test GPU_WORKER_BIN gpu_worker FASHION_MNIST_BIN fashion_mnist)
add_dependencies(gpu_test dtrain_cli)
