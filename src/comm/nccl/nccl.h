// c10d's ProcessGroupNCCL as a dtrain backend (CUDA builds only): made inside dtrain's CUDA
// plugin (comm/cuda/plugin.cpp), reached through comm/cuda/device_cuda.cpp.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>

#include "comm/c10d_compat.h"

namespace dtrain::comm {

// An NCCL backend of `world` ranks over `store` on GPU `device` (this rank's own: NCCL
// refuses two ranks on one GPU). Communicators are made at the first collective, through the
// store; every collective and the store's waits time out after `timeout` (NCCL's watchdog
// then aborts the communicator: TORCH_NCCL_ASYNC_ERROR_HANDLING decides whether the process
// too, as in PyTorch).
c10::intrusive_ptr<Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                      int world, std::chrono::milliseconds timeout, int device);

}  // namespace dtrain::comm
