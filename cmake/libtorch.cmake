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

if(NOT DTRAIN_LIBTORCH)
  find_package(Torch REQUIRED)
  set(DTRAIN_TORCH_MODE "find_package(Torch) ${Torch_DIR}")
else()
  if(NOT EXISTS "${DTRAIN_LIBTORCH}/include/torch/csrc/api/include/torch/torch.h")
    message(FATAL_ERROR "DTRAIN_LIBTORCH=${DTRAIN_LIBTORCH} is not a libtorch: "
      "include/torch/csrc/api/include/torch/torch.h is missing there. Give a libtorch directory or "
      "the torch package of a PyPI wheel (python -c 'import torch, os; print(os.path.dirname(torch.__file__))').")
  endif()
  set(_dtrain_use_config OFF)
  if(EXISTS "${DTRAIN_LIBTORCH}/share/cmake/Torch/TorchConfig.cmake")
    if(EXISTS "${DTRAIN_LIBTORCH}/lib/libtorch_cuda.so")
      find_package(CUDAToolkit QUIET)
      if(CUDAToolkit_FOUND)
        set(_dtrain_use_config ON)
      endif()
    else()
      set(_dtrain_use_config ON)
    endif()
  endif()
  if(_dtrain_use_config)
    find_package(Torch REQUIRED PATHS "${DTRAIN_LIBTORCH}/share/cmake/Torch" NO_DEFAULT_PATH)
    set(DTRAIN_TORCH_MODE "find_package(Torch) ${Torch_DIR}")
  else()
    # IMPORTED: an installed dtrain's package config makes the same target (dtrainConfig.cmake).
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
    set(DTRAIN_TORCH_MODE "CPU libraries of ${DTRAIN_LIBTORCH} (no CUDA toolkit found for its CUDA build)")
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
# What this build can run collectives on. NCCL and the `gpu` test label need a CUDA-enabled
# libtorch linked through its own config (a CUDA toolkit present); this tree has no GPU path
# yet, so every build says so rather than leaving it to be discovered at run time.
message(STATUS "dtrain: collective backends built: gloo, shm (shared memory); nccl: no "
  "(not implemented yet); gpu tests: not registered")
