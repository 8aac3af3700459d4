#include "core/hostfile.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dtrain/error.h"

namespace dtrain {

namespace {

// A host name as ssh and DNS take it: letters, digits, '.', '-', '_', and optionally
// user@ in front; or an IPv4/IPv6 address.
bool valid_host(const std::string& h) {
  if (h.empty() || h.size() > 255 || h.front() == '-') return false;
  return h.find_first_not_of(
             "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_@:") ==
         std::string::npos;
}

int parse_slots(const std::string& where, const std::string& text, const std::string& value) {
  try {
    size_t used = 0;
    long v = std::stol(value, &used);
    if (used == value.size() && v >= 1 && v <= 4096) return static_cast<int>(v);
  } catch (const std::exception&) {
  }
  throw UsageError(where + ": '" + text +
                   "': slots must be a positive integer (like 'node1 slots=2'), got '" + value +
                   "'");
}

void check_duplicates(const std::string& what,
                      const std::vector<std::pair<std::string, int>>& hosts) {
  for (size_t i = 0; i < hosts.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (hosts[i].first == hosts[j].first) {
        throw UsageError(what + ": host '" + hosts[i].first +
                         "' appears twice; give each host once, with slots=N for its workers");
      }
    }
  }
}

}  // namespace

std::vector<std::pair<std::string, int>> parse_hostfile(const std::string& path,
                                                        int default_slots) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw UsageError("--hostfile: '" + path +
                     "' is a directory; give a file with one 'host slots=N' per line");
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    throw UsageError("--hostfile: cannot read '" + path + "': " + std::strerror(errno) +
                     "; give a file with one 'host slots=N' per line");
  }
  // Read whole, up to a bound: a host file of a million hosts is under 64 MiB, and a device
  // such as /dev/zero must not be read forever.
  constexpr size_t kMaxBytes = size_t(64) << 20;
  std::string text;
  char chunk[1 << 16];
  while (file.read(chunk, sizeof chunk) || file.gcount() > 0) {
    text.append(chunk, static_cast<size_t>(file.gcount()));
    if (text.size() > kMaxBytes)
      throw UsageError("--hostfile: '" + path + "' is larger than 64 MiB; give a file with one " +
                       "'host slots=N' per line");
  }
  if (text.find('\0') != std::string::npos)
    throw UsageError("--hostfile: '" + path + "' holds a NUL byte (not a text file); give a file " +
                     "with one 'host slots=N' per line");
  std::istringstream in(text);
  std::vector<std::pair<std::string, int>> hosts;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    std::string text = line;
    auto hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::string host;
    if (!(words >> host)) continue;  // blank or comment
    const std::string where = "--hostfile " + path + " line " + std::to_string(n);
    if (!valid_host(host)) {
      throw UsageError(where + ": '" + text + "': '" + host + "' is not a host name or address");
    }
    int slots = default_slots;
    for (std::string w; words >> w;) {
      auto eq = w.find('=');
      std::string key = w.substr(0, eq);
      if (eq == std::string::npos || (key != "slots" && key != "max_slots" && key != "max-slots")) {
        throw UsageError(where + ": '" + text + "': unexpected '" + w +
                         "'; a line is 'host' or 'host slots=N'");
      }
      if (key == "slots") slots = parse_slots(where, text, w.substr(eq + 1));
    }
    hosts.push_back({host, slots});
  }
  if (hosts.empty()) {
    throw UsageError("--hostfile " + path + ": no hosts in it; write one 'host slots=N' per line");
  }
  check_duplicates("--hostfile " + path, hosts);
  return hosts;
}

std::vector<std::pair<std::string, int>> parse_host_list(const std::string& list,
                                                         int default_slots) {
  std::vector<std::pair<std::string, int>> hosts;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t comma = list.find(',', pos);
    std::string item =
        list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    std::string host = item;
    int slots = default_slots;
    auto colon = item.rfind(':');
    if (colon != std::string::npos && item.find(':') == colon) {  // one colon: host:slots
      host = item.substr(0, colon);
      slots = parse_slots("-H " + list, item, item.substr(colon + 1));
    }
    if (!valid_host(host)) {
      throw UsageError("-H: got '" + list + "': '" + item +
                       "' is not host or host:slots; expected a list like 'node1:2,node2:2'");
    }
    hosts.push_back({host, slots});
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  check_duplicates("-H " + list, hosts);
  return hosts;
}

bool is_loopback_host(const std::string& h) {
  return h == "localhost" || h == "ip6-localhost" || h == "::1" || h.rfind("127.", 0) == 0;
}

bool is_this_host(const std::string& h) { return is_loopback_host(h) || h == this_host_name(); }

std::string this_host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "";
  return name;
}

}  // namespace dtrain
