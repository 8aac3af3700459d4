# dtrain::data (issue #32): Parquet directories and Delta tables written by real writers
# (tests/data/make_tables.py: pyarrow, and delta-rs's deltalake for Delta), read per rank, and
# the Fashion-MNIST example trained from such tables. The tables are written once per build
# tree by the first test that needs them. FAILS when the venv lacks pyarrow or deltalake
# (scripts/requirements.txt).
if(DTRAIN_HAVE_DATA)
  dtrain_test(data_test LABELS data SOURCES data/data_test.cpp launcher/subprocess.cpp
              LIBS dtrain_data TORCH)
  # A rank that leaves its shared cache entries behind (no destructors), for dtrain run to sweep.
  add_executable(abandoning_worker data/abandoning_worker.cpp)
  target_link_libraries(abandoning_worker PRIVATE dtrain_data dtrain)
  target_include_directories(abandoning_worker PRIVATE ${PROJECT_SOURCE_DIR}/src)
  dtrain_use_torch_pch(abandoning_worker)
  target_compile_options(abandoning_worker PRIVATE ${DTRAIN_WARNINGS})
  dtrain_test_programs(data_test ABANDONING_WORKER_BIN abandoning_worker)
  add_dependencies(data_test dtrain_cli)
  dtrain_test(fashion_mnist_tables_test LABELS data
              SOURCES data/fashion_mnist_tables_test.cpp launcher/subprocess.cpp)
  dtrain_test_programs(fashion_mnist_tables_test FASHION_MNIST_BIN fashion_mnist)
  add_dependencies(fashion_mnist_tables_test dtrain_cli)
endif()
# make_converter on a real Spark standalone cluster (tests/spark/lib.sh), a Distributor run of
# the example from its files. RUN_SERIAL: JVMs on 2 cores. Once, on 2.x (torch2_only, as the
# Spark engine's own test): what it checks does not depend on the libtorch version.
if(DTRAIN_HAVE_DATA)
  add_test(NAME data.spark_converter
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/data/converter_test.sh $<TARGET_FILE:dtrain_cli>
            $<TARGET_FILE:fashion_mnist> ${PROJECT_SOURCE_DIR}/python)
  set_tests_properties(data.spark_converter PROPERTIES LABELS "data;torch2_only" TIMEOUT 600 RUN_SERIAL TRUE
    ENVIRONMENT "DTRAIN_VENV_PYTHON=${DTRAIN_VENV_PYTHON}")
endif()
