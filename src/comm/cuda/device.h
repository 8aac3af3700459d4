// The GPUs this process sees, for choosing backends and devices (no CUDA headers here: the
// implementation is device_cuda.cpp in CUDA builds, device_none.cpp otherwise).
#pragma once

#include <string>

namespace dtrain::comm::cuda {

// Whether this build of dtrain has CUDA (DTRAIN_CUDA at configure time).
bool built();
// Whether this build has CUDA and this process sees at least one GPU.
bool available();
// Whether this process might see a GPU, without asking CUDA (which starts the driver): a CUDA
// build on a machine with an NVIDIA device node, CUDA_VISIBLE_DEVICES not empty.
// DTRAIN_CUDA_AUTOLOAD=1 says the machine has one. false where available() is false for sure.
bool may_see_gpu();
// GPUs this process sees (CUDA_VISIBLE_DEVICES applies); 0 without CUDA.
int device_count();
// A string equal in two processes of one host exactly when they use the same physical GPU
// (its UUID, which CUDA_VISIBLE_DEVICES renumbering does not change).
// REQUIRES: 0 <= index < device_count().
std::string device_uuid(int index);
// The device a rank uses when nobody said: LOCAL_RANK (else `rank`) modulo device_count(),
// torchrun's one-device-per-local-rank convention. -1 when no GPU is visible.
int default_device(int rank);
// Makes `index` this thread's current CUDA device (no-op without CUDA).
void set_device(int index);

}  // namespace dtrain::comm::cuda
