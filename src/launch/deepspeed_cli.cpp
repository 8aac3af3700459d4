// `dtrain deepspeed` and `dtrain deepspeed-exec` (see deepspeed_cli.h). Written from reading
// DeepSpeed 0.19.8's deepspeed/launcher/{runner,launch}.py; the behaviour it matches and where
// it deliberately differs is listed in docs/deepspeed_launcher.md.
#include "launch/deepspeed_cli.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "core/hostfile.h"
#include "core/params.h"
#include "core/paths.h"
#include "dtrain/env.h"
#include "dtrain/error.h"
#include "dtrain/launch.h"
#include "launch/cpu_binding.h"
#include "launch/deepspeed_worker.h"
#include "launch/gpus.h"
#include "launch/options_internal.h"
#include "launch/worker_process.h"

extern char** environ;

namespace dtrain::launch {

namespace {

const char* kUsage =
    "usage: dtrain deepspeed [-H HOSTFILE] [-i INCLUDE | -e EXCLUDE] [--num_nodes N]\n"
    "                        [--num_gpus N | --num_accelerators N] [--master_port P]\n"
    "                        [--master_addr A] [--no_ssh --node_rank K] [--launcher ssh|pdsh]\n"
    "                        [--ssh_port P] [--ssh-identity FILE] [--ssh-arg ARG]...\n"
    "                        [--module | --no_python] [--no_local_rank]\n"
    "                        [--save_pid] [--enable_each_rank_log DIR] [--bind_cores_to_rank]\n"
    "                        [--bind_core_list LIST] [--force_multi] [--no_ssh_check]\n"
    "                        [--log_level L] [-q] [--start-method auto|spawn|forkserver]\n"
    "                        PROGRAM [ARGS...]\n"
    "  DeepSpeed's `deepspeed` launcher on dtrain's: workers get RANK, LOCAL_RANK, WORLD_SIZE,\n"
    "  LOCAL_SIZE, CROSS_RANK, CROSS_SIZE, MASTER_ADDR, MASTER_PORT, CUDA_VISIBLE_DEVICES and\n"
    "  --local_rank=N, as DeepSpeed gives them. PROGRAM runs under python unless --no_python\n"
    "  or it is a compiled executable. Hosts of a hostfile (default /job/hostfile) start over\n"
    "  ssh. A libtorch program's workers are forked from one loaded copy, as under `dtrain run`\n"
    "  (--start-method spawn: each loads its libraries itself). Details:\n"
    "  docs/deepspeed_launcher.md.\n";

constexpr const char* kDefaultHostfile = "/job/hostfile";  // DeepSpeed's DLTS_HOSTFILE

int parse_int(const std::string& flag, const std::string& v) {
  try {
    size_t used = 0;
    long n = std::stol(v, &used);
    if (used == v.size() && n >= INT_MIN && n <= INT_MAX) return static_cast<int>(n);
  } catch (const std::exception&) {
  }
  throw UsageError(flag + ": got '" + v + "', expected an integer");
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// The node's accelerators, as DeepSpeed counts them: the GPUs when there are any, else (its
// CPU accelerator) the NUMA nodes that have CPUs, at least 1.
int local_device_count(std::string* how) {
  GpuCount g = count_gpus();
  if (g.count > 0) {
    *how = std::to_string(g.count) + " GPU(s) (" + g.how + ")";
    return g.count;
  }
  int numa = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/sys/devices/system/node", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("node", 0) != 0 || name.size() == 4 ||
        name.find_first_not_of("0123456789", 4) != std::string::npos)
      continue;
    std::ifstream in(e.path() / "cpulist");
    std::string list;
    std::getline(in, list);
    if (!trim(list).empty()) ++numa;
  }
  *how = "no GPU; " + std::to_string(std::max(numa, 1)) + " NUMA node(s) with CPUs";
  return std::max(numa, 1);
}

bool is_elf(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && std::memcmp(magic,
                                         "\x7f"
                                         "ELF",
                                         4) == 0;
}

// Variables the agent gives every worker that DeepSpeed's launch.py does not: the shim
// removes those the user's own environment did not hold.
const std::vector<std::string>& torchrun_only_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    const std::set<std::string> deepspeeds = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR",
                                              "MASTER_PORT"};
    for (auto& [k, v] : WorkerEnv{}.to_variables())
      if (!deepspeeds.count(k)) n.push_back(k);
    for (const char* k : {"TORCHELASTIC_SIGNALS_TO_HANDLE", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                          "OMP_NUM_THREADS", "JE_ARROW_MALLOC_CONF", "DTRAIN_BIND_CPUS"})
      n.push_back(k);
    return n;
  }();
  return names;
}

}  // namespace

