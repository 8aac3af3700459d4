# Which libtorch dtrain builds against, as TORCH_LIBRARIES (what every target links).
#
# Default: Debian's libtorch 1.13 (CPU) through its CMake config, find_package(Torch).
# -DDTRAIN_LIBTORCH=DIR: another libtorch - a libtorch tree or the package directory of
# PyPI's torch wheel (.../site-packages/torch), e.g. 2.x. If DIR's CMake config can be used
# (with a CUDA build, only where the CUDA toolkit is found), it is; otherwise dtrain takes
# the CPU part of DIR directly (libtorch_cpu + libc10 and the headers): PyPI's wheels are
# CUDA builds whose config demands a CUDA toolkit even for CPU-only use.
#
# c10d's ProcessGroupGloo.hpp includes Gloo's headers, which the wheel does not ship; the
# system's (Debian's libgloo-dev, or DTRAIN_GLOO_INCLUDE_DIR) are used for its declarations.
set(DTRAIN_LIBTORCH "" CACHE PATH "libtorch to build against instead of Debian's (a libtorch dir or site-packages/torch)")
set(DTRAIN_GLOO_INCLUDE_DIR "" CACHE PATH "directory holding gloo/*.h when libtorch ships none")

set(DTRAIN_CUDA "AUTO" CACHE STRING "CUDA support: AUTO (when libtorch has CUDA and its headers are found), ON (required), OFF")
set_property(CACHE DTRAIN_CUDA PROPERTY STRINGS AUTO ON OFF)
set(DTRAIN_CUDA_INCLUDE_DIR "" CACHE PATH "extra directory with CUDA's headers (cuda_runtime_api.h, crt/, nv/target)")
if(NOT DTRAIN_CUDA MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "DTRAIN_CUDA=${DTRAIN_CUDA}: use AUTO, ON or OFF")
endif()
set(DTRAIN_WITH_CUDA OFF)
set(DTRAIN_CUDA_MODE "no")

if(NOT DTRAIN_LIBTORCH)
  find_package(Torch REQUIRED)
  set(DTRAIN_TORCH_MODE "find_package(Torch) ${Torch_DIR}")
  if(DTRAIN_CUDA STREQUAL "ON")
    message(FATAL_ERROR "DTRAIN_CUDA=ON, but the default libtorch (Debian's) has no CUDA: pass "
      "-DDTRAIN_LIBTORCH=<a CUDA libtorch, e.g. PyPI torch's site-packages/torch>")
  endif()
else()
  if(NOT EXISTS "${DTRAIN_LIBTORCH}/include/torch/csrc/api/include/torch/torch.h")
    message(FATAL_ERROR "DTRAIN_LIBTORCH=${DTRAIN_LIBTORCH} is not a libtorch: "
      "include/torch/csrc/api/include/torch/torch.h is missing there. Give a libtorch directory or "
      "the torch package of a PyPI wheel (python -c 'import torch, os; print(os.path.dirname(torch.__file__))').")
  endif()
  if(EXISTS "${DTRAIN_LIBTORCH}/share/cmake/Torch/TorchConfig.cmake" AND NOT EXISTS "${DTRAIN_LIBTORCH}/lib/libtorch_cuda.so")
    # A CPU libtorch: its own config says everything (flags, libraries).
    find_package(Torch REQUIRED PATHS "${DTRAIN_LIBTORCH}/share/cmake/Torch" NO_DEFAULT_PATH)
    set(DTRAIN_TORCH_MODE "find_package(Torch) ${Torch_DIR}")
  else()
    # A CUDA libtorch (PyPI's wheels are): its config demands a whole CUDA toolkit (nvcc, cuDNN,
    # ...) even for CPU use, so dtrain takes its libraries directly - the CPU part always
    # (libtorch_cpu + libc10 and the headers), the CUDA part (below) when it can be compiled.
    # IMPORTED: an installed dtrain's package config makes the same targets (dtrainConfig.cmake).
    add_library(dtrain_libtorch_cpu INTERFACE IMPORTED GLOBAL)
    target_include_directories(dtrain_libtorch_cpu SYSTEM INTERFACE
      "${DTRAIN_LIBTORCH}/include" "${DTRAIN_LIBTORCH}/include/torch/csrc/api/include")
    target_link_libraries(dtrain_libtorch_cpu INTERFACE
      "${DTRAIN_LIBTORCH}/lib/libtorch_cpu.so" "${DTRAIN_LIBTORCH}/lib/libc10.so")
    # The wheel's libraries find their CUDA runtime (which libtorch_cpu links, for the
    # profiler) through their own rpath; the linker must find it too.
    file(GLOB _dtrain_nvidia_libs "${DTRAIN_LIBTORCH}/../nvidia/*/lib")
    foreach(dir IN LISTS _dtrain_nvidia_libs)
      target_link_options(dtrain_libtorch_cpu INTERFACE "LINKER:-rpath-link,${dir}")
    endforeach()
    # Not in the pip wheel's build: what it installs finds the torch package beside it
    # (CMAKE_INSTALL_RPATH, CMakeLists.txt), never the build's venv.
    if(NOT SKBUILD)
      target_link_options(dtrain_libtorch_cpu INTERFACE "LINKER:-rpath,${DTRAIN_LIBTORCH}/lib")
    endif()
    set(TORCH_LIBRARIES dtrain_libtorch_cpu)
    set(TORCH_INCLUDE_DIRS "${DTRAIN_LIBTORCH}/include" "${DTRAIN_LIBTORCH}/include/torch/csrc/api/include")
    set(DTRAIN_TORCH_MODE "the libraries of ${DTRAIN_LIBTORCH}")
    if(EXISTS "${DTRAIN_LIBTORCH}/lib/libtorch_cuda.so" AND NOT DTRAIN_CUDA STREQUAL "OFF")
      include("${CMAKE_CURRENT_LIST_DIR}/libtorch_cuda.cmake")
    elseif(DTRAIN_CUDA STREQUAL "ON")
      message(FATAL_ERROR "DTRAIN_CUDA=ON, but ${DTRAIN_LIBTORCH} has no CUDA (lib/libtorch_cuda.so is missing)")
    endif()
  endif()
