// DeepSpeed's worker (see deepspeed_worker.h). Written from reading DeepSpeed 0.19.8's
// deepspeed/launcher/launch.py and deepspeed/utils/numa.py, and psutil 7's cpu_count_cores();
// tests/launcher/deepspeed_launcher_test.cpp compares with the real ones.
#include "launch/deepspeed_worker.h"

#include <linux/mempolicy.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/params.h"
#include "core/paths.h"
#include "dtrain/error.h"
#include "launch/cpu_binding.h"

namespace dtrain::launch {

namespace {

std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) line.pop_back();
  return line;
}

// Linux's CPU list format ("0-3,8"; empty for none) -> {0, 1, 2, 3, 8}; {} when malformed.
std::vector<int> sysfs_cpu_list(const std::string& text) {
  if (text.empty()) return {};
  try {
    return parse_cpu_list("cpulist", text);
  } catch (const UsageError&) {
    return {};
  }
}

bool is_subset(const std::vector<int>& a, const std::vector<int>& b) {
  const std::set<int> sb(b.begin(), b.end());
  return std::all_of(a.begin(), a.end(), [&](int x) { return sb.count(x) > 0; });
}

}  // namespace

std::vector<int> parse_slot_list(const std::string& text,
                                 const std::function<std::string(const std::string&)>& bad) {
  std::vector<int> out;
  std::stringstream ss(text);
  for (std::string s; std::getline(ss, s, ',');) {
    try {
      size_t used = 0;
      const int n = std::stoi(s, &used);
      if (used == s.size()) {
        out.push_back(n);
        continue;
      }
    } catch (const std::exception&) {
    }
    throw UsageError(bad(s));
  }
  return out;
}

std::vector<std::string> ds_exec_args(const DsExec& e) {
  std::string world;
  for (const auto& node : e.world) {
    if (!world.empty()) world += '/';
    world += cpu_list_string(node);
  }
  std::vector<std::string> a = {"--world", world, "--master_port", e.master_port};
  if (e.no_local_rank) a.push_back("--no_local_rank");
  if (e.no_python) {
    a.push_back("--no_python");
  } else {
    if (!e.python.empty()) a.insert(a.end(), {"--python", e.python});
    if (e.module) a.push_back("--module");
  }
  std::string drop;
  for (const auto& n : e.drop) drop += (drop.empty() ? "" : ",") + n;
  a.insert(a.end(), {"--drop", drop});
  if (!e.rank_log.empty()) a.insert(a.end(), {"--rank_log", e.rank_log});
  if (e.bind_cores) a.push_back("--bind_cores_to_rank");
  if (!e.bind_core_list.empty()) a.insert(a.end(), {"--bind_core_list", e.bind_core_list});
  a.push_back("--");
  a.push_back(e.program);
  a.insert(a.end(), e.args.begin(), e.args.end());
  return a;
}

DsExec parse_ds_exec(const std::vector<std::string>& args) {
  DsExec e;
  std::string world;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      ++i;
      break;
    }
    auto value = [&]() {
      if (i + 1 >= args.size()) throw UsageError(a + " needs a value");
      return args[++i];
    };
    if (a == "--world") {
      world = value();
    } else if (a == "--master_port") {
      e.master_port = value();
    } else if (a == "--python") {
      e.python = value();
    } else if (a == "--drop") {
      std::stringstream ss(value());
      for (std::string n; std::getline(ss, n, ',');)
        if (!n.empty()) e.drop.push_back(n);
    } else if (a == "--rank_log") {
      e.rank_log = value();
    } else if (a == "--bind_core_list") {
      e.bind_core_list = value();
    } else if (a == "--no_local_rank") {
      e.no_local_rank = true;
    } else if (a == "--module") {
      e.module = true;
    } else if (a == "--no_python") {
      e.no_python = true;
    } else if (a == "--bind_cores_to_rank") {
      e.bind_cores = true;
    } else {
      throw UsageError("unknown option '" + a + "'");
    }
  }
  if (i >= args.size() || world.empty()) throw UsageError("missing --world or PROGRAM");
  std::stringstream ss(world);
  for (std::string n; std::getline(ss, n, '/');)
    e.world.push_back(parse_slot_list(
        n, [&](const std::string& s) { return "bad number '" + s + "' in " + world; }));
  e.program = args[i];
  e.args.assign(args.begin() + static_cast<long>(i) + 1, args.end());
  return e;
}

