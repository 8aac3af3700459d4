// DeepSpeed's ThroughputTimer (deepspeed/utils/timer.py, 0.19.8), as its engine drives it:
// start() at every forward, stop() at every step() call, and on rank 0 at an optimizer step
// whose count is a multiple of steps_per_print the line
//
//     epoch=0/micro_step=6/global_step=6, RunningAvgSamplesPerSec=118.57, CurrSamplesPerSec=
//     120.02, MemAllocated=0.79GB, MaxMemAllocated=0.79GB
//
// (one line; numbers as Python prints floats). The rules, as DeepSpeed's:
//   - Timing begins at the first forward after `start_step` (2) optimizer steps, so the first
//     line can come at optimizer step 3; a stop() without a start() since the last stop() does
//     nothing at all (not even count the micro step).
//   - micro_step counts the timed step() calls of the epoch, global_step the optimizer steps;
//     epoch stays 0 (dtrain's engine has no data loader to end epochs, as DeepSpeed's has none
//     when deepspeed.initialize gets no training_data).
//   - RunningAvgSamplesPerSec = batch / (time of the timed steps / (global_step - start_step));
//     CurrSamplesPerSec = batch / (this optimizer step's time + 1e-5), batch =
//     train_batch_size; the time of a step runs from each forward to the step() after it.
//   - MemAllocated, MaxMemAllocated: GB (2^30 bytes) rounded to 2 places. On a CUDA device
//     torch's caching allocator's allocated bytes and their peak (torch.cuda.memory_allocated,
//     max_memory_allocated); on the CPU the process's resident set and the largest of those
//     samples, as DeepSpeed's CPU accelerator reports them.
//   - steps_per_print as DeepSpeed reads it (a count modulo it; unset: no line); timers.
//     throughput.enabled false: no timing and no line. The engine prints the line only where
//     DeepSpeed's logger shows it (log_level info or debug).
// Not thread-safe: the thread that drives the engine calls it.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>

namespace dtrain::zero::detail {

class ThroughputTimer {
 public:
  struct Options {
    bool enabled = true;                     // timers.throughput.enabled
    bool synchronized = true;                // timers.throughput.synchronized: wait for the device
    int64_t batch_size = 1;                  // train_batch_size
    std::optional<double> steps_per_output;  // steps_per_print
    int64_t start_step = 2;
    torch::Device device{torch::kCPU};  // where MemAllocated is measured
  };
  // Seconds since some fixed point (the wall clock by default).
  using Clock = std::function<double()>;
  // (bytes allocated now, peak bytes) for the line (the device's by default).
  using Memory = std::function<std::pair<int64_t, int64_t>()>;

  explicit ThroughputTimer(Options options, Clock clock = {}, Memory memory = {});

  void start();
  // After a step() call; `global_step`: it was an optimizer step (taken or skipped). Returns
  // the line when one is due and `report` (rank 0), else "".
  std::string stop(bool global_step, bool report);

  int64_t global_step_count() const { return global_step_count_; }

 private:
  void synchronize() const;
  Options o_;
  Clock clock_;
  Memory memory_;
  bool started_ = false;
  bool timed_ = false;  // a start() has read the clock (DeepSpeed's start_time > 0)
  double start_time_ = 0, total_elapsed_ = 0, step_elapsed_ = 0;
  int64_t micro_step_count_ = 0, global_step_count_ = 0, epoch_count_ = 0;
};

// The bytes allocated on `device` now and their peak (see above; never throws).
std::pair<int64_t, int64_t> allocated_memory(const torch::Device& device);

}  // namespace dtrain::zero::detail