endif()

# Gloo's headers, for c10d's ProcessGroupGloo.hpp.
find_path(DTRAIN_GLOO_HEADERS gloo/rendezvous/store.h
  HINTS "${DTRAIN_GLOO_INCLUDE_DIR}" "${DTRAIN_LIBTORCH}/include" NO_CACHE)
# A project using an installed dtrain (dtrainConfig.cmake) compiles none of c10d's Gloo headers.
if(NOT DTRAIN_GLOO_HEADERS AND NOT DTRAIN_FROM_PACKAGE)
  message(FATAL_ERROR "Gloo's headers (gloo/rendezvous/store.h) are not found: this libtorch ships none. "
    "Install Debian's libgloo-dev (scripts/setup.sh does), or pass -DDTRAIN_GLOO_INCLUDE_DIR=DIR.")
endif()

set(_dtrain_tv "")
foreach(header IN ITEMS torch/headeronly/version.h torch/version.h)  # 2.9+ / before
  foreach(dir IN LISTS TORCH_INCLUDE_DIRS)
    if(NOT _dtrain_tv AND EXISTS "${dir}/${header}")
      file(STRINGS "${dir}/${header}" _dtrain_tv REGEX "#define TORCH_VERSION_(MAJOR|MINOR|PATCH) ")
    endif()
  endforeach()
endforeach()
string(REGEX REPLACE ".*MAJOR ([0-9]+).*MINOR ([0-9]+).*PATCH ([0-9]+).*" "\\1.\\2.\\3" DTRAIN_TORCH_VERSION "${_dtrain_tv}")
message(STATUS "dtrain: libtorch ${DTRAIN_TORCH_VERSION} (${DTRAIN_TORCH_MODE}); Gloo headers: ${DTRAIN_GLOO_HEADERS}")
# What this build can run collectives on, said at configure time rather than discovered at
# run time. The `gpu` tests are registered only when this build has CUDA and this machine shows
# a GPU (DTRAIN_GPU_TESTS=AUTO; ON requires them, OFF never registers them).
set(DTRAIN_GPU_TESTS "AUTO" CACHE STRING "register the gpu tests: AUTO (CUDA build and a visible GPU), ON, OFF")
set(DTRAIN_GPU_COUNT 0)
if(DTRAIN_WITH_CUDA)
  find_program(DTRAIN_NVIDIA_SMI nvidia-smi)
  if(DTRAIN_NVIDIA_SMI)
    execute_process(COMMAND "${DTRAIN_NVIDIA_SMI}" -L OUTPUT_VARIABLE _dtrain_gpus RESULT_VARIABLE _dtrain_smi_rc
                    ERROR_QUIET TIMEOUT 30)
    if(_dtrain_smi_rc EQUAL 0)
      string(REGEX MATCHALL "GPU [0-9]+:" _dtrain_gpu_lines "${_dtrain_gpus}")
      list(LENGTH _dtrain_gpu_lines DTRAIN_GPU_COUNT)
    endif()
  endif()
endif()
if(DTRAIN_GPU_TESTS STREQUAL "ON")
  if(NOT DTRAIN_WITH_CUDA)
    message(FATAL_ERROR "DTRAIN_GPU_TESTS=ON, but this build has no CUDA (DTRAIN_CUDA: ${DTRAIN_CUDA_MODE})")
  endif()
  set(DTRAIN_REGISTER_GPU_TESTS ON)
elseif(DTRAIN_GPU_TESTS STREQUAL "AUTO" AND DTRAIN_WITH_CUDA AND DTRAIN_GPU_COUNT GREATER 0)
  set(DTRAIN_REGISTER_GPU_TESTS ON)
else()
  set(DTRAIN_REGISTER_GPU_TESTS OFF)
endif()
if(DTRAIN_WITH_CUDA)
  set(_dtrain_backends "gloo, shm (shared memory), nccl and CUDA tensors through the CPU backends (${DTRAIN_CUDA_MODE})")
else()
  set(_dtrain_backends "gloo, shm (shared memory); CUDA: ${DTRAIN_CUDA_MODE}")
endif()
if(DTRAIN_REGISTER_GPU_TESTS)
  set(_dtrain_gpu_tests "registered (${DTRAIN_GPU_COUNT} GPU(s) visible)")
else()
  set(_dtrain_gpu_tests "not registered (CUDA build: ${DTRAIN_WITH_CUDA}, GPUs visible: ${DTRAIN_GPU_COUNT})")
endif()
message(STATUS "dtrain: collective backends built: ${_dtrain_backends}; gpu tests: ${_dtrain_gpu_tests}")
