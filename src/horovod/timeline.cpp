#include "horovod/timeline.h"

#include <cerrno>
#include <cstring>

#include "dtrain/error.h"
#include "timeline/chrome_trace.h"

namespace dtrain::hvd::detail {

Timeline::Timeline(const std::string& path, bool mark_cycles)
    : path_(path), mark_cycles_(mark_cycles) {
  file_ = std::fopen(path.c_str(), "w");
  if (!file_) {
    const int e = errno;
    throw UsageError("HOROVOD_TIMELINE='" + path + "': cannot open it for writing (" +
                     std::strerror(e) +
                     "); give a path in a writable, existing directory, or unset it");
  }
  start_ = std::chrono::steady_clock::now();
  last_flush_ = start_;
  const int64_t epoch_us = std::chrono::duration_cast<std::chrono::microseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
  buffer_ = trace::Event()
                .str("name", "process_name")
                .str("ph", "M")
                .num("pid", 0)
                .obj("args", trace::Event()
                                 .str("name", "horovod")
                                 .num("start_time_since_epoch_in_micros", epoch_us))
                .text() +
            ",\n" + sort_index(0);
  flush(true);
}

Timeline::~Timeline() {
  try {
    flush(true);
  } catch (...) {
    // Closing anyway.
  }
  if (file_) std::fclose(file_);
}

int64_t Timeline::now_us() const {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               start_)
      .count();
}

int Timeline::pid(const std::string& name) {
  auto it = pids_.find(name);
  if (it != pids_.end()) return it->second;
  const int p = static_cast<int>(pids_.size()) + 1;
  pids_.emplace(name, p);
  if (!buffer_.empty()) buffer_ += ",\n";
  buffer_ += trace::Event()
                 .str("name", "process_name")
                 .str("ph", "M")
                 .num("pid", p)
                 .obj("args", trace::Event().str("name", name))
                 .text() +
             ",\n" + sort_index(p);
  return p;
}

std::string Timeline::sort_index(int p) {
  return trace::Event()
      .str("name", "process_sort_index")
      .str("ph", "M")
      .num("pid", p)
      .obj("args", trace::Event().num("sort_index", p))
      .text();
}

void Timeline::event(int p, char phase, const char* op, const trace::Event& args) {
  if (!buffer_.empty()) buffer_ += ",\n";
  trace::Event e;
  e.str("ph", std::string(1, phase));
  if (op) e.str("name", op);
  e.num("ts", now_us()).num("pid", p);
  if (phase == 'X') e.num("dur", 0);
  if (!args.empty()) e.obj("args", args);
  buffer_ += e.text();
}

void Timeline::negotiate_start(const std::string& name, const char* kind) {
  State& s = states_[name];
  if (s != State::kNone) return;  // already negotiating (or running): the first start counts
  event(pid(name), 'B', (std::string("NEGOTIATE_") + kind).c_str());
  s = State::kNegotiating;
}

void Timeline::negotiate_rank_ready(const std::string& name, int rank) {
  auto it = states_.find(name);
  if (it == states_.end() || it->second != State::kNegotiating) return;
  event(pid(name), 'X', std::to_string(rank).c_str());
}

void Timeline::negotiate_end(const std::string& name) {
  auto it = states_.find(name);
  if (it == states_.end() || it->second != State::kNegotiating) return;
  event(pid(name), 'E', nullptr);
  states_.erase(it);
}

void Timeline::start(const std::string& name, const char* what, int64_t bytes) {
  negotiate_end(name);
  State& s = states_[name];
  if (s != State::kNone) return;
  trace::Event args;
  if (bytes >= 0) args.num("bytes", bytes);
  event(pid(name), 'B', what, args);
  s = State::kTopLevel;
}

void Timeline::activity_start(const std::string& name, const char* activity) {
  auto it = states_.find(name);
  if (it == states_.end()) return;
  if (it->second == State::kActivity) activity_end(name);
  if (it->second != State::kTopLevel) return;
  event(pid(name), 'B', activity);
  it->second = State::kActivity;
}

void Timeline::activity_end(const std::string& name) {
  auto it = states_.find(name);
  if (it == states_.end() || it->second != State::kActivity) return;
  event(pid(name), 'E', nullptr);
  it->second = State::kTopLevel;
}

void Timeline::end(const std::string& name, const std::string& dtype, const std::string& shape) {
  auto it = states_.find(name);
  if (it == states_.end()) return;
  if (it->second == State::kActivity) activity_end(name);
  if (it->second != State::kTopLevel) return;
  trace::Event args;
  if (!dtype.empty()) args.str("dtype", dtype).str("shape", shape);
  event(pid(name), 'E', nullptr, args);
  states_.erase(it);
}

void Timeline::mark_cycle_start() {
  if (!mark_cycles_) return;
  if (!buffer_.empty()) buffer_ += ",\n";
  buffer_ += trace::Event()
                 .str("ph", "i")
                 .str("name", "CYCLE_START")
                 .num("ts", now_us())
                 .str("s", "g")
                 .text();
}

void Timeline::flush(bool force) {
  if (!file_ || buffer_.empty()) return;
  const auto now = std::chrono::steady_clock::now();
  if (!force && now - last_flush_ < std::chrono::seconds(1)) return;
  last_flush_ = now;
  // The file always ends in "\n]\n": overwrite that tail with the new events and close the
  // array again, so every flush leaves valid JSON.
  std::string text;
  if (first_flush_) {
    text = "[\n";
    first_flush_ = false;
  } else {
    std::fseek(file_, -3, SEEK_END);
    text = ",\n";
  }
  text += buffer_;
  text += "\n]\n";
  buffer_.clear();
  if (std::fwrite(text.data(), 1, text.size(), file_) != text.size() || std::fflush(file_) != 0) {
    const int e = errno;
    std::fprintf(stderr,
                 "[hvd rank 0] HOROVOD_TIMELINE='%s': write failed (%s); the timeline stops here\n",
                 path_.c_str(), std::strerror(e));
    std::fclose(file_);
    file_ = nullptr;
  }
}

}  // namespace dtrain::hvd::detail