std::vector<std::pair<std::string, int>> parse_ds_hostfile(const std::vector<std::string>& lines) {
  // DeepSpeed's pattern: a name, white space, slots=DIGITS; the rest of the line is ignored.
  static const std::regex pattern(R"(^(\S+)\s+slots=(\d+))");
  std::vector<std::pair<std::string, int>> pool;
  for (const auto& raw : lines) {
    const std::string line = trim(raw);
    if (line.empty() || line[0] == '#') continue;
    std::smatch m;
    if (!std::regex_search(line, m, pattern)) {
      throw UsageError("Hostfile contains a bad entry: " + line +
                       ", unable to proceed with launching (expected 'HOST slots=N')");
    }
    const std::string host = m[1];
    for (auto& [h, n] : pool) {
      if (h == host)
        throw UsageError("Hostfile contains multiple entries for " + host +
                         ", unable to proceed with launching");
    }
    int slots = 0;
    try {
      slots = std::stoi(m[2]);
    } catch (const std::exception&) {
      throw UsageError("Hostfile contains a bad entry: " + line +
                       ", unable to proceed with launching (slots out of range)");
    }
    pool.emplace_back(host, slots);
  }
  if (pool.empty())
    throw UsageError(
        "Hostfile is empty or not formatted correctly, unable to proceed with launching.");
  return pool;
}

std::vector<DsHost> ds_resource_filter(const std::vector<std::pair<std::string, int>>& pool,
                                       const std::string& include, const std::string& exclude) {
  std::vector<DsHost> all;
  for (auto& [h, n] : pool) {
    DsHost d{h, {}};
    for (int i = 0; i < n; ++i) d.slots.push_back(i);
    all.push_back(d);
  }
  if (!include.empty() && !exclude.empty())
    throw UsageError("--include and --exclude are mutually exclusive; give one of them");
  if (include.empty() && exclude.empty()) return all;
  const std::string& spec = include.empty() ? exclude : include;
  // NODE_SPEC@NODE_SPEC...: slots of one host named twice are merged, sorted, deduplicated.
  std::vector<std::pair<std::string, std::set<int>>> nodes;
  std::set<std::string> whole;  // hosts named without slots
  std::stringstream ss(spec);
  for (std::string node; std::getline(ss, node, '@');) {
    std::string host = node, slot_list;
    const auto colon = node.find(':');
    if (colon != std::string::npos) {
      if (node.find(':', colon + 1) != std::string::npos)
        throw UsageError("bad node '" + node + "' in '" + spec +
                         "': expected NAME[:SLOT[,SLOT...]] with one ':'");
      host = node.substr(0, colon);
      slot_list = node.substr(colon + 1);
    }
    auto it = std::find_if(nodes.begin(), nodes.end(), [&](auto& p) { return p.first == host; });
    if (it == nodes.end()) {
      nodes.push_back({host, {}});
      it = nodes.end() - 1;
    }
    if (colon == std::string::npos) {
      whole.insert(host);
    } else {
      const auto slots = parse_slot_list(slot_list, [&](const std::string& bad) {
        return "bad slot '" + bad + "' in '" + spec +
               "': expected NAME[:SLOT[,SLOT...]][@NAME...] with integer slots";
      });
      it->second.insert(slots.begin(), slots.end());
    }
  }
  auto find_host = [&](const std::string& host) -> const DsHost& {
    for (auto& d : all)
      if (d.name == host) return d;
    throw UsageError("Hostname '" + host + "' not found in hostfile (--" +
                     (include.empty() ? "exclude" : "include") + " " + spec + ")");
  };
  std::map<std::string, std::vector<int>> chosen;
  if (!exclude.empty())
    for (auto& d : all) chosen[d.name] = d.slots;
  for (auto& [host, slots] : nodes) {
    const DsHost& d = find_host(host);
    // As DeepSpeed: a host named once with slots and once without counts as named with them.
    if (!slots.empty()) {
      for (int s : slots) {
        if (std::find(d.slots.begin(), d.slots.end(), s) == d.slots.end())
          throw UsageError(
              "No slot '" + std::to_string(s) + "' specified on host '" + host +
              "' (its slots: " + (d.slots.empty() ? "none" : cpu_list_string(d.slots)) + ")");
      }
      if (!include.empty()) {
        chosen[host].assign(slots.begin(), slots.end());
      } else {
        auto& v = chosen[host];
        for (int s : slots) v.erase(std::remove(v.begin(), v.end(), s), v.end());
      }
    } else {
      chosen[host] = include.empty() ? std::vector<int>{} : d.slots;
    }
  }
  std::vector<DsHost> out;
  for (auto& d : all) {
    auto it = chosen.find(d.name);
    if (it != chosen.end() && !it->second.empty()) out.push_back({d.name, it->second});
  }
  return out;
}

