// The device a worker trains on, by torchrun's convention: one GPU per local rank.
//
//   auto device = dtrain::local_device();   // cuda:LOCAL_RANK where a GPU is visible, else cpu
//   model->to(device);
//
// dtrain runs CUDA where it was built against a CUDA libtorch (DTRAIN_CUDA; the configure step
// says whether it was) and the process sees a GPU; everything else trains on the CPU.
#pragma once

#include <torch/types.h>

namespace dtrain {

// Whether this build of dtrain has CUDA and this process sees at least one GPU.
bool cuda_available();

// GPUs this process sees (CUDA_VISIBLE_DEVICES applies); 0 without CUDA.
int cuda_device_count();

// This worker's device: cuda:(LOCAL_RANK modulo the visible GPUs) where cuda_available(), else
// the CPU. With `make_current` (the default) it also becomes this thread's current CUDA device,
// as torch.cuda.set_device does, so kernels and NCCL use it.
torch::Device local_device(bool make_current = true);

}  // namespace dtrain
