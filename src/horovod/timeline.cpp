#include "horovod/timeline.h"

#include <cerrno>
#include <cstring>

#include "dtrain/error.h"

namespace dtrain::hvd::detail {

namespace {

// Tensor names are the user's: escaped for a JSON string.
std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

}  // namespace

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
  buffer_ =
      "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"args\": {\"name\": \"horovod\", "
      "\"start_time_since_epoch_in_micros\": " +
      std::to_string(epoch_us) +
      "}},\n{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": 0, \"args\": "
      "{\"sort_index\": 0}}";
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
  buffer_ += "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " + std::to_string(p) +
             ", \"args\": {\"name\": " + json_string(name) +
             "}},\n{\"name\": \"process_sort_index\", \"ph\": \"M\", " +
             "\"pid\": " + std::to_string(p) + ", \"args\": {\"sort_index\": " + std::to_string(p) +
             "}}";
  return p;
}

void Timeline::event(int p, char phase, const char* op, const std::string& args) {
  if (!buffer_.empty()) buffer_ += ",\n";
  buffer_ += "{\"ph\": \"";
  buffer_ += phase;
  buffer_ += '"';
  if (op) {
    buffer_ += ", \"name\": ";
    buffer_ += json_string(op);
  }
  buffer_ += ", \"ts\": " + std::to_string(now_us()) + ", \"pid\": " + std::to_string(p);
  if (phase == 'X') buffer_ += ", \"dur\": 0";
  if (!args.empty()) buffer_ += ", \"args\": {" + args + "}";
  buffer_ += '}';
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
  event(pid(name), 'B', what, bytes >= 0 ? "\"bytes\": " + std::to_string(bytes) : "");
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
  std::string args;
  if (!dtype.empty())
    args = "\"dtype\": " + json_string(dtype) + ", \"shape\": " + json_string(shape);
  event(pid(name), 'E', nullptr, args);
  states_.erase(it);
}

void Timeline::mark_cycle_start() {
  if (!mark_cycles_) return;
  if (!buffer_.empty()) buffer_ += ",\n";
  buffer_ += "{\"ph\": \"i\", \"name\": \"CYCLE_START\", \"ts\": " + std::to_string(now_us()) +
             ", \"s\": \"g\"}";
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
