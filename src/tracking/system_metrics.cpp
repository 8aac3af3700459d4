// MLflow's system metrics: the settings, psutil's readings from /proc and statvfs, NVML's for
// GPUs, and the monitor thread.
#include "tracking/system_metrics.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "dtrain/error.h"
#include "tracking/nvml.h"

namespace dtrain::mlflow::detail {
namespace {

std::string trimmed(const char* text) {
  std::string s(text);
  auto blank = [](unsigned char c) { return std::isspace(c) != 0; };
  s.erase(s.begin(), std::find_if_not(s.begin(), s.end(), blank));
  s.erase(std::find_if_not(s.rbegin(), s.rend(), blank).base(), s.end());
  return s;
}

// Python's round(x, 1): the correctly rounded decimal, as glibc's printf also rounds.
double round1(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f", x);
  return std::strtod(buf, nullptr);
}

double mean_round1(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;  // in order, as Python's sum()
  return round1(sum / static_cast<double>(v.size()));
}

// /proc/stat's "cpu" line: user nice system idle iowait irq softirq steal guest guest_nice.
std::vector<double> cpu_times() {
  std::ifstream in("/proc/stat");
  std::string line;
  std::getline(in, line);
  std::istringstream fields(line);
  std::string name;
  fields >> name;
  std::vector<double> out;
  for (double v; fields >> v;) out.push_back(v / static_cast<double>(::sysconf(_SC_CLK_TCK)));
  return out;
}

// psutil.cpu_percent(): busy share of the time since `before`, guest time counted once.
double cpu_percent(const std::vector<double>& before, const std::vector<double>& after) {
  if (before.size() != after.size() || after.size() < 4) return 0.0;
  std::vector<double> d(after.size());
  for (size_t i = 0; i < d.size(); ++i) d[i] = std::max(0.0, after[i] - before[i]);
  double all = 0;
  for (double x : d) all += x;
  if (d.size() > 8) all -= d[8];                           // guest
  if (d.size() > 9) all -= d[9];                           // guest_nice
  double busy = all - d[3] - (d.size() > 4 ? d[4] : 0.0);  // idle, iowait
  if (all == 0) return 0.0;
  return round1(busy / all * 100);
}

std::map<std::string, uint64_t> meminfo() {
  std::ifstream in("/proc/meminfo");
  std::map<std::string, uint64_t> out;
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  for (std::string line; std::getline(in, line);) {
    std::istringstream f(line);
    if (f >> key >> kb) out[key] = kb * 1024;
  }
  return out;
}

// psutil.net_io_counters(): bytes received and sent through every interface, lo included.
std::pair<double, double> network_bytes() {
  std::ifstream in("/proc/net/dev");
  std::string line;
  double recv = 0, sent = 0;
  for (int n = 0; std::getline(in, line); ++n) {
    if (n < 2) continue;
    auto colon = line.rfind(':');
    if (colon == std::string::npos) continue;
    std::istringstream f(line.substr(colon + 1));
    std::vector<double> v;
    for (double x; f >> x;) v.push_back(x);
    if (v.size() < 9) continue;
    recv += v[0];
    sent += v[8];
  }
  return {recv, sent};
}

}  // namespace

SystemMetricsSettings system_metrics_settings(std::optional<bool> option) {
  SystemMetricsSettings s;
  if (option) {
    s.enabled = *option;
  } else if (const char* v = std::getenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING")) {
    std::string lower(v);
    for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lower != "true" && lower != "false" && lower != "1" && lower != "0")
      throw UsageError("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING=" + std::string(v) +
                       " is not one of true, false, 1, 0 (as MLflow reads it); set one of them "
                       "or unset it");
    s.enabled = lower == "true" || lower == "1";
  }
  if (!s.enabled) return s;
  if (const char* v = std::getenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL")) {
    const std::string t = trimmed(v);
    char* end = nullptr;
    double x = t.empty() ? 0 : std::strtod(t.c_str(), &end);
    if (!t.empty() && (end != t.c_str() + t.size() || !std::isfinite(x) || x < 0))
      throw UsageError("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL=" + std::string(v) +
                       " is not a number of seconds >= 0; set it (e.g. 10) or unset it");
    if (x > 0) s.interval_s = x;
  }
  if (const char* v = std::getenv("MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING")) {
    const std::string t = trimmed(v);
    char* end = nullptr;
    long x = t.empty() ? 0 : std::strtol(t.c_str(), &end, 10);
    if (!t.empty() && (end != t.c_str() + t.size() || x < 0 || x > 1000000))
      throw UsageError("MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING=" + std::string(v) +
                       " is not a whole number of samples >= 0; set it (e.g. 1) or unset it");
    if (x > 0) s.samples_before_logging = static_cast<int>(x);
  }
  if (const char* v = std::getenv("MLFLOW_SYSTEM_METRICS_NODE_ID")) s.node_id = v;
  return s;
}