std::optional<DsExec> deepspeed_shim_of(const LaunchOptions& o) {
  if (o.args.empty() || o.args[0] != "deepspeed-exec") return std::nullopt;
  const auto self = read_self_exe();
  if (!self || self->deleted) return std::nullopt;
  std::error_code ec1, ec2;
  const auto a = std::filesystem::canonical(o.program, ec1);
  const auto b = std::filesystem::canonical(self->path, ec2);
  if (ec1 || ec2 || a != b) return std::nullopt;
  try {
    return parse_ds_exec(std::vector<std::string>(o.args.begin() + 1, o.args.end()));
  } catch (const UsageError&) {
    return std::nullopt;  // the shim says what is wrong when it runs
  }
}

std::vector<std::string> DsNumactl::command() const {
  std::vector<std::string> c = {"numactl"};
  if (mem_flag != 0) c.insert(c.end(), {std::string("-") + mem_flag, cpu_list_string(mem_nodes)});
  // numa.py's -C list: runs of consecutive CPUs as FIRST-LAST.
  std::string list;
  for (size_t k = 0; k < cpus.size();) {
    size_t end = k;
    while (end + 1 < cpus.size() && cpus[end + 1] == cpus[end] + 1) ++end;
    if (!list.empty()) list += ',';
    list += std::to_string(cpus[k]);
    if (end > k) {
      list += '-';
      list += std::to_string(cpus[end]);
    }
    k = end + 1;
  }
  c.insert(c.end(), {"-C", list});
  return c;
}

DsNumactl ds_numactl(const std::string& bind_core_list, int num_local_procs, int local_rank,
                     const std::vector<std::vector<int>>& numa_cores, int physical_cores) {
  std::vector<int> cores;
  if (!bind_core_list.empty()) {
    cores = parse_cpu_list("--bind_core_list", bind_core_list);
  } else {
    if (physical_cores <= 0)
      throw UsageError(
          "--bind_cores_to_rank: cannot count this machine's physical cores (no "
          "/sys/devices/system/cpu/cpu*/topology, no 'cpu cores' in /proc/cpuinfo); give "
          "--bind_core_list");
    for (int c = 0; c < physical_cores; ++c) cores.push_back(c);
  }
  DsNumactl b;
  b.cores_per_rank = static_cast<int>(cores.size()) / std::max(num_local_procs, 1);
  if (b.cores_per_rank < 1)
    throw UsageError("--bind_cores_to_rank: At least one core needs to be assigned to each rank (" +
                     std::to_string(cores.size()) + " core(s) for " +
                     std::to_string(num_local_procs) +
                     " local ranks); give a longer --bind_core_list or fewer slots");
  const size_t first = static_cast<size_t>(b.cores_per_rank) * static_cast<size_t>(local_rank);
  for (size_t k = first; k < first + static_cast<size_t>(b.cores_per_rank) && k < cores.size(); ++k)
    b.cpus.push_back(cores[k]);

  // numa.py's three modes: memory-only nodes as many as nodes with CPUs is flat HBM (-p the
  // twin); nodes listing the same CPUs as the one before are fake NUMA (-m all copies); else -m
  // the node holding every CPU of the rank.
  std::vector<int> empty, non_empty;
  std::vector<std::vector<int>> fake_groups;
  std::vector<int> group;
  const std::vector<int>* previous = nullptr;
  static const std::vector<int> none;
  for (size_t i = 0; i < numa_cores.size(); ++i) {
    const int node = static_cast<int>(i);
    if (numa_cores[i].empty()) {
      empty.push_back(node);
    } else {
      non_empty.push_back(node);
      if (numa_cores[i] == (previous ? *previous : none)) {
        if (group.empty()) group.push_back(node - 1);
        group.push_back(node);
      } else if (!group.empty()) {
        fake_groups.push_back(group);
        group.clear();
      }
    }
    previous = &numa_cores[i];
  }
  if (!group.empty()) fake_groups.push_back(group);
  const bool flat_hbm = !empty.empty() && empty.size() == non_empty.size();
  for (size_t i = 0; i < numa_cores.size(); ++i) {
    if (!is_subset(b.cpus, numa_cores[i])) continue;
    const int node = static_cast<int>(i);
    if (flat_hbm) {
      const auto at = std::find(non_empty.begin(), non_empty.end(), node);
      if (at == non_empty.end()) continue;  // an empty node: numa.py's dict has no entry
      b.mem_flag = 'p';
      b.mem_nodes = {empty[static_cast<size_t>(at - non_empty.begin())]};
      break;
    }
    if (!fake_groups.empty()) {
      const auto g = std::find_if(fake_groups.begin(), fake_groups.end(), [&](const auto& nodes) {
        return std::find(nodes.begin(), nodes.end(), node) != nodes.end();
      });
      if (g == fake_groups.end()) continue;
      b.mem_flag = 'm';
      b.mem_nodes = *g;
      break;
    }
    b.mem_flag = 'm';
    b.mem_nodes = {node};
    break;
  }
  return b;
}

