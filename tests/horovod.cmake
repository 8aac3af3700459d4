# dtrain::hvd (Horovod's API): real workers through `dtrain run`, `dtrain horovodrun` and
# HorovodRunner (the worker binary is its own HorovodRunner driver).
add_executable(hvd_worker horovod/hvd_worker.cpp)
target_link_libraries(hvd_worker PRIVATE dtrain CLI11::CLI11)
dtrain_use_torch_pch(hvd_worker)
dtrain_test(hvd_test LABELS horovod SOURCES horovod/hvd_test.cpp launcher/subprocess.cpp TORCH)
dtrain_test_programs(hvd_test HVD_WORKER_BIN hvd_worker)
add_dependencies(hvd_test hvd_worker dtrain_cli)
# hvd::elastic: `dtrain horovodrun --min-np/--max-np/--host-discovery-script` with a killed worker.
add_executable(hvd_elastic_worker horovod/hvd_elastic_worker.cpp)
target_include_directories(hvd_elastic_worker PRIVATE ${PROJECT_SOURCE_DIR}/tests)
target_link_libraries(hvd_elastic_worker PRIVATE dtrain)
dtrain_use_torch_pch(hvd_elastic_worker)
dtrain_test(hvd_elastic_test LABELS horovod SOURCES horovod/hvd_elastic_test.cpp launcher/subprocess.cpp TORCH)
dtrain_test_programs(hvd_elastic_test HVD_ELASTIC_WORKER_BIN hvd_elastic_worker)
add_dependencies(hvd_elastic_test hvd_elastic_worker dtrain_cli)
# Elastic horovodrun across hosts: namespaces n1 (the driver, a local agent) and n2 (its agent
# over ssh), a worker killed, the job finishing at the smaller size (tests/cluster/lib.sh; root).
add_test(NAME cluster.horovod_elastic
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cluster/hvd_elastic_test.sh ${PROJECT_BINARY_DIR}
          $<TARGET_FILE:dtrain_cli> $<TARGET_FILE:hvd_elastic_worker>)
set_tests_properties(cluster.horovod_elastic PROPERTIES LABELS cluster TIMEOUT 200 RUN_SERIAL TRUE)
