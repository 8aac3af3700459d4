// The failure record and its JSON codec (see failure.h).
#include "launch/failure.h"

#include <signal.h>
#include <string.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>

#include "dtrain/error.h"

namespace dtrain::launch {

using json = nlohmann::json;

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

// PyTorch's @record writes
//   {"message": {"message": "ValueError: ...", "extraInfo": {"py_callstack": "...", ...}}}
std::string readable_error_file(const std::string& contents) {
  try {
    json j = json::parse(contents);
    const json& m = j.at("message");
    if (m.is_string()) return m.get<std::string>();
    std::string out = m.at("message").get<std::string>();
    if (m.contains("extraInfo") && m["extraInfo"].contains("py_callstack")) {
      out += "\n" + m["extraInfo"]["py_callstack"].get<std::string>();
    }
    return out;
  } catch (const std::exception&) {
    return contents;
  }
}

void record_launcher_error(const std::exception& e) {
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (path == nullptr || *path == '\0') return;
  // dtrain's error types by their own names, as Python names an exception's class.
  const char* type = dynamic_cast<const UsageError*>(&e)     ? "UsageError"
                     : dynamic_cast<const TimeoutError*>(&e) ? "TimeoutError"
                     : dynamic_cast<const StoreError*>(&e)   ? "StoreError"
                     : dynamic_cast<const NetworkError*>(&e) ? "NetworkError"
                     : dynamic_cast<const Error*>(&e)        ? "Error"
                                                             : "RuntimeError";
  const std::string message = std::string(type) + ": " + e.what();
  const json data = {
      {"message",
       {{"message", message},
        {"extraInfo",
         {{"py_callstack",
           "dtrain run failed (no Python traceback: the launcher is C++)\n" + message + "\n"},
          {"timestamp", std::to_string(std::time(nullptr))}}}}}};
  std::ofstream out(path, std::ios::trunc);
  out << data.dump();
}

json Failure::to_json() const {
  return {{"time", time},
          {"host", host},
          {"node_rank", node_rank},
          {"rank", rank},
          {"local_rank", local_rank},
          {"pid", pid},
          {"exit_code", exit_code},
          {"signal", signal},
          {"reason", reason},
          {"stderr_tail", stderr_tail},
          {"error_file", error_file},
          {"error_file_contents", error_file_contents},
          {"final", final},
          {"collectives", collectives},
          {"membership", membership}};
}
Failure Failure::from_json(const json& j) {
  Failure f;
  f.time = j.value("time", "");
  f.host = j.value("host", "");
  f.node_rank = j.value("node_rank", 0);
  f.rank = j.value("rank", -1);
  f.local_rank = j.value("local_rank", -1);
  f.pid = j.value("pid", 0);
  f.exit_code = j.value("exit_code", 1);
  f.signal = j.value("signal", 0);
  f.reason = j.value("reason", "");
  f.stderr_tail = j.value("stderr_tail", std::vector<std::string>{});
  f.error_file = j.value("error_file", "");
  f.error_file_contents = j.value("error_file_contents", "");
  f.final = j.value("final", false);
  f.membership = j.value("membership", false);
  f.collectives = j.value("collectives", std::vector<std::string>{});
  return f;
}

std::string Failure::one_line() const {
  std::string s =
      rank >= 0 ? "rank " + std::to_string(rank) + " on " + host : "the agent on " + host;
  s += " (node " + std::to_string(node_rank) + ")";
  if (rank >= 0 && signal > 0) s += " died of " + signal_name(signal);
  if (rank >= 0 && signal == 0) s += " exited";
  if (!reason.empty()) s += ": " + reason;
  return s + ", exit code " + std::to_string(exit_code);
}

std::string Failure::summary(int stderr_lines) const {
  std::ostringstream s;
  s << "dtrain: job failed; root cause (first failure):\n";
  s << "  time       : " << time << "\n";
  s << "  host       : " << host << "\n";
  s << "  node rank  : " << node_rank << "\n";
  if (rank >= 0) {
    s << "  rank       : " << rank << " (local rank " << local_rank << ")\n";
    s << "  pid        : " << pid << "\n";
    if (signal > 0) {
      s << "  signal     : " << signal_name(signal) << " (" << signal << "), exit code "
        << exit_code << "\n";
    } else {
      s << "  exit code  : " << exit_code << "\n";
    }
  }
  if (!reason.empty()) s << "  reason     : " << reason << "\n";
  if (!error_file_contents.empty()) {
    s << "  error file : " << error_file << "\n";
    std::istringstream lines(readable_error_file(error_file_contents));
    for (std::string line; std::getline(lines, line);) s << "    " << line << "\n";
  }
  if (rank >= 0) {
    if (stderr_tail.empty()) {
      s << "  stderr     : (empty)\n";
    } else {
      s << "  last " << std::min<size_t>(stderr_tail.size(), stderr_lines) << " line(s) of rank "
        << rank << "'s stderr:\n";
      for (const auto& l : stderr_tail) s << "    " << l << "\n";
    }
  }
  if (!collectives.empty()) {
    s << "  recent collectives (each rank's flight recorder, as it last published it):\n";
    for (const auto& l : collectives) s << "    " << l << "\n";
  }
  return s.str();
}

std::optional<Failure> Failure::parse(const std::string& text) {
  try {
    json j = json::parse(text);
    if (!j.is_object()) return std::nullopt;
    return from_json(j);
  } catch (const json::exception&) {
    return std::nullopt;
  }
}

std::optional<Failure> Failure::read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream s;
  s << in.rdbuf();
  return parse(s.str());
}

}  // namespace dtrain::launch
