# Apache Arrow's C++ libraries (libarrow, libparquet) for dtrain::data, the Parquet / Delta
# reader (src/data/). Debian 12 packages no Arrow; PyPI's pyarrow wheel ships the C++ shared
# libraries and their headers, so they come from the project's venv (scripts/requirements.txt
# pins pyarrow), found through DTRAIN_VENV_PYTHON:
#   pyarrow.get_include()          -> headers (arrow/, parquet/)
#   pyarrow.get_library_dirs()[0]  -> libarrow.so.<ABI>, libparquet.so.<ABI> (no unversioned
#                                     .so links in the wheel: we link the versioned files)
# ABI (checked for pyarrow 25.0.1): built by GCC 14 with the C++11 ABI (std::__cxx11 strings in
# its exports), needing GLIBCXX_3.4.22 at most; Debian's libtorch 1.13, PyPI's torch 2.11 and
# g++ 12 (GLIBCXX_3.4.30) all use the same ABI, so one set of libraries serves both builds.
#
# DTRAIN_DATA: ON (default) builds dtrain::data and FAILS configuration when Arrow is missing;
# OFF leaves it out; AUTO builds it when Arrow is found. DTRAIN_ARROW_DIR: the pyarrow package
# directory to use instead of the venv's.
# Sets DTRAIN_HAVE_DATA and, when found, the target dtrain_arrow (headers + libraries).
# A project that pulls dtrain in (FetchContent, add_subdirectory) gets it where Arrow is found.
if(PROJECT_IS_TOP_LEVEL)
  set(_dtrain_data_default ON)
else()
  set(_dtrain_data_default AUTO)
endif()
set(DTRAIN_DATA ${_dtrain_data_default} CACHE STRING "Build dtrain::data (Parquet/Delta reader on Arrow C++ from pyarrow): ON, OFF or AUTO")
set_property(CACHE DTRAIN_DATA PROPERTY STRINGS ON OFF AUTO)
set(DTRAIN_ARROW_DIR "" CACHE PATH "pyarrow package directory with include/ and libarrow.so.* (default: the venv's pyarrow)")

set(DTRAIN_HAVE_DATA OFF)
if(NOT DTRAIN_DATA STREQUAL "OFF")
  set(_arrow_why "")
  set(_arrow_dir "${DTRAIN_ARROW_DIR}")
  if(NOT _arrow_dir)
    if(EXISTS "${DTRAIN_VENV_PYTHON}")
      execute_process(COMMAND "${DTRAIN_VENV_PYTHON}" -c
        "import os, pyarrow; print(os.path.dirname(pyarrow.__file__), end='')"
        OUTPUT_VARIABLE _arrow_dir ERROR_VARIABLE _arrow_err RESULT_VARIABLE _arrow_rc)
      if(NOT _arrow_rc EQUAL 0)
        set(_arrow_why "the venv's python ${DTRAIN_VENV_PYTHON} has no pyarrow")
        set(_arrow_dir "")
      endif()
    else()
      set(_arrow_why "no venv python at DTRAIN_VENV_PYTHON=${DTRAIN_VENV_PYTHON}")
    endif()
  endif()
  if(_arrow_dir)
    file(GLOB _arrow_lib "${_arrow_dir}/libarrow.so.[0-9]*")
    file(GLOB _parquet_lib "${_arrow_dir}/libparquet.so.[0-9]*")
    # The SONAME files only (libarrow.so.2500), not a longer libarrow.so.2500.1.0 beside them.
    list(FILTER _arrow_lib INCLUDE REGEX "libarrow\\.so\\.[0-9]+$")
    list(FILTER _parquet_lib INCLUDE REGEX "libparquet\\.so\\.[0-9]+$")
    if(NOT EXISTS "${_arrow_dir}/include/parquet/arrow/reader.h")
      set(_arrow_why "${_arrow_dir}/include/parquet/arrow/reader.h is missing")
    elseif(NOT _arrow_lib OR NOT _parquet_lib)
      set(_arrow_why "no libarrow.so.N / libparquet.so.N in ${_arrow_dir}")
    else()
      list(GET _arrow_lib 0 _arrow_lib)
      list(GET _parquet_lib 0 _parquet_lib)
      file(STRINGS "${_arrow_dir}/include/arrow/util/config.h" _arrow_version
           REGEX "define ARROW_VERSION_STRING")
      string(REGEX REPLACE ".*\"(.*)\".*" "\\1" _arrow_version "${_arrow_version}")
      add_library(dtrain_arrow INTERFACE)
      # SYSTEM: Arrow's headers are not ours to warn about.
      target_include_directories(dtrain_arrow SYSTEM INTERFACE
        $<BUILD_INTERFACE:${_arrow_dir}/include>)
      # Absolute paths (an installed dtrain's package links the same files), and an rpath to
      # them so that programs run without LD_LIBRARY_PATH.
      get_filename_component(_arrow_libdir "${_arrow_lib}" DIRECTORY)
      target_link_libraries(dtrain_arrow INTERFACE "${_parquet_lib}" "${_arrow_lib}")
      target_link_options(dtrain_arrow INTERFACE "LINKER:-rpath,${_arrow_libdir}")
      set(DTRAIN_HAVE_DATA ON)
      set(DTRAIN_ARROW_VERSION "${_arrow_version}")
      set(DTRAIN_ARROW_LIBDIR "${_arrow_libdir}")
    endif()
  endif()
  # Delta deletion vectors (src/data/deletion_vector.cpp) are roaring bitmaps, read by CRoaring
  # (Debian's libroaring-dev, its CMake package), with zlib's CRC-32 checksums (zlib1g-dev).
  set(_roaring_why "")
  if(DTRAIN_HAVE_DATA)
    find_package(roaring CONFIG QUIET)
    find_package(ZLIB QUIET)
    if(NOT roaring_FOUND OR NOT ZLIB_FOUND)
      set(DTRAIN_HAVE_DATA OFF)
      set(_roaring_why "CRoaring (libroaring-dev) or zlib (zlib1g-dev) is missing: the Delta reader needs them for deletion vectors (apt-get install libroaring-dev zlib1g-dev; scripts/setup.sh does)")
      set(_arrow_why "${_roaring_why}")
    endif()
  endif()
  if(DTRAIN_HAVE_DATA)
    message(STATUS "dtrain::data (Parquet / Delta reader): building it, Arrow C++ ${DTRAIN_ARROW_VERSION} from ${_arrow_dir}")
  elseif(DTRAIN_DATA STREQUAL "AUTO")
    message(STATUS "dtrain::data (Parquet / Delta reader): NOT built: ${_arrow_why}")
  elseif(_roaring_why)
    message(FATAL_ERROR "dtrain::data: ${_roaring_why}; or build without the data module: "
      "-DDTRAIN_DATA=OFF (or AUTO).")
  else()
    message(FATAL_ERROR "dtrain::data needs Apache Arrow's C++ libraries from PyPI's pyarrow, and "
      "${_arrow_why}. Run scripts/setup.sh (it installs scripts/requirements.txt, pyarrow "
      "included, into the venv), or give -DDTRAIN_ARROW_DIR=<site-packages/pyarrow>, or build "
      "without the data module: -DDTRAIN_DATA=OFF (or AUTO).")
  endif()
else()
  message(STATUS "dtrain::data (Parquet / Delta reader): NOT built (DTRAIN_DATA=OFF)")
endif()
