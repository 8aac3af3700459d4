// How many GPUs this machine shows a process, without libtorch (the launcher never loads it):
// `dtrain run --nproc-per-node gpu` and `auto` count them, as torchrun does with
// torch.cuda.device_count().
#pragma once

#include <string>

namespace dtrain::launch {

struct GpuCount {
  int count = 0;
  // How it was counted ("CUDA driver", "/dev/nvidia*"), or why none were found.
  std::string how;
};

// Asks the CUDA driver (libcuda.so.1: cuInit, cuDeviceGetCount) in a short-lived child
// process, so the launcher itself never initialises CUDA (its workers are forked from it);
// CUDA_VISIBLE_DEVICES applies as it does for the workers. Without a driver: the /dev/nvidiaN
// device files, limited by CUDA_VISIBLE_DEVICES. Never blocks longer than `timeout_ms`.
GpuCount count_gpus(int timeout_ms = 20000);

// The number of devices CUDA_VISIBLE_DEVICES lets a process see out of `present` (CUDA's
// rule: the list ends at the first entry that is not a device; "" or "-1" hides all).
// -1 when the variable is unset.
int visible_limit(const char* cuda_visible_devices, int present);

}  // namespace dtrain::launch
