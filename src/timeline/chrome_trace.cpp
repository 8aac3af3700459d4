#include "timeline/chrome_trace.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "dtrain/error.h"

namespace dtrain::trace {

std::string json_string(std::string_view s) {
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

Event& Event::key(std::string_view k) {
  if (!body_.empty()) body_ += ", ";
  body_ += json_string(k);
  body_ += ": ";
  return *this;
}

Event& Event::str(std::string_view k, std::string_view value) {
  key(k);
  body_ += json_string(value);
  return *this;
}

Event& Event::num(std::string_view k, int64_t value) {
  key(k);
  body_ += std::to_string(value);
  return *this;
}

Event& Event::obj(std::string_view k, const Event& value) {
  key(k);
  body_ += value.text();
  return *this;
}

void write_object_file(const std::string& path, const std::vector<std::string>& events) {
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream f(tmp);
    f << "{\"traceEvents\": [";
    for (size_t i = 0; i < events.size(); ++i) f << (i ? ",\n" : "\n") << events[i];
    f << "\n], \"displayTimeUnit\": \"ms\"}\n";
    f.flush();
    if (!f) throw Error("timeline: cannot write " + tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error("timeline: cannot rename " + tmp + " to " + path + ": " + ec.message());
}

}  // namespace dtrain::trace
