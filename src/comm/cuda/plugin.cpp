// libdtrain_cuda.so: dtrain's calls into CUDA and NCCL (see plugin_api.h). Built only with CUDA
// (DTRAIN_CUDA); this file is compiled with USE_C10D_NCCL, without which c10d's header declares
// no ProcessGroupNCCL.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <cstdio>
#include <exception>

#include "comm/cuda/plugin_api.h"
#include "dtrain/error_message.h"

namespace {

void write(char* out, size_t size, const std::string& text) {
  if (size == 0) return;
  std::snprintf(out, size, "%s", text.c_str());
}

int device_count() {
  try {
    return static_cast<int>(c10::cuda::device_count());
  } catch (const std::exception&) {
    return 0;
  }
}

int device_uuid(int index, char* out, size_t size) {
  try {
    const cudaDeviceProp* prop =
        at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(index));
    std::string uuid = "GPU-";
    char hex[3];
    for (unsigned char byte : prop->uuid.bytes) {
      std::snprintf(hex, sizeof hex, "%02x", byte);
      uuid += hex;
    }
    write(out, size, uuid);
    return 0;
  } catch (const std::exception& e) {
    write(out, size, dtrain::error_message(e));
    return -1;
  }
}

int set_device(int index, char* error, size_t size) {
  try {
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(index));
    return 0;
  } catch (const std::exception& e) {
    write(error, size, dtrain::error_message(e));
    return -1;
  }
}

c10d::Backend* make_nccl(c10d::Store* store, int rank, int world, int64_t timeout_ms, int device,
                         char* error, size_t size) {
  try {
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = std::chrono::milliseconds(timeout_ms);
    auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(
        c10::intrusive_ptr<c10d::Store>::reclaim_copy(store), rank, world, options);
    nccl->setBoundDeviceId(
        c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
    return nccl.release();
  } catch (const std::exception& e) {
    write(error, size, dtrain::error_message(e));
    return nullptr;
  }
}

const DtrainCudaPluginV1 kPlugin{device_count, device_uuid, set_device, make_nccl};

}  // namespace

extern "C" __attribute__((visibility("default"))) const DtrainCudaPluginV1*
dtrain_cuda_plugin_v1() {
  return &kPlugin;
}
