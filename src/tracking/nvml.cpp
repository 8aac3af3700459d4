// libnvidia-ml.so.1 through dlopen, with the few entry points the GPU readings need (their C
// signatures are NVML's stable ABI; nvml.h is not needed to build).
#include "tracking/nvml.h"

#include <dlfcn.h>

#include <type_traits>

namespace dtrain::mlflow::detail {
namespace {

using nvmlDevice = void*;
struct NvmlMemory {
  unsigned long long total, free, used;
};
struct NvmlUtilization {
  unsigned gpu, memory;
};

}  // namespace

struct Nvml::Api {
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*count)(unsigned*) = nullptr;
  int (*handle)(unsigned, nvmlDevice*) = nullptr;
  int (*memory)(nvmlDevice, NvmlMemory*) = nullptr;
  int (*utilization)(nvmlDevice, NvmlUtilization*) = nullptr;
  int (*power)(nvmlDevice, unsigned*) = nullptr;
  int (*power_limit)(nvmlDevice, unsigned*) = nullptr;
};

std::unique_ptr<Nvml> Nvml::load() {
  void* lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return nullptr;
  auto api = std::make_unique<Api>();
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(lib, name));
    return fn != nullptr;
  };
  bool ok = sym(api->init, "nvmlInit_v2") && sym(api->shutdown, "nvmlShutdown") &&
            sym(api->count, "nvmlDeviceGetCount_v2") &&
            sym(api->handle, "nvmlDeviceGetHandleByIndex_v2") &&
            sym(api->memory, "nvmlDeviceGetMemoryInfo") &&
            sym(api->utilization, "nvmlDeviceGetUtilizationRates") &&
            sym(api->power, "nvmlDeviceGetPowerUsage") &&
            sym(api->power_limit, "nvmlDeviceGetEnforcedPowerLimit");
  unsigned count = 0;
  if (!ok || api->init() != 0) {
    ::dlclose(lib);
    return nullptr;
  }
  if (api->count(&count) != 0) {
    api->shutdown();
    ::dlclose(lib);
    return nullptr;
  }
  std::unique_ptr<Nvml> n(new Nvml);
  n->lib_ = lib;
  n->count_ = count;
  n->api_ = std::move(api);
  return n;
}

Nvml::~Nvml() {
  if (api_) api_->shutdown();
  if (lib_ != nullptr) ::dlclose(lib_);
}

GpuReading Nvml::read(unsigned index) const {
  GpuReading r;
  nvmlDevice dev = nullptr;
  if (api_->handle(index, &dev) != 0) return r;
  NvmlMemory mem{};
  if (api_->memory(dev, &mem) == 0) {
    r.memory_used = mem.used;
    r.memory_total = mem.total;
  }
  NvmlUtilization util{};
  if (api_->utilization(dev, &util) == 0) r.utilization = util.gpu;
  unsigned mw = 0, limit = 0;
  if (api_->power(dev, &mw) == 0 && api_->power_limit(dev, &limit) == 0 && limit > 0) {
    r.power_mw = mw;
    r.power_limit_mw = limit;
  }
  return r;
}

}  // namespace dtrain::mlflow::detail
