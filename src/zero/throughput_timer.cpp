#include "zero/throughput_timer.h"

#include <torch/cuda.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "core/python_repr.h"

#include <torch/version.h>
// c10::getDeviceAllocator and its DeviceStats: PyTorch 2.9 on (1.13 reports the CPU's memory).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 9)
#include <c10/core/CachingDeviceAllocator.h>
#define DTRAIN_HAS_DEVICE_ALLOCATOR_STATS 1
#endif

namespace dtrain::zero::detail {
namespace {

constexpr double kTimeEpsilon = 1e-5;  // DeepSpeed's TIME_EPSILON

double wall_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

// /proc/self/statm's resident pages, in bytes (0 where it cannot be read).
int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(statm >> size >> resident)) return 0;
  return resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

// Python's round(bytes / 1024**3, 2), printed.
std::string gigabytes(int64_t bytes) {
  const double gb = static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0);
  return dtrain::detail::python_float_repr(std::round(gb * 100.0) / 100.0);
}

}  // namespace

std::pair<int64_t, int64_t> allocated_memory(const torch::Device& device) {
#ifdef DTRAIN_HAS_DEVICE_ALLOCATOR_STATS
  if (!device.is_cpu()) {
    try {
      const auto stats = c10::getDeviceAllocator(device.type())->getDeviceStats(device.index());
      const auto& all =
          stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
      return {all.current, all.peak};
    } catch (...) {  // an allocator without statistics: the process's memory below
    }
  }
#endif
  // DeepSpeed's CPU accelerator: the resident set, and the largest one it has sampled.
  static std::atomic<int64_t> peak{0};
  const int64_t now = resident_bytes();
  int64_t seen = peak.load();
  while (now > seen && !peak.compare_exchange_weak(seen, now)) {
  }
  return {now, std::max(now, seen)};
}

ThroughputTimer::ThroughputTimer(Options options, Clock clock, Memory memory)
    : o_(std::move(options)), clock_(std::move(clock)), memory_(std::move(memory)) {
  if (!clock_) clock_ = wall_seconds;
  if (!memory_) memory_ = [device = o_.device] { return allocated_memory(device); };
}

void ThroughputTimer::synchronize() const {
  if (o_.synchronized && o_.device.is_cuda()) torch::cuda::synchronize(o_.device.index());
}

void ThroughputTimer::start() {
  if (!o_.enabled) return;
  started_ = true;
  if (global_step_count_ >= o_.start_step) {
    synchronize();
    start_time_ = clock_();
    timed_ = true;
  }
}

std::string ThroughputTimer::stop(bool global_step, bool report) {
  if (!o_.enabled || !started_) return "";
  started_ = false;
  ++micro_step_count_;
  if (global_step) ++global_step_count_;
  if (!timed_) return "";
  synchronize();
  const double duration = clock_() - start_time_;
  total_elapsed_ += duration;
  step_elapsed_ += duration;
  if (!global_step) return "";
  std::string line;
  // Python's `count % steps_per_print == 0`: fmod is exact, and the remainder's sign does not
  // change whether it is 0.
  if (report && o_.steps_per_output &&
      std::fmod(static_cast<double>(global_step_count_), *o_.steps_per_output) == 0) {
    const double batch = static_cast<double>(o_.batch_size);
    const double running =
        batch / (total_elapsed_ / static_cast<double>(global_step_count_ - o_.start_step));
    const double current = batch / (step_elapsed_ + kTimeEpsilon);
    const auto [now, peak] = memory_();
    line = "epoch=" + std::to_string(epoch_count_) +
           "/micro_step=" + std::to_string(micro_step_count_) +
           "/global_step=" + std::to_string(global_step_count_) +
           ", RunningAvgSamplesPerSec=" + dtrain::detail::python_float_repr(running) +
           ", CurrSamplesPerSec=" + dtrain::detail::python_float_repr(current) +
           ", MemAllocated=" + gigabytes(now) + "GB, MaxMemAllocated=" + gigabytes(peak) + "GB";
  }
  step_elapsed_ = 0;
  return line;
}

}  // namespace dtrain::zero::detail
