// The table of functions libdtrain_cuda.so exports: everything of dtrain that calls CUDA or
// NCCL. libdtrain loads it on demand (device_cuda.cpp), so a program that never touches a GPU
// never loads libtorch_cuda (+0.5 s of start-up and ~350 MB of resident memory per process,
// measured with the torch 2.11 wheel) - the CPU tests of a CUDA build run as fast as a CPU
// build's. Plain functions and C strings only: no C++ exception crosses the boundary.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstddef>
#include <cstdint>

extern "C" {

struct DtrainCudaPluginV1 {
  // GPUs this process sees (CUDA_VISIBLE_DEVICES applies); 0 when none or CUDA fails.
  int (*device_count)();
  // Writes GPU `index`'s UUID ("GPU-<32 hex>") into out; returns 0, or -1 with a message in out.
  int (*device_uuid)(int index, char* out, size_t size);
  // Makes `index` the calling thread's current device; returns 0, or -1 with a message in error.
  int (*set_device)(int index, char* error, size_t size);
  // A new c10d::ProcessGroupNCCL (one reference, for the caller to reclaim), or nullptr with a
  // message in `error`.
  c10d::Backend* (*make_nccl)(c10d::Store* store, int rank, int world, int64_t timeout_ms,
                              int device, char* error, size_t size);
};

// The plugin's entry point (the symbol the loader looks up).
const DtrainCudaPluginV1* dtrain_cuda_plugin_v1();
}
