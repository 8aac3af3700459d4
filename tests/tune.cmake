# dtrain::tune: schedulers and search spaces against Ray Tune itself (the venv's ray[tune],
# scripts/requirements.txt), the Tuner end to end with real trials, and a driver killed
# mid-search that resumes.
dtrain_test(tune_parity_test LABELS tune SOURCES tune/scheduler_parity_test.cpp TORCH)
# Stoppers against Ray's own ray.tune.stopper classes (tests/tune/ray_stopper_peer.py): ~3 s, and
# nothing in them depends on libtorch, so once.
dtrain_test(tune_stopper_parity_test LABELS tune SOURCES tune/stopper_parity_test.cpp TORCH)
dtrain_test_once(tune_stopper_parity_test torch2)
# ResultGrid::best_result's scopes against Ray's own get_best_result and Trial.metric_analysis
# (tests/tune/ray_best_result_peer.py, no Ray cluster): pure driver logic, so once.
dtrain_test(tune_best_result_test LABELS tune SOURCES tune/best_result_parity_test.cpp TORCH)
dtrain_test_once(tune_best_result_test torch2)

dtrain_test(tune_tuner_test LABELS tune SOURCES tune/tuner_test.cpp TORCH)
add_dependencies(tune_tuner_test dtrain_cli)
# The comparisons with searches run by real Ray (~70 s, most of it Ray's side: names, tags, the
# refused CheckpointConfig fields, stoppers, checkpoints kept) check the driver's logic, the same
# on both builds: once. The rest run on both.
dtrain_test_once(tune_tuner_test torch2 MATCHING "Ray")
# GPUs per trial against Ray 2.60 with GPUs declared (tests/tune/ray_gpus_peer.py, run beside
# dtrain's searches; ~75 s on the 2-core development VM, 2026-11-30, Ray's side the longer): the
# assignment is driver logic, the same on both builds, so once.
dtrain_test(tune_gpus_test LABELS tune SOURCES tune/gpus_test.cpp TORCH)
add_dependencies(tune_gpus_test dtrain_cli)
dtrain_test_once(tune_gpus_test torch2)

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

# Trials on cluster engines (issue #30 item 2): a search's trials side by side as the engine's
# free slots allow, and the warm fork server on every host of an ssh search.
add_executable(tune_cluster_search tune/cluster_search.cpp)
target_link_libraries(tune_cluster_search PRIVATE dtrain)
dtrain_use_torch_pch(tune_cluster_search)
# A real Spark standalone cluster (tests/spark/lib.sh: master on n0, 2 workers x 2 cores on n1,
# n2; root): the kept application reports 4 free task slots, 4 trials of 2 run two at a time.
# Once, on the 2.x build with the other Spark tests. RUN_SERIAL: JVMs on 2 cores.
add_test(NAME tune.spark_trials
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/tune/spark_trials_test.sh
          $<TARGET_FILE:dtrain_cli> $<TARGET_FILE:tune_cluster_search>)
set_tests_properties(tune.spark_trials PROPERTIES LABELS "spark;torch2_only" TIMEOUT 400
  RUN_SERIAL TRUE ENVIRONMENT "DTRAIN_VENV_PYTHON=${DTRAIN_VENV_PYTHON}")
# Room that appears during a search (the same cluster, starting with 1 worker of 1 core on n1; a
# worker of 4 cores registers on n2 while the first trial runs, held): the Tuner, asking the
# application again every 10 s while trials wait, runs 3 trials at a time (max_concurrent_trials;
# 4 would fit) before the first trial ends.
add_test(NAME tune.spark_room
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/tune/spark_room_test.sh
          $<TARGET_FILE:dtrain_cli> $<TARGET_FILE:tune_cluster_search>)
set_tests_properties(tune.spark_room PROPERTIES LABELS "spark;torch2_only" TIMEOUT 400
  RUN_SERIAL TRUE ENVIRONMENT "DTRAIN_VENV_PYTHON=${DTRAIN_VENV_PYTHON}")
