// A build without CUDA: no GPU is ever visible.
#include "comm/cuda/device.h"
#include "dtrain/error.h"

namespace dtrain::comm::cuda {

bool built() { return false; }
bool available() { return false; }
bool may_see_gpu() { return false; }
int device_count() { return 0; }
std::string device_uuid(int index) {
  throw UsageError("CUDA device " + std::to_string(index) +
                   ": this build of dtrain has no CUDA (configure it against a CUDA libtorch, "
                   "e.g. DTRAIN_LIBTORCH=pypi scripts/setup.sh)");
}
int default_device(int) { return -1; }
void set_device(int) {}

}  // namespace dtrain::comm::cuda
