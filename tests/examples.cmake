# The examples end to end (real data from dataset-fashion-mnist, real processes).
dtrain_test(fashion_mnist_test LABELS example SOURCES examples/fashion_mnist_test.cpp launcher/subprocess.cpp)
target_compile_definitions(fashion_mnist_test PRIVATE FASHION_MNIST_BIN="$<TARGET_FILE:fashion_mnist>")
add_dependencies(fashion_mnist_test fashion_mnist dtrain_cli)
dtrain_test(distributor_example_test LABELS example SOURCES examples/distributor_example_test.cpp launcher/subprocess.cpp)
target_compile_definitions(distributor_example_test PRIVATE DISTRIBUTOR_EXAMPLE_BIN="$<TARGET_FILE:distributor_example>")
add_dependencies(distributor_example_test distributor_example dtrain_cli)
