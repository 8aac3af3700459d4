# The Distributor: codec units, end-to-end runs (the test binary is its own worker), and
# compile-time rejection of what cannot cross a process boundary.
dtrain_test(codec_test LABELS unit SOURCES distributor/codec_test.cpp TORCH)

dtrain_test(distributor_test LABELS distributor SOURCES distributor/distributor_test.cpp TORCH)
dtrain_test_programs(distributor_test TEST_WORKER_BIN test_worker)
add_dependencies(distributor_test dtrain_cli test_worker)
# Its constructor's pid tells a worker forked from the fork server (the server's) from a spawned one.
target_link_libraries(distributor_test PRIVATE preload_probe)

# Unsupported types and capturing lambdas fail to compile, with dtrain's message.
foreach(case 1 2)
  add_executable(distributor_reject_${case} EXCLUDE_FROM_ALL distributor/reject_types.cpp)
  target_link_libraries(distributor_reject_${case} PRIVATE dtrain)
  target_compile_definitions(distributor_reject_${case} PRIVATE REJECT_CASE=${case})
endforeach()
# Only the one object is built (with Ninja, an object file is a target of its own): building the
# executable would first rebuild the library wherever it is out of date, and a CI run once spent
# its 300 s there (59 library objects) before reaching the compile that fails.
set(reject_target_1 distributor_reject_1)
set(reject_target_2 distributor_reject_2)
if(CMAKE_GENERATOR MATCHES "Ninja")
  file(RELATIVE_PATH _reject_dir ${PROJECT_BINARY_DIR} ${CMAKE_CURRENT_BINARY_DIR})
  foreach(case 1 2)
    set(reject_target_${case}
        "${_reject_dir}/CMakeFiles/distributor_reject_${case}.dir/distributor/reject_types.cpp.o")
  endforeach()
endif()
add_test(NAME distributor.rejects_unencodable_argument_at_compile_time
  COMMAND ${CMAKE_COMMAND} --build ${PROJECT_BINARY_DIR} --target ${reject_target_1})
set_tests_properties(distributor.rejects_unencodable_argument_at_compile_time PROPERTIES
  LABELS unit TIMEOUT 300 PASS_REGULAR_EXPRESSION "a parameter type of the function is not encodable")
add_test(NAME distributor.rejects_capturing_lambda_at_compile_time
  COMMAND ${CMAKE_COMMAND} --build ${PROJECT_BINARY_DIR} --target ${reject_target_2})
set_tests_properties(distributor.rejects_capturing_lambda_at_compile_time PROPERTIES
  LABELS unit TIMEOUT 300 PASS_REGULAR_EXPRESSION "must be a plain function or a lambda without captures")

# Whole driver processes: a missing dtrain::init, a driver killed mid-run.
add_executable(distributor_driver_program distributor/driver_program.cpp)
target_link_libraries(distributor_driver_program PRIVATE dtrain)
dtrain_use_torch_pch(distributor_driver_program)
dtrain_test(distributor_driver_test LABELS distributor SOURCES distributor/driver_test.cpp launcher/subprocess.cpp)
dtrain_test_programs(distributor_driver_test DRIVER_PROGRAM distributor_driver_program)
add_dependencies(distributor_driver_test distributor_driver_program dtrain_cli)