SystemSampler::SystemSampler() : nvml_(Nvml::load()) {
  auto [recv, sent] = network_bytes();
  initial_receive_mb_ = recv / 1e6;
  initial_transmit_mb_ = sent / 1e6;
}

SystemSampler::~SystemSampler() = default;

void SystemSampler::collect() {
  std::vector<double> now = cpu_times();
  samples_["cpu_utilization_percentage"].push_back(
      last_cpu_.empty() ? 0.0 : cpu_percent(last_cpu_, now));  // psutil's first call: 0.0
  last_cpu_ = std::move(now);

  auto mem = meminfo();
  const double total = static_cast<double>(mem["MemTotal:"]);
  const double used = total - static_cast<double>(mem["MemAvailable:"]);
  samples_["system_memory_usage_megabytes"].push_back(used / 1e6);
  samples_["system_memory_usage_percentage"].push_back(total > 0 ? used / total * 100 : 0.0);

  struct statvfs st {};
  if (::statvfs("/", &st) == 0) {
    const double frsize = static_cast<double>(st.f_frsize);
    const double disk_used = static_cast<double>(st.f_blocks - st.f_bfree) * frsize;
    const double avail = static_cast<double>(st.f_bavail) * frsize;
    const double user_total = disk_used + avail;
    samples_["disk_usage_percentage"].push_back(
        user_total > 0 ? round1(disk_used / user_total * 100) : 0.0);
    samples_["disk_usage_megabytes"].push_back(disk_used / 1e6);
    samples_["disk_available_megabytes"].push_back(avail / 1e6);
  }

  auto [recv, sent] = network_bytes();
  network_["network_receive_megabytes"] = recv / 1e6 - initial_receive_mb_;
  network_["network_transmit_megabytes"] = sent / 1e6 - initial_transmit_mb_;

  if (!nvml_) return;
  for (unsigned i = 0; i < nvml_->device_count(); ++i) {
    const GpuReading g = nvml_->read(i);
    const std::string gpu = "gpu_" + std::to_string(i) + "_";
    if (g.memory_used && g.memory_total && *g.memory_total > 0) {
      const auto u = static_cast<double>(*g.memory_used);
      samples_[gpu + "memory_usage_percentage"].push_back(
          round1(u / static_cast<double>(*g.memory_total) * 100));
      samples_[gpu + "memory_usage_megabytes"].push_back(u / 1e6);
    }
    if (g.utilization) samples_[gpu + "utilization_percentage"].push_back(*g.utilization);
    if (g.power_mw && g.power_limit_mw) {
      samples_[gpu + "power_usage_watts"].push_back(*g.power_mw / 1000.0);
      samples_[gpu + "power_usage_percentage"].push_back(
          static_cast<double>(*g.power_mw) / static_cast<double>(*g.power_limit_mw) * 100);
    }
  }
}

std::map<std::string, double> SystemSampler::aggregate() {
  std::map<std::string, double> out;
  for (const auto& [name, values] : samples_)
    if (!values.empty()) out[name] = mean_round1(values);
  for (const auto& [name, value] : network_) out[name] = value;  // the last reading, as is
  samples_.clear();
  network_.clear();
  return out;
}

SystemMonitor::SystemMonitor(SystemMetricsSettings settings, int64_t first_step, Publish publish,
                             StillRunning still_running)
    : settings_(std::move(settings)),
      step_(first_step),
      publish_(std::move(publish)),
      still_running_(std::move(still_running)) {
  thread_ = std::thread([this] { loop(); });
}

SystemMonitor::~SystemMonitor() { stop(); }

void SystemMonitor::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void SystemMonitor::loop() {
  SystemSampler sampler;
  const auto interval = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(settings_.interval_s));
  const std::string prefix =
      "system/" + (settings_.node_id.empty() ? std::string() : settings_.node_id + "/");
  std::unique_lock<std::mutex> lk(mu_);
  while (!stopping_) {
    for (int i = 0; i < settings_.samples_before_logging; ++i) {
      lk.unlock();
      sampler.collect();
      lk.lock();
      cv_.wait_for(lk, interval, [&] { return stopping_; });
      if (stopping_) return;  // the window in progress is not logged, as in MLflow
      if (still_running_) {
        lk.unlock();
        bool running = true;
        try {
          running = still_running_();
        } catch (const std::exception&) {
          running = true;  // no answer: keep sampling (see StillRunning)
        }
        lk.lock();
        if (!running || stopping_) return;
      }
    }
    std::map<std::string, double> metrics;
    for (const auto& [name, value] : sampler.aggregate()) metrics[prefix + name] = value;
    lk.unlock();
    publish_(metrics, step_++);
    lk.lock();
  }
}

}  // namespace dtrain::mlflow::detail
