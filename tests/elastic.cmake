# Elastic membership (src/launch/elastic_rendezvous.cpp): several real agents on loopback.
# libtorch-free (test_worker), so it runs in one build only.
dtrain_test(elastic_test LABELS elastic SOURCES elastic/elastic_test.cpp launcher/subprocess.cpp)
dtrain_test_programs(elastic_test TEST_WORKER_BIN test_worker)
add_dependencies(elastic_test test_worker dtrain_cli)
dtrain_test_once(elastic_test torch2)

# Resume without user code (src/elastic): a DDP worker on ElasticState, SIGKILLed under
# `dtrain run --max-restarts` and in shrinking --nnodes jobs. Runs in both builds (~25 s).
add_executable(elastic_train_worker elastic/elastic_train_worker.cpp)
target_link_libraries(elastic_train_worker PRIVATE dtrain CLI11::CLI11)
dtrain_use_torch_pch(elastic_train_worker)
target_compile_options(elastic_train_worker PRIVATE ${DTRAIN_WARNINGS})
dtrain_test(elastic_resume_test LABELS elastic SOURCES elastic/resume_test.cpp launcher/subprocess.cpp)
dtrain_test_programs(elastic_resume_test ELASTIC_TRAIN_WORKER_BIN elastic_train_worker FASHION_MNIST_BIN fashion_mnist)
add_dependencies(elastic_resume_test elastic_train_worker dtrain_cli fashion_mnist)

# The node-level scenarios on network-namespace hosts (root; label cluster, so it runs with
# the other cluster tests in the 1.13 build, see scripts/run_tests.sh): an agent SIGKILLed,
# an interface cut.
add_test(NAME cluster.elastic
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cluster/elastic_test.sh ${PROJECT_BINARY_DIR}
          $<TARGET_FILE:dtrain_cli> $<TARGET_FILE:elastic_train_worker>)
set_tests_properties(cluster.elastic PROPERTIES LABELS cluster TIMEOUT 300 RUN_SERIAL TRUE)

# ElasticSampler on its own (no processes): DistributedSampler parity, exactly-once re-split.
dtrain_test(elastic_sampler_test LABELS elastic SOURCES elastic/elastic_sampler_test.cpp TORCH)
