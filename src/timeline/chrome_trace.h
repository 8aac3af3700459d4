// Chrome trace events as text (the Trace Event Format chrome://tracing and Perfetto read): the
// one writer of dtrain's timeline (src/timeline/timeline.cpp, DTRAIN_TIMELINE) and Horovod's
// (src/horovod/timeline.cpp, HOROVOD_TIMELINE, whose bytes stay those Horovod writes).
//
//     trace::Event e;
//     e.str("ph", "X").str("name", span).num("ts", begin).num("dur", end - begin);
//     e.obj("args", trace::Event().num("bytes", n));
//     out += e.text();    // {"ph": "X", "name": "...", "ts": 1, "dur": 2, "args": {"bytes": 3}}
//
// Keys keep the order they were added in; strings are escaped as JSON requires (the names
// are the user's). Thread-safety: an Event is a value; the functions keep no state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::trace {

// `s` as a JSON string: quoted, with ", \ and control characters escaped.
std::string json_string(std::string_view s);

// One JSON object, written as Horovod writes its events: `{"key": value, ...}`.
class Event {
 public:
  Event& str(std::string_view key, std::string_view value);
  Event& num(std::string_view key, int64_t value);
  Event& obj(std::string_view key, const Event& value);
  bool empty() const { return body_.empty(); }
  std::string text() const { return "{" + body_ + "}"; }

 private:
  Event& key(std::string_view k);
  std::string body_;
};

// A whole trace file in the JSON object form: {"traceEvents": [events...], "displayTimeUnit":
// "ms"}, one event per line. Written to `path`.tmp<pid> and renamed, so a reader never sees
// half of one. Throws Error naming the file when it cannot be written.
void write_object_file(const std::string& path, const std::vector<std::string>& events);

}  // namespace dtrain::trace
