# The fuzz targets in the normal suite: each replays its seed corpus and regression inputs
# (tests/fuzz/replay_main.cpp); scripts/fuzz.sh runs them under libFuzzer.
function(dtrain_fuzz name)
  cmake_parse_arguments(F "TORCH;DATA" "" "LIBS;SOURCES" ${ARGN})
  set(torch)
  if(F_TORCH)
    set(torch TORCH)
  endif()
  if(F_DATA)
    if(NOT DTRAIN_HAVE_DATA)
      return()
    endif()
    list(APPEND F_LIBS dtrain_data)
    set(torch TORCH)  # dtrain_data links the runtime
  endif()
  dtrain_test(fuzz_${name}_replay LABELS unit SOURCES fuzz/${name}_fuzz.cpp fuzz/replay_main.cpp
              LIBS ${F_LIBS} ${torch})
  target_compile_definitions(fuzz_${name}_replay PRIVATE DTRAIN_FUZZ_TARGET="${name}"
                             DTRAIN_FUZZ_TEST=${name})
endfunction()
include(fuzz/targets.cmake)
