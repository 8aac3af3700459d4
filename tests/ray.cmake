# Ray engine (issue #30). Without a cluster: the placement check and slot count of
# python/dtrain/ray.py, and the C++ side's plan, commands and `dtrain run --ray-address`
# errors. The real thing: a Ray cluster (pip's ray, pinned) as separate hosts - the head on n0,
# a worker node of 2 CPUs on n1 and on n2 (network namespaces; root) - started once by
# tests/ray/ray_test.sh for every case: function and program mode with placement checked, a
# SIGSEGV on n2, too few CPUs, Ray Client, the Python module (programs; functions: rank 0's
# value, WorkerError: ray/function_test.py), a Tune search two trials at a
# time, the driver SIGKILLed. It FAILS when root, ray or the data is missing. Once, on the 2.x
# build (the engine does not depend on libtorch). RUN_SERIAL: a Ray cluster on 2 cores.
add_test(NAME ray.placement
  COMMAND ${DTRAIN_VENV_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/ray/placement_test.py ${PROJECT_SOURCE_DIR}/python)
set_tests_properties(ray.placement PROPERTIES LABELS unit TIMEOUT 60)
dtrain_test(ray_plan_test LABELS unit SOURCES ray/ray_plan_test.cpp)

add_test(NAME ray.cluster
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/ray/ray_test.sh ${PROJECT_BINARY_DIR}
          $<TARGET_FILE:dtrain_cli> $<TARGET_FILE:engine_driver> $<TARGET_FILE:tune_cluster_driver>
          ${PROJECT_SOURCE_DIR}/python)
set_tests_properties(ray.cluster PROPERTIES LABELS "ray;torch2_only" TIMEOUT 600 RUN_SERIAL TRUE
  ENVIRONMENT "DTRAIN_VENV_PYTHON=${DTRAIN_VENV_PYTHON}")
