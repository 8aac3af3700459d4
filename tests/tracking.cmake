# Tracking and observability (#13): progress, timeline, and MLflow against a real server.
dtrain_test(progress_timeline_test LABELS tracking SOURCES tracking/progress_timeline_test.cpp launcher/subprocess.cpp)
dtrain_test_programs(progress_timeline_test FASHION_MNIST_BIN fashion_mnist)
add_dependencies(progress_timeline_test fashion_mnist dtrain_cli)

# One `mlflow server` for all of this binary's cases: CTest runs the binary as one test.
add_executable(mlflow_server_test tracking/mlflow_server_test.cpp)
target_include_directories(mlflow_server_test PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
target_link_libraries(mlflow_server_test PRIVATE GTest::gtest GTest::gtest_main dtrain_tracking nlohmann_json::nlohmann_json
                      dtrain_test_subprocess dtrain_test_paths)
target_compile_options(mlflow_server_test PRIVATE ${DTRAIN_WARNINGS})
dtrain_test_programs(mlflow_server_test FASHION_MNIST_BIN fashion_mnist DISTRIBUTOR_EXAMPLE_BIN distributor_example)
add_dependencies(mlflow_server_test fashion_mnist distributor_example dtrain_cli)
add_test(NAME tracking.mlflow_server COMMAND mlflow_server_test)
# ~3-4 min on a quiet 2-core machine; far more while other builds load it.
# Once, against 1.13: the server's side does not depend on libtorch.
set_tests_properties(tracking.mlflow_server PROPERTIES LABELS "tracking;torch1_only" TIMEOUT 900)

# State dicts in mlflow.pytorch's format against the server and Python's mlflow.pytorch: one
# server for the binary's cases, so one CTest test. On both trees: the C++ side is libtorch's.
add_executable(mlflow_state_dict_test tracking/mlflow_state_dict_test.cpp)
target_include_directories(mlflow_state_dict_test PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
target_link_libraries(mlflow_state_dict_test PRIVATE GTest::gtest GTest::gtest_main dtrain nlohmann_json::nlohmann_json
                      dtrain_test_subprocess dtrain_test_paths)
dtrain_use_torch_pch(mlflow_state_dict_test)
target_compile_options(mlflow_state_dict_test PRIVATE ${DTRAIN_WARNINGS})
add_test(NAME tracking.mlflow_state_dict COMMAND mlflow_state_dict_test)
set_tests_properties(tracking.mlflow_state_dict PROPERTIES LABELS "tracking" TIMEOUT 600)
