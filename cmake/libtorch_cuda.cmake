# The CUDA half of a CUDA libtorch (included by libtorch.cmake for a DTRAIN_LIBTORCH that has
# lib/libtorch_cuda.so, unless DTRAIN_CUDA=OFF). No nvcc is needed: dtrain ships no kernels of
# its own, it compiles C++ against c10/ATen's CUDA headers and c10d's ProcessGroupNCCL.hpp.
#
# What that needs, and where it is looked for (first found wins):
#   cuda_runtime_api.h, crt/host_defines.h, nv/target  DTRAIN_CUDA_INCLUDE_DIR, the CUDA toolkit
#       (find_package(CUDAToolkit), /usr/local/cuda), the wheel's nvidia/cu13/include (whose
#       crt/ and nv/ come from PyPI's nvidia-cuda-crt and nvidia-cuda-cccl)
#   nccl.h, libnccl.so.2   the wheel's nvidia/nccl (the NCCL libtorch was built with), the toolkit
#   libcudart.so           the wheel's nvidia/cu13/lib, the toolkit
# Sets DTRAIN_WITH_CUDA, DTRAIN_CUDA_MODE (what was found, for the configure summary) and, on
# success, the target dtrain_libtorch_cuda. It is not in TORCH_LIBRARIES: dtrain's own CUDA code is
# a plugin loaded on demand (src/comm/cuda/plugin_api.h), so a program links libtorch's CUDA
# libraries only when it calls CUDA itself (dtrain::cuda).
set(_dtrain_wheel_nvidia "${DTRAIN_LIBTORCH}/../nvidia")
find_package(CUDAToolkit QUIET)
set(_dtrain_cuda_hints ${DTRAIN_CUDA_INCLUDE_DIR})
foreach(dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
  list(APPEND _dtrain_cuda_hints "${dir}" "${dir}/cccl")
endforeach()
list(APPEND _dtrain_cuda_hints /usr/local/cuda/include /usr/local/cuda/include/cccl
     "${_dtrain_wheel_nvidia}/cu13/include" "${_dtrain_wheel_nvidia}/cu13/include/cccl"
     "${_dtrain_wheel_nvidia}/cuda_runtime/include")

set(_dtrain_cuda_missing "")
set(_dtrain_cuda_includes "")
foreach(header IN ITEMS cuda_runtime_api.h crt/host_defines.h nv/target cublas_v2.h cusparse.h)
  string(MAKE_C_IDENTIFIER "${header}" _id)
  find_path(_dtrain_cuda_${_id} "${header}" HINTS ${_dtrain_cuda_hints} NO_DEFAULT_PATH NO_CACHE)
  if(_dtrain_cuda_${_id})
    list(APPEND _dtrain_cuda_includes "${_dtrain_cuda_${_id}}")
  else()
    list(APPEND _dtrain_cuda_missing "${header}")
  endif()
endforeach()
find_path(_dtrain_nccl_include nccl.h HINTS "${_dtrain_wheel_nvidia}/nccl/include" ${_dtrain_cuda_hints}
          NO_DEFAULT_PATH NO_CACHE)
if(_dtrain_nccl_include)
  list(APPEND _dtrain_cuda_includes "${_dtrain_nccl_include}")
else()
  list(APPEND _dtrain_cuda_missing "nccl.h")
endif()
find_library(_dtrain_cudart NAMES cudart libcudart.so.13 libcudart.so.12
             HINTS "${_dtrain_wheel_nvidia}/cu13/lib" "${_dtrain_wheel_nvidia}/cuda_runtime/lib"
                   ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64 NO_DEFAULT_PATH NO_CACHE)
find_library(_dtrain_nccl NAMES nccl libnccl.so.2 HINTS "${_dtrain_wheel_nvidia}/nccl/lib"
             ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64 NO_CACHE)
if(NOT _dtrain_cudart)
  list(APPEND _dtrain_cuda_missing "libcudart.so")
endif()
if(NOT _dtrain_nccl)
  list(APPEND _dtrain_cuda_missing "libnccl.so.2")
endif()
foreach(lib IN ITEMS torch_cuda c10_cuda)
  if(NOT EXISTS "${DTRAIN_LIBTORCH}/lib/lib${lib}.so")
    list(APPEND _dtrain_cuda_missing "${DTRAIN_LIBTORCH}/lib/lib${lib}.so")
  endif()
endforeach()

# libtorch_cuda's own libraries (cuBLAS, cuDNN, ... - the wheel's nvidia-* dependencies, found
# through its RUNPATH) must be there too: a torch wheel installed without its dependencies has
# libtorch_cuda.so but cannot load it.
find_program(_dtrain_ldd ldd NO_CACHE)
if(_dtrain_ldd AND EXISTS "${DTRAIN_LIBTORCH}/lib/libtorch_cuda.so")
  execute_process(COMMAND "${_dtrain_ldd}" "${DTRAIN_LIBTORCH}/lib/libtorch_cuda.so"
                  OUTPUT_VARIABLE _dtrain_ldd_out ERROR_QUIET TIMEOUT 60)
  string(REGEX MATCHALL "[^ \t\n]+ => not found" _dtrain_unresolved "${_dtrain_ldd_out}")
  foreach(line IN LISTS _dtrain_unresolved)
    string(REGEX REPLACE " => not found" "" lib "${line}")
    list(APPEND _dtrain_cuda_missing "${lib} (needed by libtorch_cuda.so)")
  endforeach()
endif()

if(_dtrain_cuda_missing)
  list(JOIN _dtrain_cuda_missing ", " _dtrain_missing_text)
  set(DTRAIN_CUDA_MODE "no: ${_dtrain_missing_text} not found")
  if(DTRAIN_CUDA STREQUAL "ON")
    message(FATAL_ERROR "DTRAIN_CUDA=ON, but ${_dtrain_missing_text} cannot be found. Install the CUDA "
      "toolkit (or PyPI's nvidia-cuda-crt==13.0.* and nvidia-cuda-cccl==13.0.* beside the torch wheel), "
      "or pass -DDTRAIN_CUDA_INCLUDE_DIR=DIR; -DDTRAIN_CUDA=OFF builds without CUDA.")
  endif()
  message(STATUS "dtrain: building without CUDA: ${_dtrain_missing_text} not found (DTRAIN_CUDA=AUTO)")
else()
  list(REMOVE_DUPLICATES _dtrain_cuda_includes)
  add_library(dtrain_libtorch_cuda INTERFACE IMPORTED GLOBAL)
  target_include_directories(dtrain_libtorch_cuda SYSTEM INTERFACE ${_dtrain_cuda_includes})
  # libtorch_cuda registers ATen's CUDA kernels when it loads; nothing of ours calls into it
  # by name except ProcessGroupNCCL, so a linker that drops unneeded libraries (Ubuntu's
  # default --as-needed) would leave CUDA tensors without kernels. Keep it (PyTorch's own
  # config does the same).
  target_link_libraries(dtrain_libtorch_cuda INTERFACE
    "-Wl,--no-as-needed" "${DTRAIN_LIBTORCH}/lib/libtorch_cuda.so" "-Wl,--as-needed"
    "${DTRAIN_LIBTORCH}/lib/libc10_cuda.so" "${_dtrain_cudart}" "${_dtrain_nccl}")
  get_filename_component(_dtrain_cudart_dir "${_dtrain_cudart}" DIRECTORY)
  get_filename_component(_dtrain_nccl_dir "${_dtrain_nccl}" DIRECTORY)
  target_link_options(dtrain_libtorch_cuda INTERFACE "LINKER:-rpath,${_dtrain_cudart_dir}"
                      "LINKER:-rpath,${_dtrain_nccl_dir}")
  set(DTRAIN_WITH_CUDA ON)
  file(STRINGS "${_dtrain_cuda_cuda_runtime_api_h}/cuda_runtime_api.h" _dtrain_cudart_version
       REGEX "#define CUDART_VERSION +[0-9]+")
  string(REGEX REPLACE ".*CUDART_VERSION +([0-9]+).*" "\\1" _dtrain_cudart_version "${_dtrain_cudart_version}")
  math(EXPR _dtrain_cuda_major "${_dtrain_cudart_version} / 1000")
  math(EXPR _dtrain_cuda_minor "(${_dtrain_cudart_version} % 1000) / 10")
  file(STRINGS "${_dtrain_nccl_include}/nccl.h" _dtrain_nccl_version REGEX "#define NCCL_(MAJOR|MINOR|PATCH) ")
  string(REGEX REPLACE ".*MAJOR ([0-9]+).*MINOR ([0-9]+).*PATCH ([0-9]+).*" "\\1.\\2.\\3"
         _dtrain_nccl_version "${_dtrain_nccl_version}")
  set(DTRAIN_CUDA_MODE "CUDA ${_dtrain_cuda_major}.${_dtrain_cuda_minor} headers from ${_dtrain_cuda_cuda_runtime_api_h}, NCCL ${_dtrain_nccl_version}")
endif()
