# The examples end to end (real data from dataset-fashion-mnist, real processes).
dtrain_test(fashion_mnist_test LABELS example SOURCES examples/fashion_mnist_test.cpp launcher/subprocess.cpp)
dtrain_test_programs(fashion_mnist_test FASHION_MNIST_BIN fashion_mnist)
add_dependencies(fashion_mnist_test fashion_mnist dtrain_cli)
# The CNN's 3-epoch accuracy run (~85 s), once, on 1.13; SyncBatchNorm's
# numerics are tested on both builds (sync_batch_norm_test).
dtrain_test_once(fashion_mnist_test torch1 MATCHING "[.]CnnWithSyncBatchNorm")
dtrain_test(distributor_example_test LABELS example SOURCES examples/distributor_example_test.cpp launcher/subprocess.cpp)
dtrain_test_programs(distributor_example_test DISTRIBUTOR_EXAMPLE_BIN distributor_example)
add_dependencies(distributor_example_test distributor_example dtrain_cli)
