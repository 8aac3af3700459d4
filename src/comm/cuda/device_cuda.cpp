// A CUDA build: the GPU queries and the NCCL backend through libdtrain_cuda.so (plugin_api.h),
// loaded on first use - or before main() where this machine shows an NVIDIA device, because
// libtorch disables CUDA for good once anything asked it about CUDA before libtorch_cuda was
// loaded (at::manual_seed does), and on a GPU machine a program expects CUDA from its first line.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "comm/cuda/device.h"
#include "comm/cuda/plugin_api.h"
#include "comm/nccl/nccl.h"
#include "dtrain/error.h"

// dtrain::dtrain's link interface asks the linker for this symbol, so this object (and its
// start-up load below) is in every program that links dtrain.
extern "C" {
__attribute__((used)) int dtrain_cuda_autoload_anchor = 0;
}

namespace dtrain::comm::cuda {

namespace {

struct Loaded {
  const DtrainCudaPluginV1* api = nullptr;
  std::string error;  // why it could not be loaded
};

const Loaded& load() {
  static std::once_flag once;
  static Loaded loaded;
  std::call_once(once, [] {
    std::vector<std::string> paths;
    if (const char* env = std::getenv("DTRAIN_CUDA_PLUGIN"); env && *env) paths.push_back(env);
#ifdef DTRAIN_CUDA_PLUGIN_BUILD_PATH
    paths.push_back(DTRAIN_CUDA_PLUGIN_BUILD_PATH);
#endif
#ifdef DTRAIN_CUDA_PLUGIN_INSTALL_PATH
    paths.push_back(DTRAIN_CUDA_PLUGIN_INSTALL_PATH);
#endif
    paths.push_back("libdtrain_cuda.so");  // the loader's own search (LD_LIBRARY_PATH, ...)
    std::string errors;
    for (const auto& p : paths) {
      if (p.find('/') != std::string::npos && ::access(p.c_str(), R_OK) != 0) continue;
      // Lazy binding: libtorch_cuda's function symbols are bound at their first call rather
      // than all at load, which every process of a job on a GPU machine pays (the plugin and its
      // libraries took 0.12-0.17 s to load instead of 0.22-0.24 s, 2-core VM, torch 2.11 wheel).
      void* h = ::dlopen(p.c_str(), RTLD_LAZY | RTLD_GLOBAL);
      if (!h) {
        errors += std::string(errors.empty() ? "" : "; ") + ::dlerror();
        continue;
      }
      using Entry = const DtrainCudaPluginV1* (*)();
      auto entry = reinterpret_cast<Entry>(::dlsym(h, "dtrain_cuda_plugin_v1"));
      if (!entry) {
        errors += "; " + p + " has no dtrain_cuda_plugin_v1";
        continue;
      }
      loaded.api = entry();
      return;
    }
    loaded.error = "dtrain's CUDA plugin (libdtrain_cuda.so) could not be loaded" +
                   (errors.empty() ? std::string(": not found") : ": " + errors);
  });
  return loaded;
}

// Whether this machine shows an NVIDIA device (the driver's device nodes). Without one no GPU can
// be visible, and asking CUDA would only load libtorch_cuda for nothing. DTRAIN_CUDA_AUTOLOAD=1
// says there is one (=0: never load CUDA before it is asked for).
bool machine_has_gpu() {
  const char* v = std::getenv("DTRAIN_CUDA_AUTOLOAD");
  if (v && std::string(v) == "1") return true;
  return ::access("/dev/nvidiactl", F_OK) == 0 || ::access("/dev/nvidia0", F_OK) == 0;
}

// Where the machine shows an NVIDIA device, load CUDA before main(): see the top of the file.
bool autoload() {
  const char* v = std::getenv("DTRAIN_CUDA_AUTOLOAD");
  if (v && std::string(v) == "0") return false;
  return machine_has_gpu() && load().api != nullptr;
}

[[maybe_unused]] const bool autoloaded = autoload();

const DtrainCudaPluginV1& api(const char* what) {
  const Loaded& l = load();
  if (!l.api) throw UsageError(std::string(what) + ": " + l.error);
  return *l.api;
}

}  // namespace

}  // namespace dtrain::comm::cuda

// Called by `dtrain run`'s fork server (src/launch/forkserver/preload.cpp) once, before it forks
// the workers and before this program's constructors: the autoload above then happens once in
// the server instead of in each of the N workers (whose `autoloaded` finds it done). Loading
// starts no thread and does not initialise CUDA's driver (libcudart does that at its first call),
// so the workers may be forked after it. Only function-local statics are touched: safe before the
// program's constructors. Exported from the program (CMakeLists.txt: --export-dynamic-symbol).
extern "C" __attribute__((visibility("default"), used)) void dtrain_forkserver_prepare() {
  dtrain::comm::cuda::autoload();
}

namespace dtrain::comm::cuda {

bool built() { return true; }

int device_count() {
  if (!may_see_gpu()) return 0;
  const Loaded& l = load();
  return l.api ? l.api->device_count() : 0;
}

bool available() { return device_count() > 0; }

bool may_see_gpu() {
  if (!machine_has_gpu()) return false;
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return !(visible && std::string(visible).empty());
}

std::string device_uuid(int index) {
  const int count = device_count();
  if (index < 0 || index >= count) {
    throw UsageError("CUDA device " + std::to_string(index) +
                     " does not exist: this process sees " + std::to_string(count) +
                     " GPU(s) (CUDA_VISIBLE_DEVICES applies)");
  }
  char out[256];
  if (api("CUDA device query").device_uuid(index, out, sizeof out) != 0) {
    throw Error("CUDA device " + std::to_string(index) + ": " + out);
  }
  return out;
}

int default_device(int rank) {
  const int count = device_count();
  if (count <= 0) return -1;
  int local = rank;
  if (const char* v = std::getenv("LOCAL_RANK"); v && *v) {
    char* end = nullptr;
    const long parsed = std::strtol(v, &end, 10);
    if (end && *end == '\0' && parsed >= 0) local = static_cast<int>(parsed);
  }
  return (local < 0 ? 0 : local) % count;
}

void set_device(int index) {
  if (index < 0) return;
  char error[512];
  if (api("set_device").set_device(index, error, sizeof error) != 0) {
    throw Error("CUDA device " + std::to_string(index) + ": " + error);
  }
}

}  // namespace dtrain::comm::cuda

namespace dtrain::comm {

c10::intrusive_ptr<Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                      int world, std::chrono::milliseconds timeout, int device) {
  char error[1024];
  c10d::Backend* made =
      cuda::api("init_process_group(nccl)")
          .make_nccl(store.get(), rank, world, timeout.count(), device, error, sizeof error);
  if (!made)
    throw NetworkError("init_process_group: NCCL backend on GPU " + std::to_string(device) + ": " +
                       error);
  return c10::intrusive_ptr<Backend>::reclaim(made);
}

}  // namespace dtrain::comm