std::vector<std::vector<int>> numa_node_cpus() {
  // numactl --hardware: "available: N nodes", then "node K cpus: ..." for each; numa.py reads
  // nodes 0..N-1 in turn (a number with no node adds nothing).
  const std::string root = "/sys/devices/system/node";
  int count = 0;
  std::error_code ec;
  for (const auto& d : std::filesystem::directory_iterator(root, ec)) {
    const std::string name = d.path().filename().string();
    if (name.size() > 4 && name.rfind("node", 0) == 0 &&
        name.find_first_not_of("0123456789", 4) == std::string::npos)
      ++count;
  }
  std::vector<std::vector<int>> nodes;
  for (int k = 0; k < count; ++k) {
    const std::string dir = root + "/node" + std::to_string(k);
    if (!std::filesystem::exists(dir)) continue;
    nodes.push_back(sysfs_cpu_list(read_line(dir + "/cpulist")));
  }
  return nodes;
}

int physical_core_count() {
  std::set<std::string> cores;
  for (const char* file : {"core_cpus_list", "thread_siblings_list"}) {
    std::error_code ec;
    for (const auto& d : std::filesystem::directory_iterator("/sys/devices/system/cpu", ec)) {
      const std::string name = d.path().filename().string();
      if (name.size() < 4 || name.rfind("cpu", 0) != 0 || !std::isdigit(name[3])) continue;
      const auto path = d.path() / "topology" / file;
      if (std::filesystem::exists(path)) cores.insert(read_line(path.string()));
    }
    if (!cores.empty()) return static_cast<int>(cores.size());
  }
  // /proc/cpuinfo: "cpu cores" of each "physical id", summed.
  std::ifstream in("/proc/cpuinfo");
  std::map<std::string, int> per_package;
  std::string id;
  int count = -1;
  auto section_end = [&]() {
    if (!id.empty() && count >= 0) per_package[id] = count;
    id.clear();
    count = -1;
  };
  for (std::string line; std::getline(in, line);) {
    if (line.find_first_not_of(" \t") == std::string::npos) {
      section_end();
      continue;
    }
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    const std::string value = line.substr(colon + 1);
    if (key == "physical id") id = value;
    if (key == "cpu cores") count = std::atoi(value.c_str());
  }
  section_end();
  int total = 0;
  for (auto& [k, n] : per_package) total += n;
  return total;
}

int DsNumactl::mem_policy() const {
  if (mem_flag == 0) return 0;
  return mem_flag == 'p' ? MPOL_PREFERRED : MPOL_BIND;
}

