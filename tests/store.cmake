# The TCPStore-compatible key-value store (src/store).
dtrain_test(store_test LABELS unit SOURCES unit/store_test.cpp)
# Against PyTorch's own clients: c10d::TCPStore (C++), ProcessGroupGloo, and Python's TCPStore.
dtrain_test(store_interop_test LABELS interop SOURCES interop/store_interop_test.cpp TORCH)
