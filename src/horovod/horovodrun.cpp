// `dtrain horovodrun`: horovodrun's flags on dtrain's launcher. No libtorch (dtrain_core).
//
// The job runs exactly as `dtrain run` would run it (same agent, store, teardown, ssh hosts);
// each worker is `dtrain horovod-exec PROGRAM ARGS...`, a shim that adds Horovod's variables
// (HOROVOD_RANK, ... from the torchrun ones the agent set) and execs PROGRAM. So the launcher
// itself needs no Horovod knowledge, and the shim works on ssh hosts as well.
#include "horovod/horovodrun.h"
#include "core/params.h"

#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <set>
#include <sstream>

#include "core/hostfile.h"
#include "core/paths.h"
#include "dtrain/error.h"
#include "dtrain/launch.h"
#include "horovod/horovodrun_elastic.h"
#include "launch/options_internal.h"
#include "launch/worker_process.h"

namespace dtrain::hvd {

namespace {

const char* kUsage =
    "usage: dtrain horovodrun -np N [-H host1:slots,host2:slots | --hostfile FILE]\n"
    "                         [--start-timeout S] [--network-interface IF] [--fusion-threshold-mb "
    "M]\n"
    "                         [--cycle-time-ms C] [--timeline-filename F] [--gloo] [-p SSH_PORT]\n"
    "                         [-i SSH_IDENTITY_FILE] [--ssh-arg ARG]... PROGRAM [ARGS...]\n"
    "  elastic: dtrain horovodrun [-np N] --min-np MIN [--max-np MAX] --host-discovery-script "
    "SCRIPT\n"
    "                         [--slots S] [--elastic-timeout S] [--reset-limit R] ... PROGRAM "
    "[ARGS...]\n"
    "  Runs PROGRAM on N processes as horovodrun does, on dtrain's launcher. Workers get\n"
    "  HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_LOCAL_RANK, HOROVOD_LOCAL_SIZE, HOROVOD_CROSS_RANK,\n"
    "  HOROVOD_CROSS_SIZE and torchrun's variables. Without -H/--hostfile every process runs "
    "here.\n"
    "  Elastic: SCRIPT prints the current hosts (HOST:SLOTS lines); a host whose worker fails "
    "leaves\n"
    "  the job and the others go on from the last commit (hvd::elastic::run, "
    "dtrain/horovod_elastic.h).\n"
    "  Hosts that are not this machine get their workers over ssh (-p, -i, --ssh-arg).\n";

int parse_positive(const std::string& flag, const std::string& v, bool allow_zero = false) {
  try {
    size_t used = 0;
    long n = std::stol(v, &used);
    if (used == v.size() && (n > 0 || (allow_zero && n == 0)) && n <= INT_MAX)
      return static_cast<int>(n);
  } catch (const std::exception&) {
  }
  throw UsageError(flag + ": got '" + v + "', expected a " +
                   (allow_zero ? "non-negative" : "positive") + " integer");
}

double parse_number(const std::string& flag, const std::string& v) {
  try {
    size_t used = 0;
    double d = std::stod(v, &used);
    if (used == v.size() && d >= 0) return d;
  } catch (const std::exception&) {
  }
  throw UsageError(flag + ": got '" + v + "', expected a non-negative number");
}

}  // namespace

int horovodrun_main(const std::vector<std::string>& args) {
  try {
    int np = -1;
    std::string hosts, hostfile, start_timeout, ifname, timeline, ssh_port, ssh_identity;
    std::map<std::string, std::string> env;
    std::vector<std::string> ssh_args;
    ElasticFlags ef;
    bool elastic = false;
    size_t i = 0;
    auto value = [&](const std::string& flag) -> std::string {
      if (i + 1 >= args.size()) throw UsageError(flag + " needs a value");
      return args[++i];
    };
    for (; i < args.size(); ++i) {
      const std::string& a = args[i];
      if (a == "-h" || a == "--help") {
        std::cout << kUsage;
        return 0;
      }
      if (a == "--") {
        ++i;
        break;
      }
      if (a.empty() || a[0] != '-') break;  // PROGRAM
      if (a == "-np" || a == "--num-proc" || a == "-n") {
        np = parse_positive(a, value(a));
      } else if (a == "-H" || a == "--hosts") {
        hosts = value(a);
      } else if (a == "--hostfile" || a == "-hostfile") {
        hostfile = value(a);
      } else if (a == "--start-timeout") {
        start_timeout = std::to_string(parse_positive(a, value(a)));
      } else if (a == "--network-interface" || a == "--network-interfaces") {
        ifname = value(a);
      } else if (a == "--fusion-threshold-mb") {
        double mb = parse_number(a, value(a));
        env["HOROVOD_FUSION_THRESHOLD"] = std::to_string(static_cast<long long>(mb * 1024 * 1024));
      } else if (a == "--cycle-time-ms") {
        double ms = parse_number(a, value(a));
        if (ms <= 0)
          throw UsageError("--cycle-time-ms: expected a positive number of milliseconds");
        env["HOROVOD_CYCLE_TIME"] = args[i];
      } else if (a == "--timeline-filename") {
        timeline = value(a);
        env["HOROVOD_TIMELINE"] = timeline;
      } else if (a == "--gloo") {
        // dtrain's runtime is Gloo (and shared memory on one host): nothing to switch.
      } else if (a == "--mpi" || a == "--jsrun") {
        throw UsageError(a +
                         ": dtrain horovodrun runs on dtrain's own launcher and Gloo/shared-memory "
                         "runtime; drop the flag (use --gloo or nothing)");
      } else if (a == "-p" || a == "--ssh-port") {
        ssh_port = value(a);
      } else if (a == "-i" || a == "--ssh-identity-file") {
        ssh_identity = value(a);
      } else if (a == "--ssh-arg") {  // dtrain's: as `dtrain run --ssh-arg`, e.g. --ssh-arg -F
                                      // --ssh-arg CFG
        ssh_args.push_back(value(a));
      } else if (a == "--min-np" || a == "--min-num-proc") {
        ef.min_np = parse_positive(a, value(a));
        elastic = true;
      } else if (a == "--max-np" || a == "--max-num-proc") {
        ef.max_np = parse_positive(a, value(a));
        elastic = true;
      } else if (a == "--host-discovery-script") {
        ef.discovery_script = value(a);
        elastic = true;
      } else if (a == "--slots" || a == "--slots-per-host") {
        ef.slots = parse_positive(a, value(a));
      } else if (a == "--elastic-timeout") {
        ef.elastic_timeout_s = parse_positive(a, value(a));
      } else if (a == "--reset-limit") {
        ef.reset_limit = parse_positive(a, value(a), true);
      } else if (a == "--blacklist-cooldown-range") {
        throw UsageError(a +
                         ": not built in dtrain horovodrun: a host whose worker failed stays "
                         "blacklisted for the "
                         "rest of the job; drop the flag");
      } else if (a == "--verbose" || a == "-v") {
        // accepted for horovodrun compatibility
      } else {
        throw UsageError("unknown option '" + a + "'");
      }
    }
    if (elastic) {
      if (!hosts.empty() || !hostfile.empty()) {
        throw UsageError(
            "-H/--hostfile and --host-discovery-script both given: an elastic job finds its hosts "
            "with the script only; drop -H/--hostfile");
      }
      if (i >= args.size()) throw UsageError("missing PROGRAM");
      ef.np = np;
      if (!start_timeout.empty()) ef.start_timeout_s = std::stoi(start_timeout);
      if (!ssh_port.empty()) ef.ssh_port = parse_positive("--ssh-port", ssh_port);
      ef.ssh_identity = ssh_identity;
      ef.ssh_args = ssh_args;
      validate_elastic_flags(ef);
      std::string spec;
      if (!is_elastic_agent(&spec)) {
        LaunchOptions check;  // PROGRAM is checked before any agent starts
        check.program = args[i];
        validate_launch_options(check);
        return run_elastic_driver(ef, args);
      }
      // One host's agent, started by the driver: HOST,PROCESSES,STORE_PORT,RUN_ID,MIN,MAX, and
      // on a remote host (started over ssh) ,STORE_ADDRESS.
      std::vector<std::string> f;
      std::stringstream ss(spec);
      for (std::string item; std::getline(ss, item, ',');) f.push_back(item);
      if (f.size() != 6 && f.size() != 7)
        throw Error("bad DTRAIN_HVD_ELASTIC_AGENT '" + spec + "'");
      RunArgs ra;
      ra.nproc = f[1];
      ra.nnodes = f[4] + ":" + f[5];
      ra.rdzv_backend = "c10d";
      ra.master_addr = f.size() == 7 ? f[6] : "127.0.0.1";
      ra.stdin_eof = f.size() == 7;  // over ssh: the driver closing our stdin stops the workers
      ra.master_port = f[2];
      ra.rdzv_id = f[3];
      ra.rdzv_timeout = std::to_string(ef.elastic_timeout_s);
      ra.rdzv_conf = "last_call_timeout=2";
      ra.max_restarts = std::to_string(ef.reset_limit);
      ra.ifname = ifname;
      ra.no_slurm = true;
      for (auto& [k, v] : env) ra.env.push_back(k + "=" + v);
      std::vector<std::string> rest = {self_exe().path, "horovod-exec"};
      rest.insert(rest.end(), args.begin() + static_cast<long>(i), args.end());
      LaunchOptions o = run_args_to_options(ra, rest);
      o.no_python = true;
      o.leave_on_worker_failure = true;
      return run_launch(std::move(o));
    }
    if (np < 1) throw UsageError("-np N is required (the number of processes)");
    if (i >= args.size()) throw UsageError("missing PROGRAM");
    if (!hosts.empty() && !hostfile.empty())
      throw UsageError("-H and --hostfile both given: use one of them");

    RunArgs ra;
    ra.nproc = std::to_string(np);
    if (!start_timeout.empty()) ra.rdzv_timeout = start_timeout;
    ra.ifname = ifname;
    ra.ssh_port = ssh_port;
    ra.ssh_identity = ssh_identity;
    ra.ssh_args = ssh_args;
    ra.no_slurm = true;  // horovodrun decides the layout from -np and the hosts, not from Slurm
    for (auto& [k, v] : env) ra.env.push_back(k + "=" + v);
    if (!hosts.empty() || !hostfile.empty()) {
      // horovodrun fills the hosts' slots in order; every host must be reachable over ssh.
      auto slots = !hostfile.empty() ? parse_hostfile(hostfile, 1) : parse_host_list(hosts, 1);
      int total = 0;
      for (auto& [h, s] : slots) total += s;
      if (total < np) {
        throw UsageError("-np " + std::to_string(np) + " but the hosts offer only " +
                         std::to_string(total) + " slot(s); add hosts or slots, or lower -np");
      }
      std::vector<std::pair<std::string, int>> used;
      int left = np;
      for (auto& [h, s] : slots) {
        if (left == 0) break;
        used.emplace_back(h, std::min(s, left));
        left -= used.back().second;
      }
      std::set<std::string> distinct;
      for (auto& u : used) distinct.insert(u.first);
      if (!(used.size() == 1 && is_this_host(used.front().first))) {
        std::string list;
        for (auto& [h, n] : used) list += (list.empty() ? "" : ",") + h + ":" + std::to_string(n);
        ra.host_list = list;
        ra.nproc.clear();  // each host runs its share
      }
    }
    // Check PROGRAM here, where the message reaches the user at once.
    LaunchOptions check;
    check.program = args[i];
    check.no_python = false;
    validate_launch_options(check);
    std::vector<std::string> rest = {self_exe().path, "horovod-exec", check.program};
    rest.insert(rest.end(), args.begin() + static_cast<long>(i) + 1, args.end());
    LaunchOptions o = run_args_to_options(ra, rest);
    o.no_python = true;
    if (!timeline.empty() && ra.host_list.empty()) {
      // Rank 0 runs here and writes the file: a directory that is missing fails now, not
      // after every worker started.
      auto dir = std::filesystem::absolute(timeline).parent_path();
      if (!std::filesystem::is_directory(dir)) {
        throw UsageError("--timeline-filename " + timeline + ": the directory " + dir.string() +
                         " does not exist; create it or give another path");
      }
    }
    return run_launch(std::move(o));
  } catch (const UsageError& e) {
    std::cerr << "dtrain horovodrun: error: " << e.what() << "\n" << kUsage;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "dtrain horovodrun: error: " << e.what() << "\n";
    return 1;
  }
}

int horovod_exec_main(const std::vector<std::string>& args) {
  if (args.empty()) {
    std::cerr << "dtrain horovod-exec: missing PROGRAM (this is dtrain horovodrun's worker shim)\n";
    return 2;
  }
  const char* rank = std::getenv("RANK");
  if (!rank) {
    std::cerr
        << "dtrain horovod-exec: RANK is not set; this shim runs under dtrain horovodrun only\n";
    return 2;
  }
  // Horovod's names for what the agent set (cross = across hosts: the node's rank and count).
  const std::pair<const char*, const char*> names[] = {
      {"HOROVOD_RANK", "RANK"},
      {"HOROVOD_SIZE", "WORLD_SIZE"},
      {"HOROVOD_LOCAL_RANK", "LOCAL_RANK"},
      {"HOROVOD_LOCAL_SIZE", "LOCAL_WORLD_SIZE"},
      {"HOROVOD_CROSS_RANK", "GROUP_RANK"},
      {"HOROVOD_CROSS_SIZE", "GROUP_WORLD_SIZE"},
  };
  for (auto [hvd, torch] : names) {
    if (const char* v = std::getenv(torch)) ::setenv(hvd, v, 1);
  }
  ::setenv("HOROVOD_HOSTNAME", this_host_name().c_str(), 1);
  ::setenv("HOROVOD_CONTROLLER", "gloo", 1);
  ::setenv("HOROVOD_CPU_OPERATIONS", "gloo", 1);
  std::vector<std::string> argv;
  const std::string& program = args[0];
  if (program.size() > 3 && program.compare(program.size() - 3, 3, ".py") == 0) {
    argv = {param::kPython.get(), "-u"};
  }
  argv.insert(argv.end(), args.begin(), args.end());
  return launch::exec_program(std::move(argv), "dtrain horovod-exec");
}

}  // namespace dtrain::hvd
