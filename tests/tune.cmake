# dtrain::tune: schedulers and search spaces against Ray Tune itself (the venv's ray[tune],
# scripts/requirements.txt), the Tuner end to end with real trials, and a driver killed
# mid-search that resumes.
dtrain_test(tune_parity_test LABELS tune SOURCES tune/scheduler_parity_test.cpp TORCH)

dtrain_test(tune_tuner_test LABELS tune SOURCES tune/tuner_test.cpp TORCH)
add_dependencies(tune_tuner_test dtrain_cli)

add_executable(tune_driver_program tune/driver_program.cpp)
target_link_libraries(tune_driver_program PRIVATE dtrain)
dtrain_use_torch_pch(tune_driver_program)
dtrain_test(tune_resume_test LABELS tune SOURCES tune/resume_test.cpp launcher/subprocess.cpp)
dtrain_test_programs(tune_resume_test TUNE_DRIVER_PROGRAM tune_driver_program)
add_dependencies(tune_resume_test tune_driver_program dtrain_cli)
dtrain_test_once(tune_resume_test torch1)  # ~20 s of driver logic, the same on both builds

# Each trial an MLflow child run of the search, against a real `mlflow server` (the venv's).
dtrain_test(tune_mlflow_test LABELS tune SOURCES tune/mlflow_test.cpp launcher/subprocess.cpp TORCH)
add_dependencies(tune_mlflow_test dtrain_cli)
dtrain_test_once(tune_mlflow_test torch1)  # the MLflow server's side does not depend on libtorch
