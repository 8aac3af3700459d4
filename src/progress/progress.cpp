#include "dtrain/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace dtrain {

Progress::Progress(ProgressOptions options) : o_(options) {
  const char* rank = std::getenv("RANK");
  enabled_ = o_.all_ranks || rank == nullptr || std::strcmp(rank, "0") == 0 || *rank == '\0';
  if (!o_.out) o_.out = stderr;
  tty_ = o_.tty >= 0 ? o_.tty == 1 : isatty(fileno(o_.out)) == 1;
  start_ = window_start_ = last_emit_ = std::chrono::steady_clock::now();
}

Progress::~Progress() { finish(); }

void Progress::step(int64_t epoch, int64_t step_in_epoch, int64_t samples, double loss) {
  if (!enabled_) return;
  epoch_ = epoch;
  step_ = step_in_epoch;
  loss_ = loss;
  ++done_steps_;
  window_samples_ += samples;
  ++window_steps_;
  auto now = std::chrono::steady_clock::now();
  double secs = std::chrono::duration<double>(now - window_start_).count();
  if (secs >= 1.0 || rate_ == 0) {
    if (secs > 0) {
      rate_ = static_cast<double>(window_samples_) / secs;
      step_rate_ = static_cast<double>(window_steps_) / secs;
    }
    if (secs >= 1.0) {
      window_start_ = now;
      window_samples_ = 0;
      window_steps_ = 0;
    }
  }
  auto since = now - last_emit_;
  bool plain_due = o_.every_steps > 0 ? done_steps_ % o_.every_steps == 0 : since >= o_.interval;
  if ((tty_ && since >= o_.refresh) || (!tty_ && plain_due)) {
    emit(false);
    last_emit_ = now;
  }
}

std::string Progress::status() const {
  char buf[256];
  int n = std::snprintf(buf, sizeof buf, "epoch %lld step %lld", static_cast<long long>(epoch_ + 1),
                        static_cast<long long>(step_));
  std::string s(buf, static_cast<size_t>(n));
  if (o_.steps_per_epoch > 0) {
    n = std::snprintf(buf, sizeof buf, "/%lld", static_cast<long long>(o_.steps_per_epoch));
    s.append(buf, static_cast<size_t>(n));
  }
  n = std::snprintf(buf, sizeof buf, " loss %.4f samples/s %.0f (epoch %lld/%lld", loss_, rate_,
                    static_cast<long long>(epoch_ + 1), static_cast<long long>(o_.epochs));
  s.append(buf, static_cast<size_t>(n));
  if (o_.steps_per_epoch > 0) {
    n = std::snprintf(buf, sizeof buf, ", %d%%",
                      static_cast<int>(100 * step_ / o_.steps_per_epoch));
    s.append(buf, static_cast<size_t>(n));
    if (step_rate_ > 0) {
      int64_t left = (o_.epochs - epoch_ - 1) * o_.steps_per_epoch + (o_.steps_per_epoch - step_);
      auto eta = static_cast<int64_t>(static_cast<double>(std::max<int64_t>(left, 0)) / step_rate_);
      n = std::snprintf(buf, sizeof buf, ", ETA %lld:%02lld:%02lld",
                        static_cast<long long>(eta / 3600), static_cast<long long>(eta / 60 % 60),
                        static_cast<long long>(eta % 60));
      s.append(buf, static_cast<size_t>(n));
    }
  }
  return s + ")";
}

void Progress::emit(bool final_line) {
  std::string s = status();
  if (tty_) {
    std::fprintf(o_.out, "\r\033[2K%s%s", s.c_str(), final_line ? "\n" : "");
    live_shown_ = !final_line;
  } else {
    std::fprintf(o_.out, "%s\n", s.c_str());
  }
  std::fflush(o_.out);
}

void Progress::message(const std::string& line) {
  if (!enabled_) return;
  if (tty_ && live_shown_) std::fprintf(o_.out, "\r\033[2K");
  std::fprintf(o_.out, "%s\n", line.c_str());
  if (tty_ && live_shown_) std::fprintf(o_.out, "%s", status().c_str());
  std::fflush(o_.out);
}

void Progress::finish() {
  if (!enabled_ || done_steps_ == 0) return;
  emit(true);
  enabled_ = false;
}

}  // namespace dtrain
