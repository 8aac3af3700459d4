# dtrain::hvd (Horovod's API): real workers through `dtrain run`, `dtrain horovodrun` and
# HorovodRunner (the worker binary is its own HorovodRunner driver).
add_executable(hvd_worker horovod/hvd_worker.cpp)
target_link_libraries(hvd_worker PRIVATE dtrain CLI11::CLI11)
dtrain_test(hvd_test LABELS horovod SOURCES horovod/hvd_test.cpp launcher/subprocess.cpp TORCH)
target_compile_definitions(hvd_test PRIVATE HVD_WORKER_BIN="$<TARGET_FILE:hvd_worker>")
add_dependencies(hvd_test hvd_worker dtrain_cli)
