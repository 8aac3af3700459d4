# Cluster mode (issue #5): the engines' variables and host files as unit tests, and the real
# engines - Slurm (slurmctld + 2 slurmd), Open MPI, MPICH, sshd - on network namespaces as
# hosts (tests/cluster/lib.sh). The scripts need root; they fail (never skip) when a component
# is missing. RUN_SERIAL: each brings up daemons and namespaces of its own, and they share
# the machine's 2 cores.

dtrain_test(engine_env_test LABELS unit SOURCES cluster/engine_env_test.cpp)
# The engines behind their interface (src/engines/): registry, options, commands.
dtrain_test(engines_test LABELS unit SOURCES cluster/engines_test.cpp)

# A libtorch worker: init_process_group() from whatever started it, all-reduce, one line.
add_executable(cluster_worker cluster/cluster_worker.cpp)
target_link_libraries(cluster_worker PRIVATE dtrain)
dtrain_use_torch_pch(cluster_worker)

foreach(t slurm mpi ssh)
  add_test(NAME cluster.${t}
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cluster/${t}_test.sh ${PROJECT_BINARY_DIR}
            $<TARGET_FILE:dtrain_cli> $<TARGET_FILE:cluster_worker> $<TARGET_FILE:test_worker>)
  set_tests_properties(cluster.${t} PROPERTIES LABELS cluster TIMEOUT 400 RUN_SERIAL TRUE)
endforeach()

# The cluster flags through the real binary, without engines or root (label launcher).
dtrain_test(cluster_cli_test LABELS launcher SOURCES cluster/cluster_cli_test.cpp launcher/subprocess.cpp)
dtrain_test_programs(cluster_cli_test TEST_WORKER_BIN test_worker)
add_dependencies(cluster_cli_test test_worker dtrain_cli)

# The Distributor with local_mode = false: a driver on n1 running a function over ssh, Slurm
# and MPI, results and exceptions coming back to it.
add_executable(distributor_cluster_driver cluster/distributor_driver.cpp)
target_link_libraries(distributor_cluster_driver PRIVATE dtrain)
dtrain_use_torch_pch(distributor_cluster_driver)
add_test(NAME cluster.distributor
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cluster/distributor_test.sh ${PROJECT_BINARY_DIR}
          $<TARGET_FILE:dtrain_cli> $<TARGET_FILE:distributor_cluster_driver>)
set_tests_properties(cluster.distributor PROPERTIES LABELS cluster TIMEOUT 400 RUN_SERIAL TRUE)

# tune::Tuner with local_mode = false: trials as Distributor jobs over ssh on n1 and n2.
add_executable(tune_cluster_driver cluster/tune_driver.cpp)
target_link_libraries(tune_cluster_driver PRIVATE dtrain)
dtrain_use_torch_pch(tune_cluster_driver)
add_test(NAME cluster.tune
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cluster/tune_test.sh ${PROJECT_BINARY_DIR}
          $<TARGET_FILE:dtrain_cli> $<TARGET_FILE:tune_cluster_driver>)
set_tests_properties(cluster.tune PROPERTIES LABELS cluster TIMEOUT 300 RUN_SERIAL TRUE)
