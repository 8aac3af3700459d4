// dtrain::Progress: a training progress display for rank 0.
//
// On a terminal, one live line rewritten in place (epoch, step/steps, samples/s, loss, ETA);
// when the output is not a terminal (logs, CI), a plain line every `interval` instead.
//
//   dtrain::Progress progress({.epochs = 3, .steps_per_epoch = 469});
//   ... progress.step(epoch, batch + 1, samples_this_step * world, loss);
//   progress.message("epoch 1 test accuracy 0.85");   // a line that stays
//   progress.finish();
//
// Off rank 0 (RANK set and not 0) every call is a no-op unless `all_ranks` is set.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace dtrain {

struct ProgressOptions {
  int64_t epochs = 1;
  int64_t steps_per_epoch = 0;                                   // 0: unknown (no ETA)
  std::chrono::milliseconds interval{std::chrono::seconds(10)};  // between plain lines
  int64_t every_steps = 0;  // > 0: a plain line every N steps instead of every `interval`
  std::chrono::milliseconds refresh{std::chrono::milliseconds(200)};  // between terminal redraws
  std::FILE* out = nullptr;                                           // default stderr
  int tty = -1;  // -1: ask isatty(); 0/1 force plain or live
  bool all_ranks = false;
};

class Progress {
 public:
  explicit Progress(ProgressOptions options = {});
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // After a step: epoch (0-based), step within the epoch (1-based), samples this step (all
  // ranks together), the step's loss.
  void step(int64_t epoch, int64_t step_in_epoch, int64_t samples, double loss);
  // A line that stays (above the live line on a terminal).
  void message(const std::string& line);
  void finish();

  // The text of the current status, e.g.
  // "epoch 1 step 120/469 loss 0.4123 samples/s 5321 (epoch 1/3, 26%, ETA 0:01:02)".
  std::string status() const;
  double samples_per_second() const { return rate_; }

 private:
  void emit(bool final_line);
  ProgressOptions o_;
  bool enabled_ = true;
  bool tty_ = false;
  bool live_shown_ = false;
  int64_t epoch_ = 0, step_ = 0, done_steps_ = 0;
  double loss_ = 0, rate_ = 0, step_rate_ = 0;
  std::chrono::steady_clock::time_point start_, window_start_, last_emit_;
  int64_t window_samples_ = 0, window_steps_ = 0;
};

}  // namespace dtrain
