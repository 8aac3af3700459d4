# Spark engine (issue #12): sizing and the spark-submit command as unit tests (no cluster, no
# GPU), and the real thing: a Spark standalone master + 2 workers (pip's pyspark, Debian's
# Java) as separate hosts (network namespaces n0, n1, n2; root), started once by
# tests/spark/spark_test.sh for every case, the Fashion-MNIST example among them (5 of the
# cases are run() calls of one program in one kept Spark application). It FAILS
# when root, Java, pyspark or the data is missing. RUN_SERIAL: JVMs on 2 cores.
dtrain_test(spark_plan_test LABELS spark SOURCES spark/spark_plan_test.cpp)

add_test(NAME spark.cluster
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/spark/spark_test.sh ${PROJECT_BINARY_DIR}
          $<TARGET_FILE:dtrain_cli> $<TARGET_FILE:engine_driver> ${PROJECT_SOURCE_DIR}/python)
# Once, against 2.x: the PyTorch of TorchDistributor, its peer.
set_tests_properties(spark.cluster PROPERTIES LABELS "spark;torch2_only" TIMEOUT 900 RUN_SERIAL TRUE
  ENVIRONMENT "DTRAIN_VENV_PYTHON=${DTRAIN_VENV_PYTHON}")

# dtrain.spark.Distributor beside PySpark's TorchDistributor, both run in one process on a
# loopback Spark standalone cluster (no root): TorchDistributor's validation errors, function
# mode (rank 0's value), a failing script's RuntimeError, every last line on the driver.
add_test(NAME spark.distributor
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/spark/distributor_test.sh $<TARGET_FILE:dtrain_cli>
          ${PROJECT_SOURCE_DIR}/python)
set_tests_properties(spark.distributor PROPERTIES LABELS "spark;torch2_only" TIMEOUT 900 RUN_SERIAL TRUE
  ENVIRONMENT "DTRAIN_VENV_PYTHON=${DTRAIN_VENV_PYTHON}")
