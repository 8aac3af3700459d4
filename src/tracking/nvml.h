// NVIDIA's management library (libnvidia-ml.so.1, part of the driver), loaded when present:
// the GPU readings MLflow's GPUMonitor takes through pynvml. No build-time dependency; without
// a driver `Nvml::load()` returns nullptr.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

namespace dtrain::mlflow::detail {

struct GpuReading {
  std::optional<uint64_t> memory_used, memory_total;  // bytes
  std::optional<unsigned> utilization;                // percent
  std::optional<unsigned> power_mw, power_limit_mw;   // milliwatts
};

class Nvml {
 public:
  static std::unique_ptr<Nvml> load();  // nullptr: no library, or nvmlInit failed
  ~Nvml();
  unsigned device_count() const { return count_; }
  GpuReading read(unsigned index) const;  // a field the device cannot give stays empty

  struct Api;

 private:
  Nvml() = default;
  void* lib_ = nullptr;
  unsigned count_ = 0;
  std::unique_ptr<Api> api_;
};

}  // namespace dtrain::mlflow::detail
