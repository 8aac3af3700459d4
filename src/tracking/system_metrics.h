// System metrics as MLflow 3's SystemMetricsMonitor logs them (mlflow.start_run(
// log_system_metrics=True) or MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING=true): every
// `interval_s` a sample of the machine, read as psutil reads it (CPU utilization since the
// previous sample, memory used = total - available, the root filesystem, bytes through every
// network interface since the monitor started) and, when NVIDIA's driver is there, each GPU's
// memory, utilization and power as pynvml reads them; every `samples_before_logging` samples
// their means (rounded to one decimal as Python's round) are logged as "system/<name>" (or
// "system/<node_id>/<name>") at steps 0, 1, 2, ... (continuing a run: after its largest
// "system/" step). A run that ends first logs nothing of the window it was in, as MLflow; as
// MLflow's monitor asks the server after every sample, a run another client ended (status no
// longer RUNNING) stops the monitor too.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace dtrain::mlflow::detail {

class Nvml;

struct SystemMetricsSettings {
  bool enabled = false;
  double interval_s = 10;          // MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL
  int samples_before_logging = 1;  // MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING
  std::string node_id;             // MLFLOW_SYSTEM_METRICS_NODE_ID
};

// `option` when set, else MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING (true/false/1/0, any case, as
// MLflow reads it), and the three variables above (unset, empty or 0: the default, as MLflow's
// `or`). A value MLflow cannot read, or a negative or non-finite one, is a UsageError.
SystemMetricsSettings system_metrics_settings(std::optional<bool> option);

// One machine's readings, accumulated until aggregate().
class SystemSampler {
 public:
  SystemSampler();  // the network baseline (psutil's counters since boot, at this moment)
  ~SystemSampler();
  void collect();
  std::map<std::string, double> aggregate();  // names without the "system/" prefix; clears

 private:
  std::vector<double> last_cpu_;  // /proc/stat's first line at the previous sample
  double initial_receive_mb_ = 0, initial_transmit_mb_ = 0;
  std::map<std::string, std::vector<double>> samples_;
  std::map<std::string, double> network_;
  std::unique_ptr<Nvml> nvml_;
};

// The monitor thread: sample, wait, and every `samples_before_logging` samples publish.
class SystemMonitor {
 public:
  using Publish = std::function<void(const std::map<std::string, double>& metrics, int64_t step)>;
  // Asked after every sample: false (the run ended elsewhere) stops the monitor. One that
  // throws (no answer from the server) is taken as still running: unlike MLflow's monitor,
  // which stops for good on one failed runs/get, a server that is down for a while loses no
  // system metrics (the run's sender spools them).
  using StillRunning = std::function<bool()>;
  SystemMonitor(SystemMetricsSettings settings, int64_t first_step, Publish publish,
                StillRunning still_running = nullptr);
  ~SystemMonitor();
  void stop();  // returns once the thread has ended (within one sample's reading)

 private:
  void loop();
  SystemMetricsSettings settings_;
  int64_t step_;
  Publish publish_;
  StillRunning still_running_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace dtrain::mlflow::detail