bool apply_numactl(const DsNumactl& b) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : b.cpus) {
    if (c < 0 || c >= CPU_SETSIZE) {
      errno = EINVAL;
      return false;
    }
    CPU_SET(c, &set);
  }
  if (::sched_setaffinity(0, sizeof set, &set) != 0) return false;
  if (b.mem_flag == 0) return true;
  constexpr int kBits = 8 * sizeof(unsigned long);
  unsigned long mask[1024 / kBits] = {};
  for (int n : b.mem_nodes) {
    if (n < 0 || n >= 1024) {
      errno = EINVAL;
      return false;
    }
    mask[n / kBits] |= 1UL << (n % kBits);
  }
  return ::syscall(SYS_set_mempolicy, b.mem_policy(), mask, 1024UL + 1) == 0;
}

DsWorker ds_worker(const DsExec& e, int node, int position) {
  if (node < 0 || node >= static_cast<int>(e.world.size()) || position < 0 ||
      position >= static_cast<int>(e.world[static_cast<size_t>(node)].size()))
    throw UsageError("node " + std::to_string(node) + " / local position " +
                     std::to_string(position) + " do not fit the world");
  DsWorker w;
  // DeepSpeed's numbering: ranks in node order, each node's slots in turn.
  w.rank = position;
  for (int n = 0; n < node; ++n) w.rank += static_cast<int>(e.world[static_cast<size_t>(n)].size());
  const int local_size = static_cast<int>(e.world[static_cast<size_t>(node)].size());
  // As launch.py: RANK % LOCAL_SIZE, not the position on the host. The two differ where the
  // hosts before this one hold a number of slots that is not a multiple of this host's (hosts
  // of 2 and 3 slots: ranks 2,3,4 on the second get LOCAL_RANK 2,0,1).
  w.local_rank = w.rank % local_size;
  if (e.bind_cores)
    w.binding = ds_numactl(e.bind_core_list, local_size, w.local_rank, numa_node_cpus(),
                           physical_core_count());
  if (!e.no_python) {
    w.argv = {e.python.empty() ? param::kPython.get() : e.python, "-u"};
    if (e.module) w.argv.push_back("-m");
  }
  w.argv.push_back(e.program);
  if (!e.no_local_rank) w.argv.push_back("--local_rank=" + std::to_string(w.local_rank));
  w.argv.insert(w.argv.end(), e.args.begin(), e.args.end());
  if (!e.rank_log.empty()) w.log_path = e.rank_log + "_rank" + std::to_string(w.rank) + ".log";
  return w;
}

std::vector<std::string> ds_worker_env(const std::vector<std::string>& env, const DsExec& e,
                                       int node, const DsWorker& w) {
  const std::set<std::string> drop(e.drop.begin(), e.drop.end());
  std::vector<std::pair<std::string, std::string>> vars;
  int world_size = 0;
  for (const auto& n : e.world) world_size += static_cast<int>(n.size());
  const auto& mine = e.world[static_cast<size_t>(node)];
  vars = {
      {"CUDA_VISIBLE_DEVICES", cpu_list_string(mine)},
      {"MASTER_PORT", e.master_port},
      {"WORLD_SIZE", std::to_string(world_size)},
      {"CROSS_RANK", std::to_string(node)},
      {"CROSS_SIZE", std::to_string(e.world.size())},
      {"LOCAL_SIZE", std::to_string(mine.size())},
      {"RANK", std::to_string(w.rank)},
      {"LOCAL_RANK", std::to_string(w.local_rank)},
  };
  // As launch.py with --bind_cores_to_rank: the share's size, over what the shell set.
  if (w.binding) vars.emplace_back("OMP_NUM_THREADS", std::to_string(w.binding->cores_per_rank));
  std::vector<std::string> out;
  for (const auto& kv : env) {
    const std::string name = kv.substr(0, kv.find('='));
    if (drop.count(name)) continue;
    if (std::any_of(vars.begin(), vars.end(), [&](auto& v) { return v.first == name; })) continue;
    out.push_back(kv);
  }
  for (const auto& [k, v] : vars) out.push_back(k + "=" + v);
  return out;
}

}  // namespace dtrain::launch