int deepspeed_main(const std::vector<std::string>& args) {
  std::string save_pid_file;
  try {
    std::string hostfile = kDefaultHostfile, include, exclude, master_addr, launcher = "pdsh";
    std::string rank_log_dir, bind_core_list, launcher_args, venv_script, autotuning;
    bool hostfile_given = false, module = false, no_python = false, no_local_rank = false;
    bool no_ssh = false, force_multi = false, save_pid = false, bind_cores = false;
    std::string ssh_identity, start_method = "auto";
    std::vector<std::string> ssh_args;
    // `--flag=` (argparse's empty string) for flags where DeepSpeed goes on with "" and what it
    // means depends on the job: checked once the job is known.
    bool empty_launcher = false, empty_venv_script = false, empty_bind_core_list = false;
    int num_nodes = -1, num_gpus = -1, master_port = 29500, node_rank = -1, ssh_port = -1;
    size_t i = 0;
    for (; i < args.size(); ++i) {
      std::string a = args[i], inline_value;
      bool has_inline = false;
      // `--flag=VALUE`, and as argparse also `-H=VALUE` (a short flag's value after "=").
      const bool short_inline = a.size() >= 3 && a[0] == '-' && a[1] != '-' && a[2] == '=';
      if ((a.rfind("--", 0) == 0 && a.find('=') != std::string::npos) || short_inline) {
        inline_value = a.substr(a.find('=') + 1);
        a = a.substr(0, a.find('='));
        has_inline = true;
      }
      auto value = [&]() -> std::string {
        if (has_inline) return inline_value;
        if (i + 1 >= args.size()) throw UsageError(a + " needs a value");
        return args[++i];
      };
      auto no_value = [&]() {
        if (has_inline) throw UsageError(a + " takes no value (got '" + inline_value + "')");
      };
      if (a == "-h" || a == "--help") {
        std::cout << kUsage;
        return 0;
      }
      if (a == "--") {
        ++i;
        break;
      }
      if (a.empty() || a[0] != '-') break;  // PROGRAM
      // dtrain's own flags have no DeepSpeed to follow: an empty value is an error.
      if (has_inline && inline_value.empty() &&
          (a == "--start-method" || a == "--start_method" || a == "--ssh-identity" ||
           a == "--ssh-arg"))
        throw UsageError(a + "=: an empty value; give one (" + a + "=VALUE) or leave the flag out");
      if (a == "-H" || a == "--hostfile") {
        hostfile = value();
        // DeepSpeed finds no file at "" and runs on this node's devices, as without -H.
        hostfile_given = !hostfile.empty();
        if (hostfile.empty()) hostfile = kDefaultHostfile;
      } else if (a == "-i" || a == "--include") {
        include = value();
      } else if (a == "-e" || a == "--exclude") {
        exclude = value();
      } else if (a == "--num_nodes") {
        num_nodes = parse_int(a, value());
      } else if (a == "--num_gpus" || a == "--num_accelerators") {
        num_gpus = parse_int(a, value());
      } else if (a == "--master_port") {
        master_port = parse_int(a, value());
        if (master_port < 1 || master_port > 65534)
          throw UsageError(a + ": got '" + std::to_string(master_port) +
                           "', expected a port 1..65534");
      } else if (a == "--master_addr") {
        master_addr = value();
      } else if (a == "--node_rank") {
        node_rank = parse_int(a, value());
      } else if (a == "--launcher") {
        launcher = value();
        empty_launcher = launcher.empty();
      } else if (a == "--launcher_args") {
        launcher_args = value();
      } else if (a == "--module") {
        no_value();
        module = true;
      } else if (a == "--no_python") {
        no_value();
        no_python = true;
      } else if (a == "--no_local_rank") {
        no_value();
        no_local_rank = true;
      } else if (a == "--no_ssh") {
        no_value();
        no_ssh = true;
      } else if (a == "--no_ssh_check") {
        no_value();  // dtrain's ssh engine checks every host as it starts its agent
      } else if (a == "--force_multi") {
        no_value();
        force_multi = true;
      } else if (a == "--save_pid") {
        no_value();
        save_pid = true;
      } else if (a == "--enable_each_rank_log") {
        rank_log_dir = value();
        if (rank_log_dir == "None") rank_log_dir.clear();  // DeepSpeed's "off"
      } else if (a == "--autotuning") {
        autotuning = value();
        if (autotuning.empty())  // argparse's choices: DeepSpeed stops on it too
          throw UsageError(
              "--autotuning=: an empty value; DeepSpeed takes tune or run (and "
              "dtrain deepspeed neither: leave the flag out)");
      } else if (a == "--bind_cores_to_rank") {
        no_value();
        bind_cores = true;
      } else if (a == "--bind_core_list") {
        bind_core_list = value();
        empty_bind_core_list = bind_core_list.empty();
      } else if (a == "--ssh_port") {
        ssh_port = parse_int(a, value());
      } else if (a == "--start-method" || a == "--start_method") {  // dtrain's, as `dtrain run`'s
        start_method = value();
      } else if (a == "--ssh-identity") {  // dtrain's, as `dtrain run --ssh-identity`
        ssh_identity = value();
      } else if (a == "--ssh-arg") {  // dtrain's, as `dtrain run --ssh-arg` (repeatable)
        ssh_args.push_back(value());
      } else if (a == "--venv_script") {
        venv_script = value();
        empty_venv_script = venv_script.empty();
      } else if (a == "--log_level") {
        const std::string l = value();
        if (l != "debug" && l != "info" && l != "warning" && l != "error" && l != "critical")
          throw UsageError("--log_level: got '" + l +
                           "', expected debug, info, warning, error or critical");
      } else if (a == "-q" || a == "--quiet") {
        no_value();
      } else {
        throw UsageError("unknown option '" + a + "'");
      }
    }
    if (i >= args.size())
      throw UsageError(
          "missing PROGRAM: give the training script (or program) and its arguments after the "
          "flags");
    const std::string program = args[i];
    const std::vector<std::string> user_args(args.begin() + static_cast<long>(i) + 1, args.end());

    // Flags with no meaning on dtrain's launcher: named, never ignored.
    if (!autotuning.empty())
      throw UsageError("--autotuning " + autotuning +
                       ": DeepSpeed's autotuner is not part of dtrain deepspeed; run it with "
                       "DeepSpeed's own launcher, then start the tuned config here");
    std::string l = launcher;
    std::transform(l.begin(), l.end(), l.begin(), ::tolower);
    if (l != "pdsh" && l != "ssh" && !empty_launcher)
      throw UsageError("--launcher " + launcher +
                       ": dtrain deepspeed starts other nodes over ssh only (pdsh and ssh mean "
                       "the same here); for Slurm or MPI run `srun/mpirun dtrain run` "
                       "(docs/clusters.md)");
    if (!launcher_args.empty())
      throw UsageError(
          "--launcher_args: pdsh's arguments do not apply to dtrain's ssh engine; "
          "use `dtrain run --ssh-arg` for ssh options, or drop the flag");
    if (!venv_script.empty())
      throw UsageError(
          "--venv_script: not supported; activate the environment in the hosts' "
          "shell profile, or set DTRAIN_PYTHON to the environment's python");
    if (module && no_python)
      throw UsageError(
          "Don't use both the '--no_python' flag and the '--module' flag at the same time.");
    if (node_rank >= 0 && !no_ssh)
      throw UsageError("--node_rank " + std::to_string(node_rank) +
                       " is only read with --no_ssh (this node of a job started by hand on "
                       "each node); add --no_ssh");

    // The resource pool: the hostfile, else this node's devices.
    std::vector<std::pair<std::string, int>> pool;
    if (std::filesystem::is_regular_file(hostfile)) {
      std::ifstream in(hostfile);
      std::vector<std::string> lines;
      for (std::string line; std::getline(in, line);) lines.push_back(line);
      try {
        pool = parse_ds_hostfile(lines);
      } catch (const UsageError& e) {
        throw UsageError("-H " + hostfile + ": " + e.what());
      }
    } else if (hostfile_given) {
      throw UsageError("-H " + hostfile +
                       ": no such file; give an existing hostfile ('HOST slots=N' lines), or "
                       "drop -H to run on this node's devices");
    }
    // As DeepSpeed: one node without filters runs on the devices CUDA_VISIBLE_DEVICES lists;
    // the workers get the list from --include, not from the launcher's environment.
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    if (pool.empty() && visible && *visible) {
      if (!include.empty() || !exclude.empty() || num_nodes > 1 || num_gpus > 0) {
        std::cerr << "dtrain deepspeed: note: ignoring CUDA_VISIBLE_DEVICES=" << visible
                  << " because --include/--exclude/--num_gpus/--num_nodes was given\n";
      } else {
        include = std::string("localhost:") + visible;
      }
      ::unsetenv("CUDA_VISIBLE_DEVICES");
    }
    if ((num_nodes >= 0 || num_gpus >= 0) && (!include.empty() || !exclude.empty()))
      throw UsageError(
          "Cannot specify num_nodes/gpus with include/exclude: drop --num_nodes/--num_gpus or "
          "--include/--exclude");
    const bool local_pool = pool.empty();
    std::string how;  // how this node's slots were counted, without a hostfile
    if (local_pool) {
      pool.emplace_back("localhost", local_device_count(&how));
      master_addr = "127.0.0.1";  // DeepSpeed's, whatever --master_addr said
      if (num_nodes > 1)
        throw UsageError(
            "Num nodes is >1 but no extra nodes available via hostfile: give -H "
            "HOSTFILE or drop --num_nodes");
    }
    std::vector<DsHost> active;
    try {
      active = ds_resource_filter(pool, include, exclude);
    } catch (const UsageError& e) {
      if (!local_pool) throw;
      throw UsageError(std::string(e.what()) +
                       "; without a hostfile this node has one slot per device, as DeepSpeed "
                       "counts them (here " +
                       how +
                       "): list more in a hostfile ('localhost slots=N') or use --num_gpus N");
    }
    if (num_nodes > 0 && static_cast<int>(active.size()) > num_nodes) active.resize(num_nodes);
    if (num_gpus > 0) {
      for (auto& h : active) {
        h.slots.clear();
        for (int s = 0; s < num_gpus; ++s) h.slots.push_back(s);
      }
    }
    if (active.empty())
      throw UsageError("--include/--exclude left no slot on any host; keep at least one");
    if (no_ssh && (node_rank < 0 || node_rank >= static_cast<int>(active.size())))
      throw UsageError(
          "Launching training without ssh, but --node_rank is not set correctly: "
          "give --node_rank 0.." +
          std::to_string(active.size() - 1) + " (the hosts after filtering)");
    const bool multi_node = (force_multi || active.size() > 1) && !no_ssh;
    // As DeepSpeed with `--flag=`: one node runs without a launcher or a venv script; across
    // nodes its runner stops on an unknown launcher "" and pdsh on `source ;`.
    if (multi_node && empty_launcher)
      throw UsageError(
          "--launcher=: an empty launcher name; give --launcher pdsh (or ssh) to start other "
          "nodes, or leave the flag out");
    if (multi_node && empty_venv_script)
      throw UsageError(
          "--venv_script=: an empty script to source on every node; leave the flag out");
    if (bind_cores && empty_bind_core_list)
      throw UsageError(
          "--bind_core_list=: an empty core list (DeepSpeed: \"Bad range: '', range must be "
          "either a number or two number separated by dash\"); give cores such as 0-7 or "
          "leave the flag out");
    if (bind_cores) {
      // DeepSpeed's launch.py checks these on each node before it starts a worker.
      if (std::getenv("KMP_AFFINITY"))
        throw UsageError(
            "Environment variable KMP_AFFINITY conflicts with numactl because it interfere with "
            "how many CPU cores numactl can set. Unset KMP_AFFINITY before launching deepspeed "
            "(--bind_cores_to_rank)");
      // This node's ranks, when they run here (other hosts check their own as they start).
      if (!multi_node) {
        const auto& here = active[static_cast<size_t>(no_ssh ? node_rank : 0)].slots;
        const auto numa = numa_node_cpus();
        const int cores = physical_core_count();
        for (size_t lr = 0; lr < here.size(); ++lr)
          ds_numactl(bind_core_list, static_cast<int>(here.size()), static_cast<int>(lr), numa,
                     cores);
      } else if (!bind_core_list.empty()) {
        parse_cpu_list("--bind_core_list", bind_core_list);
      }
    }

    // What to run: python -u [-m] SCRIPT, or PROGRAM itself.
    LaunchOptions check;
    check.program = program;
    check.module = module;
    check.no_python = no_python || (!module && is_elf(program));
    check.run_path = !check.no_python && !module;  // DeepSpeed runs any script with python
    check.start_method = start_method == "fork" ? "forkserver" : start_method;
    validate_launch_options(check);

    if (!rank_log_dir.empty()) {
      if (std::filesystem::is_regular_file(rank_log_dir))
        throw UsageError("--enable_each_rank_log " + rank_log_dir +
                         " should not be a file, it should be a directory.");
      std::error_code ec;
      std::filesystem::create_directories(rank_log_dir, ec);
      if (ec)
        throw UsageError("--enable_each_rank_log: unable to create directory " + rank_log_dir +
                         " for each rank log: " + ec.message());
    }

    // The shim's command line: every node's slots in node order, and what DeepSpeed's
    // launch.py would do with the script (launch/deepspeed_worker.h).
    DsExec ds;
    for (auto& h : active) ds.world.push_back(h.slots);
    ds.master_port = std::to_string(master_port);
    ds.no_local_rank = no_local_rank;
    ds.no_python = check.no_python;
    if (!check.no_python) {
      ds.python = check.python;
      ds.module = module;
    }
    for (const auto& n : torchrun_only_names())
      if (!std::getenv(n.c_str())) ds.drop.push_back(n);
    if (!rank_log_dir.empty()) {
      // One time stamp for every rank of the job: DeepSpeed's <YYYYmmddHHMMSS>_rank<R>.log.
      char stamp[32];
      std::time_t now = std::time(nullptr);
      std::tm tm{};
      ::localtime_r(&now, &tm);
      std::strftime(stamp, sizeof stamp, "%Y%m%d%H%M%S", &tm);
      ds.rank_log = (std::filesystem::absolute(rank_log_dir) / stamp).string();
    }
    // Core binding is DeepSpeed's (numactl per LOCAL_RANK), done where each worker starts (the
    // shim, or the fork server), not the agent's own --bind-cores-to-rank.
    ds.bind_cores = bind_cores;
    ds.bind_core_list = bind_core_list;
    ds.program = program;  // as given: DeepSpeed's workers see it so in argv
    ds.args = user_args;
    std::vector<std::string> shim = {self_exe().path, "deepspeed-exec"};
    for (auto& a : ds_exec_args(ds)) shim.push_back(a);

    RunArgs ra;
    ra.no_slurm = true;  // the hosts come from the hostfile or this node, as DeepSpeed's
    ra.start_method = start_method;
    if (ssh_port > 0) ra.ssh_port = std::to_string(ssh_port);
    ra.ssh_identity = ssh_identity;
    ra.ssh_args = ssh_args;
    // The workers' MASTER_PORT is DeepSpeed's (rank 0 hosts PyTorch's store there); the agents'
    // own store takes a free port on one node, MASTER_PORT+1 across nodes.
    std::string agents_port =
        (multi_node || (no_ssh && active.size() > 1)) ? std::to_string(master_port + 1) : "0";
    if (multi_node) {
      std::string list;
      for (auto& h : active) {
        if (!list.empty()) list += ',';
        list += h.name + ":" + std::to_string(h.slots.size());
      }
      ra.host_list = list;
      ra.master_addr = master_addr.empty() ? active.front().name : master_addr;
      // As DeepSpeed's pdsh runner: the launching shell's MLFLOW*, PYTHON*, MV2*, UCX* and
      // NCCL* variables, this directory first on PYTHONPATH, and the .deepspeed_env files.
      std::map<std::string, std::string> exports;
      for (char** e = environ; *e; ++e) {
        std::string kv = *e;
        const std::string k = kv.substr(0, kv.find('='));
        for (const char* p : {"MLFLOW", "PYTHON", "MV2", "UCX", "NCCL"})
          if (k.rfind(p, 0) == 0) exports[k] = kv.substr(kv.find('=') + 1);
      }
      const char* pp = std::getenv("PYTHONPATH");
      exports["PYTHONPATH"] =
          std::filesystem::current_path().string() + (pp ? std::string(":") + pp : "");
      const char* env_name = std::getenv("DS_ENV_FILE");
      const char* home = std::getenv("HOME");
      for (const std::string& dir : {std::string(home ? home : ""), std::string(".")}) {
        if (dir.empty()) continue;
        const auto path = std::filesystem::path(dir) / (env_name ? env_name : ".deepspeed_env");
        if (!std::filesystem::is_regular_file(path)) continue;
        std::ifstream in(path);
        for (std::string line; std::getline(in, line);) {
          const auto eq = line.find('=');
          if (eq == std::string::npos)
            throw UsageError(path.string() + ": bad line '" + line + "', expected KEY=VALUE");
          exports[line.substr(0, eq)] = line.substr(eq + 1);
        }
      }
      for (auto& [k, v] : exports) ra.env.push_back(k + "=" + v);
    } else {
      const int node = no_ssh ? node_rank : 0;
      ra.nproc = std::to_string(active[static_cast<size_t>(node)].slots.size());
      if (no_ssh) {
        ra.nnodes = std::to_string(active.size());
        ra.node_rank = std::to_string(node);
        ra.master_addr = master_addr.empty() ? active.front().name : master_addr;
      } else {
        ra.master_addr = master_addr.empty() ? "127.0.0.1" : master_addr;
      }
    }
    ra.master_port = agents_port;
    // DeepSpeed's package sets this when imported (so torch asks NVML, not the CUDA runtime,
    // whether CUDA is there), and its launcher passes it on to every worker.
    ::setenv("PYTORCH_NVML_BASED_CUDA_CHECK", "1", 0);
    LaunchOptions o = run_args_to_options(ra, shim);
    o.no_python = true;
    if (save_pid) {
      // DeepSpeed's /tmp/<launcher pid>.deepspeed holding the pid that stops the job.
      save_pid_file = "/tmp/" + std::to_string(::getpid()) + ".deepspeed";
      if (std::filesystem::exists(save_pid_file)) {
        const std::string f = save_pid_file;
        save_pid_file.clear();
        throw UsageError("--save_pid: " + f + " exists already; remove it");
      }
      std::ofstream(save_pid_file) << ::getpid();
      std::cout << "launcher pid: " << ::getpid() << std::endl;
    }
    const int rc = run_launch(std::move(o));
    if (!save_pid_file.empty()) std::filesystem::remove(save_pid_file);
    return rc;
  } catch (const UsageError& e) {
    if (!save_pid_file.empty()) std::filesystem::remove(save_pid_file);
    std::cerr << "dtrain deepspeed: error: " << e.what()
              << "\nRun 'dtrain deepspeed --help' for the flags.\n";
    return 2;
  } catch (const std::exception& e) {
    if (!save_pid_file.empty()) std::filesystem::remove(save_pid_file);
    std::cerr << "dtrain deepspeed: error: " << e.what() << "\n";
    return 1;
  }
}

