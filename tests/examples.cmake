# The examples end to end (real data from dataset-fashion-mnist, real processes).
dtrain_test(fashion_mnist_test LABELS example SOURCES examples/fashion_mnist_test.cpp launcher/subprocess.cpp)
target_compile_definitions(fashion_mnist_test PRIVATE FASHION_MNIST_BIN="$<TARGET_FILE:fashion_mnist>")
add_dependencies(fashion_mnist_test fashion_mnist dtrain_cli)