# The same on Ray (tests/ray/lib.sh: the head on n0, a worker node of 1 CPU on n1; a node of 4
# CPUs joins on n2 while the first trial runs, held): 3 trials at a time before it ends.
add_test(NAME tune.ray_room
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/tune/ray_room_test.sh
          $<TARGET_FILE:dtrain_cli> $<TARGET_FILE:tune_cluster_search>)
set_tests_properties(tune.ray_room PROPERTIES LABELS "ray;torch2_only" TIMEOUT 400
  RUN_SERIAL TRUE ENVIRONMENT "DTRAIN_VENV_PYTHON=${DTRAIN_VENV_PYTHON}")
# GPUs per trial on Ray (tests/ray/lib.sh: the head on n0, a worker node of 4 CPUs declaring 2 GPUs
# on n1): 1 GPU per trial runs 2 at a time, 0.5 runs 4, each trial's workers see Ray's id.
add_test(NAME tune.ray_gpus
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/tune/ray_gpus_test.sh
          $<TARGET_FILE:dtrain_cli> $<TARGET_FILE:tune_cluster_search>)
set_tests_properties(tune.ray_gpus PROPERTIES LABELS "ray;torch2_only" TIMEOUT 400
  RUN_SERIAL TRUE ENVIRONMENT "DTRAIN_VENV_PYTHON=${DTRAIN_VENV_PYTHON}")
# Two ssh hosts (tests/cluster/lib.sh: namespaces n1, n2 with sshd; root): a warm fork server
# on each forks every trial's workers, a SIGKILLed worker fails only its trial, 2 trials at a
# time, nothing left on either host; then the per-trial start cold and warm (printed).
add_test(NAME tune.ssh_warm
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/tune/ssh_warm_test.sh
          $<TARGET_FILE:dtrain_cli> $<TARGET_FILE:tune_cluster_search>)
set_tests_properties(tune.ssh_warm PROPERTIES LABELS cluster TIMEOUT 300 RUN_SERIAL TRUE
  ENVIRONMENT "DTRAIN_VENV_PYTHON=${DTRAIN_VENV_PYTHON}")

# NaN and infinite metrics across a killed and resumed search, against the same search
# uninterrupted and against Ray's Tuner on the same trainable (tests/tune/ray_nan_resume_peer.py).
add_executable(tune_nan_resume_program tune/nan_resume_program.cpp)
target_link_libraries(tune_nan_resume_program PRIVATE dtrain)
dtrain_use_torch_pch(tune_nan_resume_program)
dtrain_test(tune_nan_resume_test LABELS tune SOURCES tune/nan_resume_test.cpp
            launcher/subprocess.cpp TORCH)
dtrain_test_programs(tune_nan_resume_test TUNE_NAN_RESUME_PROGRAM tune_nan_resume_program)
add_dependencies(tune_nan_resume_test tune_nan_resume_program dtrain_cli)
dtrain_test_once(tune_nan_resume_test torch2)  # driver logic and a Ray peer; ~40 s

# A driver SIGKILLed mid-search and resumed, against Ray's Tuner.restore after the same
# (tests/tune/ray_restore_peer.py): the order the trials come back in, the stopper going on where
# it was, and the creators called before the scheduler's on_trial_add. Driver logic and a Ray
# peer (~40 s, most of it Ray's), so once.
add_executable(tune_restore_program tune/restore_program.cpp)
target_link_libraries(tune_restore_program PRIVATE dtrain)
dtrain_use_torch_pch(tune_restore_program)
dtrain_test(tune_restore_test LABELS tune SOURCES tune/restore_test.cpp launcher/subprocess.cpp
            TORCH)
dtrain_test_programs(tune_restore_test TUNE_RESTORE_PROGRAM tune_restore_program)
add_dependencies(tune_restore_test tune_restore_program dtrain_cli)
dtrain_test_once(tune_restore_test torch2)
