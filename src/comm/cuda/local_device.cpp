#include "comm/cuda/device.h"
#include "dtrain/device.h"

namespace dtrain {

bool cuda_available() { return comm::cuda::available(); }

int cuda_device_count() { return comm::cuda::device_count(); }

torch::Device local_device(bool make_current) {
  if (!comm::cuda::available()) return torch::Device(torch::kCPU);
  const int index = comm::cuda::default_device(0);
  if (make_current) comm::cuda::set_device(index);
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
}

}  // namespace dtrain