int deepspeed_exec_main(const std::vector<std::string>& args) {
  auto fail = [](const std::string& why) {
    std::cerr << "dtrain deepspeed-exec: " << why << " (this is dtrain deepspeed's worker shim)\n";
    return 2;
  };
  try {
    const DsExec e = parse_ds_exec(args);
    const char* group = std::getenv("GROUP_RANK");
    const char* local = std::getenv("LOCAL_RANK");
    if (!group || !local) return fail("GROUP_RANK/LOCAL_RANK are not set");
    const int node = std::atoi(group);
    const DsWorker w = ds_worker(e, node, std::atoi(local));
    const std::vector<std::string> env = ds_worker_env(current_environment(), e, node, w);
    ::clearenv();
    for (const auto& kv : env) {
      const auto eq = kv.find('=');
      if (eq != std::string::npos) ::setenv(kv.substr(0, eq).c_str(), kv.c_str() + eq + 1, 1);
    }
    if (w.binding && !apply_numactl(*w.binding)) {
      std::string cmd;
      for (const auto& c : w.binding->command()) cmd += (cmd.empty() ? "" : " ") + c;
      return fail("cannot bind local rank " + std::to_string(w.local_rank) + " as `" + cmd +
                  "` would: " + std::strerror(errno));
    }
    if (!w.log_path.empty()) {
      // DeepSpeed's --enable_each_rank_log: stdout and stderr to one file per rank.
      std::error_code ec;
      std::filesystem::create_directories(std::filesystem::path(w.log_path).parent_path(), ec);
      int fd = ::open(w.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd < 0) return fail("cannot create " + w.log_path + ": " + std::strerror(errno));
      ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
      ::close(fd);
    }
    return exec_program(w.argv, "dtrain deepspeed-exec");
  } catch (const UsageError& e) {
    return fail(e.what());
  }
}

}  // namespace dtrain::launch
