# Collectives (src/comm/collectives.cpp).

# In-process: ranks as threads, each with its own Gloo group over one HashStore.
dtrain_test(collectives_test LABELS unit SOURCES unit/collectives_test.cpp TORCH)
# The same tests on the shared-memory backend (src/comm/shm), and its own unit tests.
dtrain_test(shm_collectives_test LABELS unit SOURCES unit/collectives_test.cpp TORCH)
target_compile_definitions(shm_collectives_test PRIVATE DTRAIN_TEST_SHM)
dtrain_test(shm_group_test LABELS unit SOURCES unit/shm_group_test.cpp TORCH)
# Again behind the host-staging backend that carries CUDA tensors (comm/staged), staging CPU
# tensors too: its copies in and out, checked without a GPU.
dtrain_test(staged_collectives_test LABELS unit SOURCES unit/collectives_test.cpp TORCH)
target_compile_definitions(staged_collectives_test PRIVATE DTRAIN_TEST_STAGED)
# The backend factory (comm/backend.h): specs, choices, traits and their errors.
dtrain_test(backend_factory_test LABELS unit SOURCES unit/backend_factory_test.cpp TORCH)

# A worker whose --mode picks what it does (see its header comment); the multi-process test
# runs it under `dtrain run` and as separately started processes.
add_executable(collective_worker comm/collective_worker.cpp)
target_link_libraries(collective_worker PRIVATE dtrain)
dtrain_use_torch_pch(collective_worker)
target_include_directories(collective_worker PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_compile_options(collective_worker PRIVATE ${DTRAIN_WARNINGS})

# Real processes; the test itself does not load libtorch.
dtrain_test(collectives_mp_test LABELS launcher
  SOURCES comm/collectives_mp_test.cpp launcher/subprocess.cpp)
dtrain_test_programs(collectives_mp_test COLLECTIVE_WORKER_BIN collective_worker)
# The tests execute these; building collectives_mp_test must build them too.
add_dependencies(collectives_mp_test collective_worker dtrain_cli)
