#include "launch/cpu_binding.h"

#include <sched.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <utility>

#include "dtrain/error.h"

namespace dtrain::launch {

namespace {

int parse_cpu(const std::string& flag, const std::string& item, const std::string& text) {
  if (item.empty() || item.size() > 6 ||
      !std::all_of(item.begin(), item.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    throw UsageError(flag + ": '" + text +
                     "' is not a CPU list; expected CPU numbers and ranges "
                     "such as 0-7,16-23");
  }
  return std::stoi(item);
}

// Reads one integer from a sysfs file; -1 when it cannot.
int read_int(const std::string& path) {
  std::ifstream in(path);
  int v = -1;
  if (!(in >> v)) return -1;
  return v;
}

}  // namespace

std::vector<int> parse_cpu_list(const std::string& flag, const std::string& text) {
  std::vector<int> cpus;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t dash = item.find('-');
    int first, last;
    if (dash == std::string::npos) {
      first = last = parse_cpu(flag, item, text);
    } else {
      first = parse_cpu(flag, item.substr(0, dash), text);
      last = parse_cpu(flag, item.substr(dash + 1), text);
      if (last < first) {
        throw UsageError(flag + ": '" + item + "' in '" + text +
                         "' is a range whose end is below its start");
      }
    }
    if (!cpus.empty() && first <= cpus.back()) {
      throw UsageError(flag + ": '" + text +
                       "' repeats or reorders CPUs; give ascending ranges that do not overlap");
    }
    for (int c = first; c <= last; ++c) cpus.push_back(c);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return cpus;
}

std::string cpu_list_string(const std::vector<int>& cpus) {
  std::string s;
  for (int c : cpus) {
    if (!s.empty()) s += ',';
    s += std::to_string(c);
  }
  return s;
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

CpuBinding bind_cores(int nproc, const std::vector<int>& core_list) {
  const std::vector<int> allowed = allowed_cpus();
  CpuBinding b;
  b.cpus.resize(static_cast<size_t>(nproc));
  if (!core_list.empty()) {
    for (int c : core_list) {
      if (!std::binary_search(allowed.begin(), allowed.end(), c)) {
        throw UsageError("--bind-core-list: CPU " + std::to_string(c) +
                         " is not one this node may run on (" + cpu_list_string(allowed) + ")");
      }
    }
    b.cores_per_rank = static_cast<int>(core_list.size()) / nproc;
    if (b.cores_per_rank < 1) {
      throw UsageError("--bind-cores-to-rank: --bind-core-list has " +
                       std::to_string(core_list.size()) + " CPU(s) for " + std::to_string(nproc) +
                       " local ranks; each rank needs at least one");
    }
    for (int r = 0; r < nproc; ++r) {
      b.cpus[static_cast<size_t>(r)].assign(core_list.begin() + r * b.cores_per_rank,
                                            core_list.begin() + (r + 1) * b.cores_per_rank);
    }
    return b;
  }
  // Physical cores in the order of their first logical CPU, each with its logical CPUs.
  std::map<std::pair<int, int>, size_t> index;  // (package, core) -> position in `cores`
  std::vector<std::vector<int>> cores;
  for (int c : allowed) {
    const std::string topo = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/";
    const int package = read_int(topo + "physical_package_id");
    const int core = read_int(topo + "core_id");
    // Without topology (some containers) every logical CPU counts as a core of its own.
    const auto key =
        package < 0 || core < 0 ? std::make_pair(-1, -1 - c) : std::make_pair(package, core);
    auto [it, fresh] = index.emplace(key, cores.size());
    if (fresh) cores.emplace_back();
    cores[it->second].push_back(c);
  }
  b.cores_per_rank = static_cast<int>(cores.size()) / nproc;
  if (b.cores_per_rank < 1) {
    throw UsageError("--bind-cores-to-rank: this node has " + std::to_string(cores.size()) +
                     " physical core(s) for " + std::to_string(nproc) +
                     " local ranks; each rank needs at least one (or give --bind-core-list)");
  }
  for (int r = 0; r < nproc; ++r) {
    auto& mine = b.cpus[static_cast<size_t>(r)];
    for (int k = r * b.cores_per_rank; k < (r + 1) * b.cores_per_rank; ++k)
      mine.insert(mine.end(), cores[static_cast<size_t>(k)].begin(),
                  cores[static_cast<size_t>(k)].end());
    std::sort(mine.begin(), mine.end());
  }
  return b;
}

}  // namespace dtrain::launch
