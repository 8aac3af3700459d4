# Elastic membership (src/launch/elastic_rendezvous.cpp): several real agents on loopback.
# libtorch-free (test_worker), so it runs in one build only (see scripts/run_tests.sh).
dtrain_test(elastic_test LABELS elastic SOURCES elastic/elastic_test.cpp launcher/subprocess.cpp)
target_compile_definitions(elastic_test PRIVATE TEST_WORKER_BIN="$<TARGET_FILE:test_worker>")
add_dependencies(elastic_test test_worker dtrain_cli)
