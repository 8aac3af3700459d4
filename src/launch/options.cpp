// `dtrain run` argument parsing and validation. One piece (~750 lines): each flag's CLI11
// definition and its validation belong together, and torchrun's flags are one table.
#include <net/if.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "core/hostfile.h"
#include "core/params.h"
#include "dtrain/engine_env.h"
#include "dtrain/error.h"
#include "dtrain/launch.h"
#include "engines/engine.h"
#include "launch/cpu_binding.h"
#include "launch/deepspeed_worker.h"
#include "launch/fork_server.h"
#include "launch/gpus.h"
#include "launch/guard.h"
#include "launch/options_internal.h"

namespace dtrain {

namespace {

// The 16 bytes of a random (version 4) UUID.
std::array<unsigned char, 16> random_uuid4_bytes() {
  std::random_device rd;
  std::array<unsigned char, 16> b;
  for (auto& x : b) x = static_cast<unsigned char>(rd() & 0xff);
  b[6] = static_cast<unsigned char>((b[6] & 0x0f) | 0x40);  // version 4
  b[8] = static_cast<unsigned char>((b[8] & 0x3f) | 0x80);  // RFC 4122 variant
  return b;
}

// A random UUID in its usual text form, as Python's str(uuid.uuid4()).
std::string random_uuid4() {
  const auto b = random_uuid4_bytes();
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    s += hex[b[i] >> 4];
    s += hex[b[i] & 0x0f];
  }
  return s;
}

// A random UUID as a decimal integer, as Python's str(uuid.uuid4().int): the run id torchrun's
// launcher takes when the one it was given is empty (torch/distributed/launcher/api.py).
std::string random_uuid4_int() {
  const auto b = random_uuid4_bytes();
  unsigned __int128 n = 0;
  for (unsigned char x : b) n = (n << 8) | x;
  std::string s;
  do {
    s.push_back(static_cast<char>('0' + static_cast<int>(n % 10)));
    n /= 10;
  } while (n != 0);
  std::reverse(s.begin(), s.end());
  return s;
}

int parse_int(const std::string& flag, const std::string& value, const std::string& form) {
  try {
    size_t used = 0;
    long v = std::stol(value, &used);
    if (used == value.size() && v >= INT32_MIN && v <= INT32_MAX) return static_cast<int>(v);
  } catch (const std::exception&) {
  }
  throw UsageError(flag + ": got '" + value + "', expected " + form);
}

int parse_nproc(const std::string& value) {
  const std::string flag = "--nproc-per-node";
  if (value == "cpu") return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (value == "gpu" || value == "auto") {
    const launch::GpuCount gpus = launch::count_gpus();
    if (gpus.count > 0) return gpus.count;
    if (value == "auto") return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    throw UsageError(flag + ": got 'gpu', but this machine shows no CUDA device (" + gpus.how +
                     "; CUDA_VISIBLE_DEVICES applies); use a number or 'cpu'");
  }
  int n = parse_int(flag, value, "a positive integer, 'cpu', 'gpu' or 'auto'");
  if (n < 1) {
    throw UsageError(flag + ": got '" + value +
                     "', expected a positive integer, 'cpu', 'gpu' or 'auto'");
  }
  // The agent's guard, which stops every worker if the agent is killed, tracks this many
  // process groups; more workers on one node than that is a typo anyway.
  if (n > launch::kMaxLocalWorkers)
    throw UsageError(flag + ": got '" + value + "', at most " +
                     std::to_string(launch::kMaxLocalWorkers) +
                     " workers run on one node (use more nodes)");
  return n;
}

// "N" or "N:N" -> {N, N}; "MIN:MAX" -> {MIN, MAX} (elastic).
std::pair<int, int> parse_nnodes(const std::string& value) {
  const std::string flag = "--nnodes";
  const std::string form = "a positive integer N, or MIN:MAX with 1 <= MIN <= MAX";
  auto colon = value.find(':');
  int lo, hi;
  if (colon == std::string::npos) {
    lo = hi = parse_int(flag, value, form);
  } else {
    lo = parse_int(flag, value.substr(0, colon), form);
    hi = parse_int(flag, value.substr(colon + 1), form);
  }
  if (lo < 1 || hi < lo) throw UsageError(flag + ": got '" + value + "', expected " + form);
  return {lo, hi};
}

// At most ~31.7 years: any longer wait is a typo, and seconds * 1000 must fit the int64 of
// std::chrono::milliseconds (and a deadline of now + it a clock's time_point).
constexpr double kMaxSeconds = 1e9;

double parse_seconds(const std::string& flag, const std::string& value) {
  try {
    size_t used = 0;
    double v = std::stod(value, &used);
    if (used == value.size() && v >= 0 && v <= kMaxSeconds) return v;
  } catch (const std::exception&) {
  }
  throw UsageError(flag + ": got '" + value +
                   "', expected a non-negative number of seconds (at most 1e9)");
}

}  // namespace

std::map<int, int> parse_stream_spec(const std::string& flag, const std::string& value) {
  const std::string form = "0-3 (1 stdout, 2 stderr, 3 both) or per local rank like '0:3,1:2'";
  std::map<int, int> out;
  // Errors quote the whole spec as typed, not just the piece that failed to parse.
  auto number = [&](const std::string& s) {
    try {
      return parse_int(flag, s, form);
    } catch (const UsageError&) {
      throw UsageError(flag + ": got '" + value + "', expected " + form);
    }
  };
  auto check = [&](int v) {
    if (v < 0 || v > 3) throw UsageError(flag + ": got '" + value + "', expected " + form);
    return v;
  };
  if (value.find(':') == std::string::npos) {
    out[-1] = check(parse_int(flag, value, form));
    return out;
  }
  size_t pos = 0;
  while (pos <= value.size()) {
    size_t comma = value.find(',', pos);
    std::string item =
        value.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    auto colon = item.find(':');
    if (colon == std::string::npos)
      throw UsageError(flag + ": got '" + value + "', expected " + form);
    int rank = number(item.substr(0, colon));
    if (rank < 0) throw UsageError(flag + ": got '" + value + "', expected " + form);
    out[rank] = check(number(item.substr(colon + 1)));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

std::pair<std::string, int> parse_endpoint(const std::string& flag, const std::string& value) {
  const std::string form = "HOST:PORT (or [IPv6]:PORT), with PORT in 0-65535";
  std::string host;
  std::string port;
  if (!value.empty() && value.front() == '[') {
    auto close = value.find(']');
    if (close == std::string::npos || close + 1 >= value.size() || value[close + 1] != ':') {
      throw UsageError(flag + ": got '" + value + "', expected " + form);
    }
    host = value.substr(1, close - 1);
    port = value.substr(close + 2);
  } else {
    auto colon = value.rfind(':');
    if (colon == std::string::npos) {
      host = value;  // torchrun allows a bare host; the port then defaults to 29400
      port = "29400";
    } else {
      host = value.substr(0, colon);
      port = value.substr(colon + 1);
    }
  }
  int p = -1;
  try {
    p = parse_int(flag, port, form);
  } catch (const UsageError&) {
    // Name the whole endpoint the user typed, not just the part after the colon.
  }
  if (host.empty() || p < 0 || p > 65535) {
    throw UsageError(flag + ": got '" + value + "', expected " + form);
  }
  return {host, p};
}

// torchrun's last-wins for a repeated option (argparse keeps the last value); CLI11 refuses a
// repeated single-value option unless told. Repeatable options (--env, --ssh-arg, the
// duplicate filters) keep every value.
void take_last_for_repeats(CLI::App& run) {
  for (CLI::Option* opt : run.get_options()) {
    if (opt->get_expected_max() == 1) opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  }
}

CLI::App& add_run_options(CLI::App& run, RunArgs& a) {
  run.description(
      "Run PROGRAM on --nproc-per-node worker processes on this node (and, with --nnodes,\n"
      "together with the agents on the other nodes). torchrun's flags, both spellings.\n"
      "PROGRAM ending in .py runs as `python3 -u PROGRAM ARGS`; -m runs a module; anything\n"
      "else is executed directly. Exit code: 0, the failing worker's exit code (128+N for\n"
      "signal N), 128+N when dtrain gets signal N, 2 for bad arguments, 1 for other errors.");
  run.add_option("--nproc-per-node,--nproc_per_node", a.nproc,
                 "Workers per node: N, 'cpu' (one per core), 'gpu' (one per CUDA device), "
                 "'auto' (gpu if any, else cpu). Default: 1; with a host file, each host's slots");
  run.add_option("--nnodes", a.nnodes,
                 "Number of nodes: N, or MIN:MAX for an elastic job (needs --rdzv-backend c10d; "
                 "restarts at the new size when nodes fail or join). Default: 1; under srun, the "
                 "step's node count");
  run.add_option("--node-rank,--node_rank", a.node_rank,
                 "This node's rank, 0..nnodes-1 (static rendezvous; default 0; c10d assigns it "
                 "in join order when not given)");
  run.add_option("--master-addr,--master_addr", a.master_addr,
                 "Address of the node that hosts the store (node 0), reachable from every node. "
                 "Default: 127.0.0.1; under srun or with a host file, the first host");
  run.add_option("--master-port,--master_port", a.master_port,
                 "Port of the store on the master node (default: 29500, as torchrun; on one node "
                 "a free port when 29500 is taken)");
  run.add_option("--rdzv-endpoint,--rdzv_endpoint", a.rdzv_endpoint,
                 "HOST:PORT of the rendezvous store (overrides --master-addr/--master-port)");
  run.add_option("--rdzv-backend,--rdzv_backend", a.rdzv_backend,
                 "'static' (each node gives --node-rank) or 'c10d' (nodes join without one "
                 "and get ranks in join order)")
      ->capture_default_str();
  run.add_option("--rdzv-id,--rdzv_id", a.rdzv_id, "Job id shared by the job's agents")
      ->capture_default_str();
  run.add_option("--rdzv-timeout,--rdzv_timeout", a.rdzv_timeout,
                 "Seconds to wait for every node to join")
      ->capture_default_str();
  run.add_option("--rdzv-conf,--rdzv_conf", a.rdzv_conf,
                 "torchrun's KEY=VALUE,... rendezvous config; 'join_timeout=S' and 'timeout=S' "
                 "set --rdzv-timeout, 'last_call_timeout=S' the elastic last call (default 30), "
                 "'heartbeat_timeout=S' when a silent agent counts as lost; other keys are "
                 "accepted and ignored");
  run.add_option("--store-token", a.store_token,
                 "Only clients that prove TOKEN may use the job's store (every agent of the job "
                 "needs the same one; C++ workers get it as DTRAIN_STORE_TOKEN; not for Python "
                 "programs). '-' reads it from the first line of stdin, which keeps it out of "
                 "`ps`. Default: $DTRAIN_STORE_TOKEN, else none");
  run.add_flag("--standalone", a.standalone,
               "Single node: c10d rendezvous on a free local port (no endpoint needed)");
  run.add_option("--max-restarts,--max_restarts", a.max_restarts,
                 "Restart all workers at most this many times after a failure")
      ->capture_default_str();
  run.add_option("--monitor-interval,--monitor_interval", a.monitor_interval,
                 "Seconds between health checks (worker deaths are seen at once)")
      ->capture_default_str();
  run.add_option("--term-timeout,--term_timeout", a.term_timeout,
                 "Seconds between SIGTERM and SIGKILL when stopping workers")
      ->capture_default_str();
  run.add_option(
      "--log-dir,--log_dir", a.log_dir,
      "Keep the logs in LOG_DIR/RUN_ID_<random>/attempt_K/LOCAL_RANK/ (torchrun's layout): "
      "the streams --redirects or --tee names, as {stdout,stderr}.log (--tee 3: every rank's "
      "full output), and error.json");
  run.add_option("-r,--redirects", a.redirects,
                 "Streams sent to the log files only: 0 none, 1 stdout, 2 stderr, 3 both; or "
                 "per local rank '0:1,1:2'")
      ->capture_default_str();
  run.add_option("-t,--tee", a.tee,
                 "Streams sent to console and log files (the console gets every stream not "
                 "redirected anyway; a teed stream also when redirected); same form as "
                 "--redirects")
      ->capture_default_str();
  run.add_option("--role", a.role, "Worker role name (ROLE_NAME, log prefix)")
      ->capture_default_str();
  run.add_flag("-m,--module", a.module, "Run PROGRAM as a Python module (python3 -u -m PROGRAM)");
  run.add_flag("--no-python,--no_python", a.no_python,
               "Execute PROGRAM directly even if it ends in .py");
  run.add_flag("--malloc-hugepages,--malloc_hugepages", a.malloc_hugepages,
               "Workers get GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (added to any existing): huge "
               "pages for malloc, ~20% faster libtorch start-up on VMs (glibc >= 2.35)");
  run.add_flag("--bind-cores-to-rank,--bind_cores_to_rank", a.bind_cores_to_rank,
               "Bind each local rank to its own share of this node's physical cores (with their "
               "hyperthreads); OMP_NUM_THREADS = cores per rank unless set (DeepSpeed's flag)");
  run.add_option("--bind-core-list,--bind_core_list", a.bind_core_list,
                 "With --bind-cores-to-rank: share out these logical CPUs instead, as DeepSpeed "
                 "does (e.g. 0-7,16-23: len/nproc consecutive CPUs per rank)");
  run.add_option("--failure-file,--failure_file", a.failure_file,
                 "When the job fails, write its root cause there as one JSON object (rank, "
                 "exit_code, signal, host, stderr_tail, ...), for programs that drive dtrain");
  run.add_option("--failure-store,--failure_store", a.failure_store,
                 "HOST:PORT/KEY: when the job fails, every agent that reports it also stores the "
                 "root cause (--failure-file's JSON) under KEY on the TCPStore at HOST:PORT, for "
                 "programs that drive dtrain on several hosts");
  run.add_option("--start-method,--start_method", a.start_method,
                 "How workers start: spawn (each fork+exec'd, loads its libraries itself), "
                 "forkserver or fork (the program starts once, loads and initialises its shared "
                 "libraries, and the workers are forked from it: a libtorch program starts "
                 "~0.6 s and ~0.9 CPU-s faster per worker), auto (forkserver for a program that "
                 "links libtorch, libc10 or libdtrain with 2+ workers per node or a job that can "
                 "restart, else spawn). "
                 "Python scripts always spawn")
      ->capture_default_str();
  run.add_flag("--run-path,--run_path", a.run_path,
               "PROGRAM is a Python file (run with python3 -u, as torchrun's runpy.run_path), "
               "whatever its name");
  // torchrun 2.x's options (ParseRunArgs.EveryTorchrunOptionOfTheVenvIsAccepted, in
  // tests/unit/launch_options_test.cpp, checks them against the venv's torchrun).
  run.add_option("--local-ranks-filter,--local_ranks_filter", a.local_ranks_filter,
                 "Show only these local ranks' output on the console, e.g. 0 or 0,1 (with "
                 "--log-dir, the others' still go to their files)");
  run.add_option("--event-log-handler,--event_log_handler", a.event_log_handler,
                 "torchrun's event log handler; dtrain logs its events itself (accepted, noted)")
      ->capture_default_str();
  run.add_option("--duplicate-stdout-filters,--duplicate_stdout_filters",
                 a.duplicate_stdout_filters,
                 "'apple,orange': the console's stdout lines holding apple or orange are also "
                 "written, prefixed, to attempt_K/filtered_stdout.log in the log directory "
                 "(',,' is a comma)");
  run.add_option("--duplicate-stderr-filters,--duplicate_stderr_filters",
                 a.duplicate_stderr_filters,
                 "As --duplicate-stdout-filters, for stderr (filtered_stderr.log)");
  run.add_option("--local-addr,--local_addr", a.local_addr,
                 "This node's address for the rendezvous (accepted, noted: dtrain's nodes "
                 "reach the master at --master-addr)");
  run.add_option("--logs-specs,--logs_specs", a.logs_specs,
                 "torchrun's LogsSpecs plug-in (accepted, noted: dtrain writes torchrun's "
                 "default layout, see --log-dir)");
  run.add_option("--numa-binding,--numa_binding", a.numa_binding,
                 "node, socket, exclusive or core-complex: torchrun binds each GPU worker to its "
                 "GPU's NUMA node (accepted, noted: dtrain binds nothing)");
  run.add_option("--signals-to-handle,--signals_to_handle", a.signals_to_handle,
                 "Signals the agent passes on to the workers before stopping them (the workers "
                 "get it as TORCHELASTIC_SIGNALS_TO_HANDLE, as under torchrun; dtrain's agent "
                 "stops the workers on SIGTERM, SIGINT, SIGHUP and SIGQUIT)")
      ->capture_default_str();
  run.add_flag("--virtual-local-rank,--virtual_local_rank", a.virtual_local_rank,
               "As torchrun's: every worker gets LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES = its "
               "local rank's entry of this agent's list (else the local rank)");
  // One value per --env: a vector option would otherwise swallow PROGRAM and its args.
  run.add_option("--env", a.env, "Extra KEY=VALUE for every worker (repeatable)")
      ->allow_extra_args(false);
  // ---- clusters ----
  run.add_option("--hostfile,--host-file,--hostfile_path", a.hostfile,
                 "Run on the hosts of FILE (lines 'host slots=N', '#' comments): one agent per "
                 "host started over ssh; the first host hosts the store");
  run.add_option("-H,--hosts", a.host_list,
                 "Hosts as 'host1:2,host2:2' (host:slots), like --hostfile");
  run.add_option("--ssh-port", a.ssh_port, "ssh port on every host (ssh -p)");
  run.add_option("--ssh-identity,--ssh-key", a.ssh_identity, "ssh private key (ssh -i FILE)");
  run.add_option(
         "--ssh-arg", a.ssh_args,
         "Extra ssh argument, repeatable (e.g. --ssh-arg=-F --ssh-arg=cfg, --ssh-arg=-oKey=Value)")
      ->allow_extra_args(false);
  run.add_option("--remote-dtrain", a.remote_dtrain,
                 "Path of dtrain on the hosts (default: the path of this dtrain)");
  run.add_option("--ifname,--network-interface", a.ifname,
                 "Network interface for the workers' traffic (GLOO_SOCKET_IFNAME), e.g. eth0");
  run.add_flag("--dry-run,--dry_run", a.dry_run,
               "Print the plan (engine, hosts, ranks per host, master address and port) and "
               "check that every host is reachable; start nothing");
  run.add_flag("--no-slurm", a.no_slurm,
               "Ignore Slurm's variables (by default, under srun the node list, node rank and "
               "node count come from Slurm)");
  run.add_flag("--stop-on-stdin-eof", a.stdin_eof,
               "Internal (set by the host-file launch): stop the workers when stdin reaches EOF")
      ->group("");
  run.add_option("--log-line-prefix-template", a.log_line_prefix_template,
                 "Internal (set by the host-file launch): the launching host's "
                 "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, over this host's")
      ->group("");
  run.footer(
      "PROGRAM [ARGS...] follow the options: the program to run (a binary, a name on PATH,\n"
      "a .py script, or with -m a module) and its arguments, passed on unchanged.");
  run.prefix_command();
  take_last_for_repeats(run);
  // As torchrun's (torch/distributed/argparse_util.py): an option not on the command line
  // takes its value from PET_<NAME> (what Kubeflow's PyTorchJob sets, e.g. PET_NNODES,
  // PET_NODE_RANK, PET_MASTER_ADDR); a flag is on when PET_<NAME> is a non-zero number.
  for (const char* name : {"--nnodes",
                           "--nproc-per-node",
                           "--rdzv-backend",
                           "--rdzv-endpoint",
                           "--rdzv-id",
                           "--rdzv-conf",
                           "--standalone",
                           "--max-restarts",
                           "--monitor-interval",
                           "--start-method",
                           "--event-log-handler",
                           "--role",
                           "--module",
                           "--no-python",
                           "--run-path",
                           "--log-dir",
                           "--redirects",
                           "--tee",
                           "--local-ranks-filter",
                           "--duplicate-stdout-filters",
                           "--duplicate-stderr-filters",
                           "--node-rank",
                           "--master-addr",
                           "--master-port",
                           "--local-addr",
                           "--signals-to-handle",
                           "--virtual-local-rank"}) {
    std::string env = std::string("PET_") + (name + 2);
    for (char& c : env) c = c == '-' ? '_' : static_cast<char>(std::toupper(c));
    run.get_option(name)->envname(env);
  }
  return run;
}

namespace {

// torchrun's comma_separated_list: "a,b" -> {a, b}; ",," stands for a comma inside an item.
std::vector<std::string> comma_separated_list(const std::string& value) {
  std::vector<std::string> items(1);
  for (size_t i = 0; i < value.size(); ++i) {
    if (value[i] != ',') {
      items.back() += value[i];
    } else if (i + 1 < value.size() && value[i + 1] == ',') {
      items.back() += ',';
      ++i;
    } else {
      items.emplace_back();
    }
  }
  return items;
}

// torchrun 2.x's options beyond 1.13's: --local-ranks-filter, the duplicate filters and the
// prefix template as torchrun means them, the rest checked and noted.
void apply_torchrun2_args(LaunchOptions& o, const RunArgs& a) {
  if (!a.local_ranks_filter.empty()) {
    size_t pos = 0;
    while (pos <= a.local_ranks_filter.size()) {
      size_t comma = a.local_ranks_filter.find(',', pos);
      const std::string item = a.local_ranks_filter.substr(
          pos, comma == std::string::npos ? std::string::npos : comma - pos);
      const int r = parse_int("--local-ranks-filter", item, "local ranks like 0 or 0,1,2");
      if (r < 0)
        throw UsageError("--local-ranks-filter: got '" + a.local_ranks_filter +
                         "', expected local ranks like 0 or 0,1,2");
      o.local_ranks_filter.insert(r);
      if (comma == std::string::npos) break;
      pos = comma + 1;
    }
    // (Only with --nproc-per-node given: a host file's slots set the count later.)
    if (!a.nproc.empty() && *o.local_ranks_filter.begin() >= o.nproc_per_node)
      o.notes.push_back("--local-ranks-filter " + a.local_ranks_filter +
                        ": names no local rank of this node (0.." +
                        std::to_string(o.nproc_per_node - 1) +
                        "), so no worker's output is shown (as under torchrun)");
  }
  // An empty value duplicates nothing, as torchrun's (`if duplicate_stdout_filters:`).
  if (!a.duplicate_stdout_filters.empty())
    o.duplicate_stdout_filters = comma_separated_list(a.duplicate_stdout_filters);
  if (!a.duplicate_stderr_filters.empty())
    o.duplicate_stderr_filters = comma_separated_list(a.duplicate_stderr_filters);
  if (const char* t = std::getenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"); t && *t)
    o.log_line_prefix_template = t;
  if (!a.log_line_prefix_template.empty()) o.log_line_prefix_template = a.log_line_prefix_template;
  if (a.event_log_handler != "null")
    o.notes.push_back("--event-log-handler " + a.event_log_handler +
                      ": torchrun's event handlers do not apply; dtrain reports its events on "
                      "stderr and in --failure-file");
  if (!a.local_addr.empty())
    o.notes.push_back("--local-addr " + a.local_addr +
                      ": not used; the nodes reach the store at --master-addr/--rdzv-endpoint");
  if (!a.logs_specs.empty())
    o.notes.push_back("--logs-specs " + a.logs_specs +
                      ": torchrun's log plug-ins do not apply; dtrain writes torchrun's default "
                      "layout, LOG_DIR/RUN_ID_<random>/attempt_K/LOCAL_RANK/{stdout,stderr}.log");
  if (!a.numa_binding.empty()) {
    if (a.numa_binding != "node" && a.numa_binding != "socket" && a.numa_binding != "exclusive" &&
        a.numa_binding != "core-complex")
      throw UsageError("--numa-binding: got '" + a.numa_binding +
                       "', expected node, socket, exclusive or core-complex");
    o.notes.push_back("--numa-binding " + a.numa_binding +
                      ": workers are not bound (torchrun binds GPU workers to their GPU's NUMA "
                      "node; bind with numactl inside PROGRAM if needed)");
  }
  static const std::set<std::string> known = {"SIGTERM", "SIGINT",  "SIGHUP",
                                              "SIGQUIT", "SIGUSR1", "SIGUSR2"};
  size_t pos = 0;
  // Empty (`--signals-to-handle=`): torchrun's agent handles none (it warns for the name "")
  // and its workers get TORCHELASTIC_SIGNALS_TO_HANDLE=''.
  while (!a.signals_to_handle.empty() && pos <= a.signals_to_handle.size()) {
    size_t comma = a.signals_to_handle.find(',', pos);
    const std::string sig = a.signals_to_handle.substr(
        pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (!known.count(sig))
      throw UsageError("--signals-to-handle: got '" + a.signals_to_handle + "': '" + sig +
                       "' is not one of SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2");
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  o.signals_to_handle = a.signals_to_handle;
  if (a.signals_to_handle != "SIGTERM,SIGINT,SIGHUP,SIGQUIT")
    o.notes.push_back("--signals-to-handle " + a.signals_to_handle +
                      ": dtrain's agent stops the workers on SIGTERM, SIGINT, SIGHUP and SIGQUIT");
  o.virtual_local_rank = a.virtual_local_rank;
}

void apply_cluster_args(LaunchOptions& o, const RunArgs& a,
                        const std::function<const char*(const char*)>& env) {
  o.ifname = a.ifname;
  o.dry_run = a.dry_run;
  o.stop_on_stdin_eof = a.stdin_eof;
  o.ssh_identity = a.ssh_identity;
  o.ssh_args = a.ssh_args;
  o.remote_dtrain = a.remote_dtrain;
  if (!a.ssh_port.empty()) {
    o.ssh_port = parse_int("--ssh-port", a.ssh_port, "a port number in 1-65535");
    if (o.ssh_port < 1 || o.ssh_port > 65535) {
      throw UsageError("--ssh-port: got '" + a.ssh_port + "', expected a port number in 1-65535");
    }
  }
  // The engine whose flags (a host list) or environment (a Slurm step) give the job's nodes;
  // none: this node's own flags (engine "local").
  for (const engines::Engine* e : engines::all())
    if (e->adopt(o, a, env)) return;
}

}  // namespace

namespace {

// How long --store-token - waits for its line at most (ssh_launch writes it as the agent
// starts); a shorter --rdzv-timeout bounds it too.
constexpr std::chrono::milliseconds kStoreTokenWait = std::chrono::seconds(60);

// --store-token -: the first line of fd, read a byte at a time so nothing after it is taken
// (an agent started over ssh keeps watching the rest of its stdin for EOF), within `wait` (a
// terminal or an open pipe that stays silent is not waited on for ever).
std::string read_token_line(int fd, std::chrono::milliseconds wait) {
  std::string token;
  char c = 0;
  const auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    // Polled even when no time is left: a line already there is taken (--rdzv-timeout 0).
    const int ready = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count())));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0)
      throw UsageError("--store-token -: no token line arrived on stdin within " +
                       (wait.count() % 1000 == 0 ? std::to_string(wait.count() / 1000) + " s"
                                                 : std::to_string(wait.count()) + " ms") +
                       "; pipe it in (echo \"$TOKEN\" | dtrain run --store-token - ...) or set "
                       "DTRAIN_STORE_TOKEN");
    ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || c == '\n') break;
    if (token.size() >= 4096) throw UsageError("--store-token -: the token on stdin is over 4 KiB");
    token += c;
  }
  if (token.empty()) {
    throw UsageError(
        "--store-token -: no token on the first line of stdin; pipe it in (or set "
        "DTRAIN_STORE_TOKEN)");
  }
  return token;
}

}  // namespace

LaunchOptions run_args_to_options(const RunArgs& a, const std::vector<std::string>& rest) {
  return run_args_to_options(a, rest, process_env());
}

LaunchOptions run_args_to_options(const RunArgs& a, const std::vector<std::string>& rest,
                                  const std::function<const char*(const char*)>& env) {
  LaunchOptions o;
  o.nproc_per_node = parse_nproc(a.nproc.empty() ? "1" : a.nproc);
  auto [min_nodes, max_nodes] = parse_nnodes(a.nnodes.empty() ? "1" : a.nnodes);
  o.nnodes = max_nodes;
  if (min_nodes < max_nodes) o.min_nodes = min_nodes;
  if (!a.node_rank.empty()) {
    o.node_rank = parse_int("--node-rank", a.node_rank, "an integer in 0..nnodes-1");
    if (o.node_rank < 0)
      throw UsageError("--node-rank: got '" + a.node_rank +
                       "', expected an integer in 0..nnodes-1");
  }
  o.rdzv_backend = a.rdzv_backend;
  if (o.rdzv_backend == "etcd" || o.rdzv_backend == "etcd-v2") {
    throw UsageError("--rdzv-backend: got '" + a.rdzv_backend +
                     "'; dtrain hosts its own store: use 'static' or 'c10d'");
  }
  if (o.rdzv_backend != "static" && o.rdzv_backend != "c10d") {
    throw UsageError("--rdzv-backend: got '" + a.rdzv_backend + "', expected 'static' or 'c10d'");
  }
  o.master_addr = a.master_addr.empty() ? "127.0.0.1" : a.master_addr;
  if (!a.master_port.empty()) {
    o.master_port = parse_int("--master-port", a.master_port, "a port number in 0-65535");
    if (o.master_port < 0 || o.master_port > 65535) {
      throw UsageError("--master-port: got '" + a.master_port +
                       "', expected a port number in 0-65535");
    }
  }
  if (!a.rdzv_endpoint.empty()) {
    auto [host, port] = parse_endpoint("--rdzv-endpoint", a.rdzv_endpoint);
    o.master_addr = host;
    o.master_port = port;
  }
  // As torchrun's launcher: an empty run id (`--rdzv-id ''`, PET_RDZV_ID=) is a random one.
  o.rdzv_id = a.rdzv_id.empty() ? random_uuid4_int() : a.rdzv_id;
  o.rdzv_timeout = std::chrono::milliseconds(
      static_cast<int64_t>(parse_seconds("--rdzv-timeout", a.rdzv_timeout) * 1000));
  if (!a.rdzv_conf.empty()) {
    size_t pos = 0;
    while (pos < a.rdzv_conf.size()) {
      size_t comma = a.rdzv_conf.find(',', pos);
      std::string item = a.rdzv_conf.substr(pos, comma - pos);
      auto eq = item.find('=');
      if (eq == std::string::npos) {
        throw UsageError("--rdzv-conf: got '" + a.rdzv_conf + "', expected KEY=VALUE,...");
      }
      std::string key = item.substr(0, eq);
      if (key == "join_timeout" || key == "timeout") {
        o.rdzv_timeout = std::chrono::milliseconds(
            static_cast<int64_t>(parse_seconds("--rdzv-conf " + key, item.substr(eq + 1)) * 1000));
      }
      // Elastic rendezvous (torchrun's key), and how soon a silent agent counts as lost.
      if (key == "last_call_timeout") {
        o.last_call = std::chrono::milliseconds(
            static_cast<int64_t>(parse_seconds("--rdzv-conf " + key, item.substr(eq + 1)) * 1000));
      }
      if (key == "heartbeat_timeout") {
        o.heartbeat_timeout = std::chrono::milliseconds(
            static_cast<int64_t>(parse_seconds("--rdzv-conf " + key, item.substr(eq + 1)) * 1000));
      }
      if (comma == std::string::npos) break;
      pos = comma + 1;
    }
  }
  // After the rendezvous flags, whose timeout bounds the wait.
  o.store_token = a.store_token == "-"
                      ? read_token_line(STDIN_FILENO, std::min<std::chrono::milliseconds>(
                                                          kStoreTokenWait, o.rdzv_timeout))
                      : a.store_token;
  if (a.store_token.empty() && env(param::kStoreToken.name))
    o.store_token = env(param::kStoreToken.name);
  o.standalone = a.standalone;
  if (o.standalone) {
    if (o.nnodes != 1) {
      throw UsageError("--standalone: runs a single node, but --nnodes is " +
                       std::to_string(o.nnodes) + "; drop one of them");
    }
    o.rdzv_backend = "c10d";
    o.master_addr = "localhost";  // torchrun's endpoint localhost:0, and its workers' MASTER_ADDR
    o.master_port = 0;
    // As torchrun: a fresh run id, whatever --rdzv-id said (TORCHELASTIC_RUN_ID, and
    // --log-dir's run directory, differ from run to run).
    o.rdzv_id = random_uuid4();
  }
  o.max_restarts = parse_int("--max-restarts", a.max_restarts, "a non-negative integer");
  if (o.max_restarts < 0) {
    throw UsageError("--max-restarts: got '" + a.max_restarts +
                     "', expected a non-negative integer");
  }
  o.monitor_interval = std::chrono::milliseconds(std::max<int64_t>(
      1, static_cast<int64_t>(parse_seconds("--monitor-interval", a.monitor_interval) * 1000)));
  o.term_timeout = std::chrono::milliseconds(
      static_cast<int64_t>(parse_seconds("--term-timeout", a.term_timeout) * 1000));
  o.log_dir = a.log_dir;
  o.redirects = parse_stream_spec("--redirects", a.redirects);
  o.tee = parse_stream_spec("--tee", a.tee);
  o.role = a.role;
  // An empty role (`--role=`, as torchrun runs it): ROLE_NAME='' and the prefix "[0]:".
  o.malloc_hugepages = a.malloc_hugepages;
  o.bind_cores_to_rank = a.bind_cores_to_rank;
  if (!a.bind_core_list.empty()) {
    if (!a.bind_cores_to_rank) {
      throw UsageError("--bind-core-list '" + a.bind_core_list +
                       "' shares CPUs out only with --bind-cores-to-rank; add that flag");
    }
    o.bind_core_list = launch::parse_cpu_list("--bind-core-list", a.bind_core_list);
  }
  if (a.start_method == "spawn" || a.start_method == "auto" || a.start_method == "forkserver") {
    o.start_method = a.start_method;
  } else if (a.start_method == "fork") {
    o.start_method = "forkserver";
  } else {
    throw UsageError("--start-method: got '" + a.start_method +
                     "', expected auto, spawn, forkserver or fork");
  }
  o.failure_file = a.failure_file;
  if (!a.failure_store.empty()) {
    const auto slash = a.failure_store.find('/');
    if (slash == std::string::npos || slash + 1 == a.failure_store.size()) {
      throw UsageError("--failure-store: got '" + a.failure_store + "', expected HOST:PORT/KEY");
    }
    const std::string endpoint = a.failure_store.substr(0, slash);
    const bool bracketed = !endpoint.empty() && endpoint.front() == '[';
    const auto colon = endpoint.rfind(':');
    // An explicit port; an IPv6 address in brackets.
    if (colon == std::string::npos || (!bracketed && endpoint.find(':') != colon)) {
      throw UsageError("--failure-store: got '" + a.failure_store +
                       "', expected HOST:PORT/KEY (an IPv6 host in brackets: [::1]:PORT/KEY)");
    }
    auto [host, port] = parse_endpoint("--failure-store", endpoint);
    if (port == 0)
      throw UsageError("--failure-store: got '" + a.failure_store +
                       "', expected HOST:PORT/KEY with a port above 0");
    o.failure_store_host = host;
    o.failure_store_port = port;
    o.failure_store_key = a.failure_store.substr(slash + 1);
  }
  o.module = a.module;
  o.no_python = a.no_python;
  if (o.module && o.no_python) {
    throw UsageError("-m/--module and --no-python: choose one (a module needs Python)");
  }
  for (const auto& kv : a.env) {
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw UsageError("--env: got '" + kv + "', expected KEY=VALUE");
    }
    o.extra_env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  apply_cluster_args(o, a, env);
  if (rest.empty()) {
    throw UsageError(
        "missing PROGRAM: give the program to run, and its arguments, after the options");
  }
  size_t first = 0;
  if (rest[0] == "--") first = 1;
  if (first >= rest.size()) {
    throw UsageError(
        "missing PROGRAM after '--': give the program to run, and its arguments, after the "
        "options");
  }
  o.run_path = a.run_path;
  apply_torchrun2_args(o, a);
  o.program = rest[first];
  if (first == 0 && o.program.size() > 1 && o.program[0] == '-') {
    throw UsageError("unknown option '" + o.program +
                     "' (a PROGRAM starting with '-' must follow '--')");
  }
  // As torchrun's argparse: a "--" right after PROGRAM (when none came before it) is dropped,
  // any other is PROGRAM's argument.
  size_t args_from = first + 1;
  if (first == 0 && rest.size() > 1 && rest[1] == "--") args_from = 2;
  o.args.assign(rest.begin() + static_cast<long>(args_from), rest.end());
  return o;
}

namespace {

// What torchrun 2.11 does with `--FLAG=` or `--FLAG ''` (argparse hands its type "" as the
// value), flag by flag; ParseRunArgs.EmptyFlagValuesAsUnderTorchrun
// (tests/unit/launch_options_test.cpp) asks the venv's torchrun for each flag and compares;
// LauncherTest.EmptyRoleAndSignalListRunAsUnderTorchrun runs the two that keep "".
enum class EmptyValue {
  kAsAbsent,  // "" is the flag's default (or falsy where it is read): as without the flag
  kEmpty,     // torchrun runs with "" itself (an empty role name, no signal to handle)
  kRandomId,  // --rdzv-id=: the launcher draws a run id
};
struct EmptyFlag {
  const char* name;    // dashed, without "--"
  EmptyValue goes_on;  // where torchrun goes on
  const char* stops;   // nullptr, or torchrun's error where it stops
};
constexpr EmptyFlag kEmptyFlags[] = {
    {"nnodes", {}, "ValueError: invalid literal for int() with base 10: ''"},
    {"nproc-per-node", {}, "ValueError: Unsupported nproc_per_node value: ''"},
    {"rdzv-backend", {}, "ValueError: The rendezvous backend name must be a non-empty string."},
    {"rdzv-endpoint", EmptyValue::kAsAbsent, nullptr},
    {"rdzv-id", EmptyValue::kRandomId, nullptr},
    {"rdzv-conf", EmptyValue::kAsAbsent, nullptr},
    {"standalone", {}, "error: argument --standalone: ignored explicit argument ''"},
    {"max-restarts", {}, "error: argument --max-restarts: invalid int value: ''"},
    {"monitor-interval", {}, "error: argument --monitor-interval: invalid float value: ''"},
    {"start-method", {}, "error: argument --start-method: invalid choice: ''"},
    {"event-log-handler", {}, "KeyError: ''"},
    {"role", EmptyValue::kEmpty, nullptr},
    {"module", {}, "error: argument -m/--module: ignored explicit argument ''"},
    {"no-python", {}, "error: argument --no-python: ignored explicit argument ''"},
    {"run-path", {}, "error: argument --run-path: ignored explicit argument ''"},
    {"log-dir", EmptyValue::kAsAbsent, nullptr},
    {"redirects", {}, "ValueError: '' does not match 0-3 or R:M,..."},
    {"tee", {}, "ValueError: '' does not match 0-3 or R:M,..."},
    {"local-ranks-filter", EmptyValue::kAsAbsent, nullptr},
    {"duplicate-stdout-filters", EmptyValue::kAsAbsent, nullptr},
    {"duplicate-stderr-filters", EmptyValue::kAsAbsent, nullptr},
    {"node-rank", {}, "error: argument --node-rank: invalid int value: ''"},
    {"master-addr", {}, "ValueError: The hostname of the rendezvous endpoint ':PORT' must be ..."},
    {"master-port", {}, "error: argument --master-port: invalid int value: ''"},
    {"local-addr", EmptyValue::kAsAbsent, nullptr},
    {"logs-specs", {}, "ValueError: Could not find entrypoint under 'torchrun.logs_specs[]' key"},
    {"numa-binding", {}, "error: argument --numa-binding: invalid choice: ''"},
    {"signals-to-handle", EmptyValue::kEmpty, nullptr},
    {"virtual-local-rank",
     {},
     "error: argument --virtual-local-rank: ignored explicit argument ''"},
};

}  // namespace

std::vector<std::string> take_empty_values(std::vector<std::string>& args) {
  CLI::App app{"dtrain run"};
  RunArgs scratch;
  add_run_options(app, scratch);
  std::vector<std::string> kept;  // the flags whose "" means something, dashed
  for (size_t i = 0; i < args.size();) {
    const std::string arg = args[i];
    if (arg == "--" || arg.empty() || arg[0] != '-' || arg == "-") break;  // PROGRAM
    const size_t eq = arg.find('=');
    if (eq == std::string::npos) {
      const CLI::Option* opt = app.get_option_no_throw(arg);
      const bool takes_value = opt != nullptr && opt->get_items_expected_min() > 0;
      if (takes_value && i + 1 < args.size() && args[i + 1].empty() && !opt->get_lnames().empty()) {
        // `--FLAG ''`: argparse hands the type "" as for `--FLAG=`; taken as that, next pass.
        args[i] = "--" + opt->get_lnames().front() + "=";
        args.erase(args.begin() + static_cast<long>(i) + 1);
        continue;
      }
      // A flag that takes its value from the next argument skips it.
      i += takes_value ? 2 : 1;
      continue;
    }
    if (arg.rfind("--", 0) != 0 || eq != arg.size() - 1) {
      ++i;
      continue;
    }
    std::string name = arg.substr(2, eq - 2);
    std::replace(name.begin(), name.end(), '_', '-');
    const auto* flag = std::find_if(std::begin(kEmptyFlags), std::end(kEmptyFlags),
                                    [&](const EmptyFlag& f) { return name == f.name; });
    if (flag == std::end(kEmptyFlags)) {
      // dtrain's own flags: no torchrun to follow; CLI11 would take the next argument.
      throw UsageError(arg + ": an empty value; give one (" + arg + "VALUE) or leave the flag out");
    }
    if (flag->stops != nullptr)
      throw UsageError(arg + ": an empty value; torchrun 2.11 stops on it too (" + flag->stops +
                       "): give one (" + arg + "VALUE) or leave the flag out");
    if (flag->goes_on != EmptyValue::kAsAbsent) kept.push_back(name);
    args.erase(args.begin() + static_cast<long>(i));
  }
  return kept;
}

void apply_empty_values(RunArgs& a, const std::vector<std::string>& names) {
  for (const auto& n : names) {
    if (n == "role") a.role.clear();
    if (n == "signals-to-handle") a.signals_to_handle.clear();
    if (n == "rdzv-id") a.rdzv_id.clear();  // run_args_to_options draws one
  }
}

void refuse_empty_values(const std::vector<std::string>& options) {
  for (const auto& arg : options)
    if (arg.size() > 3 && arg.rfind("--", 0) == 0 && arg.find('=') == arg.size() - 1)
      throw UsageError(arg + ": an empty value; give one (" + arg + "VALUE) or leave the flag out");
}

namespace {

// torchrun's PET_ variable for flag `name` (dashed, without "--"): "nproc-per-node" ->
// PET_NPROC_PER_NODE.
std::string pet_variable(const std::string& name) {
  std::string var = "PET_";
  for (char c : name)
    var += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return var;
}

// Whether flag `name` (dashed, without "--") is among `args`, in any spelling torchrun takes.
bool given_on_command_line(const std::string& name, const std::vector<std::string>& args) {
  std::string underscored = name;
  for (char& c : underscored)
    if (c == '-') c = '_';
  // torchrun's one-letter spellings of the flags that have them.
  std::string short_flag;
  if (name == "redirects") short_flag = "-r";
  if (name == "tee") short_flag = "-t";
  if (name == "module") short_flag = "-m";
  for (const auto& a : args) {
    for (const std::string& f : {"--" + name, "--" + underscored})
      if (a == f || a.rfind(f + "=", 0) == 0) return true;
    if (!short_flag.empty() && a.rfind(short_flag, 0) == 0) return true;  // -r3, -r 3
  }
  return false;
}

}  // namespace

std::string name_env_source(const std::string& what, const std::vector<std::string>& args,
                            const std::function<const char*(const char*)>& env) {
  const size_t at = what.find("--");
  if (at == std::string::npos) return what;
  // The flag's name after "--" (dashes or underscores), its two spellings and its variable.
  std::string name;
  for (size_t i = at + 2; i < what.size(); ++i) {
    const char c = what[i];
    if (!std::islower(static_cast<unsigned char>(c)) && c != '-' && c != '_') break;
    name += c == '_' ? '-' : c;
  }
  if (name.empty() || given_on_command_line(name, args)) return what;
  const std::string var = pet_variable(name);
  if (!env(var.c_str())) return what;
  return what + " (the value came from the environment variable " + var + ")";
}

void apply_empty_pet_variables(RunArgs& a, const std::vector<std::string>& args,
                               const std::function<const char*(const char*)>& env) {
  // What torchrun 2.11 does with PET_<NAME>= (its argparse `env` action takes the empty string
  // as the value; ParseRunArgs.EmptyPetVariablesAsUnderTorchrun asks the venv's torchrun):
  // where it stops, its error; nullptr where it runs as without the variable. (CLI11 skips an
  // empty variable, so those need nothing here.)
  static const std::pair<const char*, const char*> kStops[] = {
      {"nnodes", "ValueError: invalid literal for int() with base 10: ''"},
      {"nproc-per-node", "ValueError: Unsupported nproc_per_node value: ''"},
      {"rdzv-backend", "ValueError: The rendezvous backend name must be a non-empty string."},
      {"standalone", "ValueError: invalid literal for int() with base 10: ''"},
      {"max-restarts", "argparse: invalid int value: ''"},
      {"monitor-interval", "argparse: invalid float value: ''"},
      {"event-log-handler", "KeyError: ''"},
      {"module", "ValueError: invalid literal for int() with base 10: ''"},
      {"no-python", "ValueError: invalid literal for int() with base 10: ''"},
      {"run-path", "ValueError: invalid literal for int() with base 10: ''"},
      {"redirects", "ValueError: '' does not match 0-3 or R:M,..."},
      {"tee", "ValueError: '' does not match 0-3 or R:M,..."},
      {"node-rank", "argparse: invalid int value: ''"},
      {"master-addr", "ValueError: The hostname of the rendezvous endpoint ':29500' must be ..."},
      {"master-port", "argparse: invalid int value: ''"},
      {"virtual-local-rank", "ValueError: invalid literal for int() with base 10: ''"},
  };
  auto empty = [&](const std::string& name) {
    const char* v = env(pet_variable(name).c_str());
    return v != nullptr && *v == '\0' && !given_on_command_line(name, args);
  };
  for (const auto& [name, torchrun] : kStops) {
    if (!empty(name)) continue;
    const std::string var = pet_variable(name);
    throw UsageError(var + " is set but empty; torchrun 2.11 stops on it too (" + torchrun +
                     "): unset " + var + " or give it a value");
  }
  // torchrun runs with an empty role name (ROLE_NAME='', the console prefix "[0]:") and no
  // signal to handle; so does dtrain, as with `--role=` on its command line.
  if (empty("role")) a.role.clear();
  if (empty("signals-to-handle")) a.signals_to_handle.clear();
  // torchrun's launcher draws a run id for an empty one (run_args_to_options does).
  if (empty("rdzv-id")) a.rdzv_id.clear();
}

// torchrun 2.11's long option strings (`get_args_parser()`, --help aside): the flags argparse
// lets a prefix stand for. dtrain's own flags are always spelled out, so that a flag dtrain adds
// never makes a prefix torchrun takes ambiguous.
constexpr const char* kTorchrunFlags[] = {"--nnodes",
                                          "--nproc-per-node",
                                          "--nproc_per_node",
                                          "--rdzv-backend",
                                          "--rdzv_backend",
                                          "--rdzv-endpoint",
                                          "--rdzv_endpoint",
                                          "--rdzv-id",
                                          "--rdzv_id",
                                          "--rdzv-conf",
                                          "--rdzv_conf",
                                          "--standalone",
                                          "--max-restarts",
                                          "--max_restarts",
                                          "--monitor-interval",
                                          "--monitor_interval",
                                          "--start-method",
                                          "--start_method",
                                          "--event-log-handler",
                                          "--event_log_handler",
                                          "--role",
                                          "--module",
                                          "--no-python",
                                          "--no_python",
                                          "--run-path",
                                          "--run_path",
                                          "--log-dir",
                                          "--log_dir",
                                          "--redirects",
                                          "--tee",
                                          "--local-ranks-filter",
                                          "--local_ranks_filter",
                                          "--duplicate-stdout-filters",
                                          "--duplicate_stdout_filters",
                                          "--duplicate-stderr-filters",
                                          "--duplicate_stderr_filters",
                                          "--node-rank",
                                          "--node_rank",
                                          "--master-addr",
                                          "--master_addr",
                                          "--master-port",
                                          "--master_port",
                                          "--local-addr",
                                          "--local_addr",
                                          "--logs-specs",
                                          "--logs_specs",
                                          "--numa-binding",
                                          "--numa_binding",
                                          "--signals-to-handle",
                                          "--signals_to_handle",
                                          "--virtual-local-rank",
                                          "--virtual_local_rank"};

std::vector<std::string> spell_out_abbreviations(std::vector<std::string> args,
                                                 const std::function<void(CLI::App&)>& more,
                                                 const std::vector<std::string>& abbreviated) {
  // CLI11 knows where the options end: parse, spell out the first flag it did not know when
  // that abbreviates one, parse again.
  for (size_t rounds = 0; rounds <= args.size(); ++rounds) {
    CLI::App app{"dtrain run"};
    RunArgs scratch;
    add_run_options(app, scratch);
    if (more) more(app);
    std::vector<std::string> reversed(args.rbegin(), args.rend());
    try {
      app.parse(reversed);
    } catch (const CLI::ParseError&) {
      return args;  // a bad value: the real parse says so
    }
    // CLI11 keeps a flag it does not know and goes on with the options after it: the first
    // of what it left is that flag, or PROGRAM.
    const auto rest = app.remaining();
    if (rest.empty() || rest[0].size() < 3 || rest[0].rfind("--", 0) != 0) return args;
    const auto it = std::find(args.begin(), args.end(), rest[0]);
    if (it == args.end()) return args;
    std::string& arg = *it;
    const size_t eq = arg.find('=');
    const std::string given = arg.substr(0, eq);
    std::vector<std::string> names;  // torchrun's flags it starts
    for (const char* name : kTorchrunFlags)
      if (std::string(name).rfind(given, 0) == 0) names.push_back(name);
    for (const std::string& name : abbreviated)
      if (name.rfind(given, 0) == 0) names.push_back(name);
    if (names.empty()) {
      std::vector<std::string> ours;  // dtrain's own flags it starts
      for (const CLI::Option* opt : app.get_options()) {
        for (const std::string& name : opt->get_lnames())
          if (("--" + name).rfind(given, 0) == 0) ours.push_back("--" + name);
      }
      if (ours.empty()) return args;  // unknown: run_args_to_options says so
      throw UsageError("unknown option " + given +
                       "; dtrain's own flags are not abbreviated (torchrun's are): did you mean " +
                       ours.front() + "?");
    }
    if (names.size() > 1) {
      std::string list;
      for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
      throw UsageError("ambiguous option: " + given + " could match " + list +
                       " (spell out the flag)");
    }
    arg = names.front() + (eq == std::string::npos ? "" : arg.substr(eq));
  }
  return args;
}

LaunchOptions parse_run_args(const std::vector<std::string>& given) {
  std::vector<std::string> args = spell_out_abbreviations(given);
  const auto empty = take_empty_values(args);
  CLI::App app{"dtrain run"};
  RunArgs a;
  add_run_options(app, a);
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }
  const auto remaining = app.remaining();
  const std::vector<std::string> options(
      args.begin(), args.end() - static_cast<std::ptrdiff_t>(remaining.size()));
  refuse_empty_values(options);
  apply_empty_pet_variables(a, options, [](const char* name) { return std::getenv(name); });
  apply_empty_values(a, empty);
  LaunchOptions o = run_args_to_options(a, remaining);
  o.expand_local_rank = true;  // torchrun's ${local_rank} in PROGRAM's arguments
  return o;
}

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

bool runs_with_python(const LaunchOptions& o) {
  return o.module || o.run_path || (!o.no_python && ends_with(o.program, ".py"));
}

void validate_launch_options(LaunchOptions& o) {
  if (!o.store_token.empty() && runs_with_python(o)) {
    throw UsageError(
        "--store-token / DTRAIN_STORE_TOKEN: '" + o.program +
        "' runs in Python, and PyTorch's TCPStore client cannot prove a token, so its workers "
        "could not use the job's store; drop the token for Python programs (the store then "
        "binds only the job's address: a single-node job's is 127.0.0.1), or use C++ workers "
        "(docs/security.md)");
  }
  if (o.nproc_per_node < 1) {
    throw UsageError("--nproc-per-node: got '" + std::to_string(o.nproc_per_node) +
                     "', expected a positive integer");
  }
  if (o.nnodes < 1) {
    throw UsageError("--nnodes: got '" + std::to_string(o.nnodes) +
                     "', expected a positive integer");
  }
  if (o.min_nodes > 0) {
    // Elastic: nodes come and go, so ranks are given out per round in join order.
    if (o.rdzv_backend != "c10d") {
      throw UsageError(
          "--nnodes " + std::to_string(o.min_nodes) + ":" + std::to_string(o.nnodes) +
          " (elastic) needs --rdzv-backend c10d: node ranks are given out in join order each "
          "round; add --rdzv-backend c10d --rdzv-endpoint HOST:PORT");
    }
    if (o.node_rank >= 0) {
      throw UsageError(
          "--node-rank: an elastic job (--nnodes MIN:MAX) gives node ranks out in join order "
          "each round; drop --node-rank");
    }
    if (!engines::named(o.engine).why_not_elastic().empty()) {
      throw UsageError(
          "--nnodes MIN:MAX (elastic) works with agents started by hand (or by your "
          "scheduler), --hostfile/-H or srun, not with the " +
          o.engine + " engine");
    }
  }
  if (o.rdzv_backend == "static" && o.node_rank < 0) o.node_rank = 0;
  if (o.node_rank >= o.nnodes) {
    throw UsageError("--node-rank: got '" + std::to_string(o.node_rank) + "', expected 0.." +
                     std::to_string(o.nnodes - 1) + " (it must be less than --nnodes " +
                     std::to_string(o.nnodes) + ")");
  }
  // One node without a port keeps -1: the agent takes torchrun's 29500, or any free port when
  // 29500 is taken (torchrun fails there). Several nodes must agree on it: 29500.
  if (o.master_port < 0 && o.nnodes > 1) o.master_port = 29500;
  if (o.master_port == 0 && o.nnodes > 1) {
    throw UsageError(
        "--master-port: port 0 (any free port) only works with one node; with --nnodes " +
        std::to_string(o.nnodes) + " every node must know the port: give a number");
  }
  if (!o.ifname.empty() && engines::named(o.engine).ifname_is_local() &&
      ::if_nametoindex(o.ifname.c_str()) == 0) {
    throw UsageError("--ifname: this host (" + this_host_name() + ") has no network interface '" +
                     o.ifname + "'; list them with `ip -br addr`");
  }
  std::string python_from;  // the variable o.python came from, for the error below
  if (o.python.empty()) {
    // DTRAIN_PYTHON, else torchrun's PYTHON_EXEC, else python3 on PATH.
    const char* exec = std::getenv("PYTHON_EXEC");
    if (param::kPython.get_if_set() || !(exec && *exec)) {
      o.python = param::kPython.get();
      if (param::kPython.get_if_set()) python_from = "DTRAIN_PYTHON";
    } else {
      o.python = exec;
      python_from = "PYTHON_EXEC";
    }
  }
  if (runs_with_python(o)) {
    std::string interp =
        o.python.find('/') == std::string::npos ? find_in_path(o.python) : o.python;
    if (interp.empty() || !is_executable_file(interp)) {
      throw UsageError("PROGRAM '" + o.program + "' needs a Python interpreter, but '" + o.python +
                       "'" + (python_from.empty() ? "" : " (from " + python_from + ")") +
                       " was not found or is not executable; " +
                       (python_from == "PYTHON_EXEC"
                            ? "fix or unset PYTHON_EXEC, or set DTRAIN_PYTHON"
                            : "install python3 or set DTRAIN_PYTHON"));
    }
    o.python = interp;
    if (!o.module) {
      struct stat st {};
      if (::stat(o.program.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
        throw UsageError("PROGRAM '" + o.program +
                         "': no such script; give the path of a .py file");
      }
    }
    return;
  }
  if (o.program.find('/') != std::string::npos) {
    struct stat st {};
    if (::stat(o.program.c_str(), &st) != 0) {
      throw UsageError("PROGRAM '" + o.program + "': no such file; give the path of an executable");
    }
    if (!is_executable_file(o.program)) {
      throw UsageError("PROGRAM '" + o.program +
                       "' is not an executable file; chmod +x it, or run a .py script");
    }
  } else {
    std::string found = find_in_path(o.program);
    if (found.empty()) {
      throw UsageError("PROGRAM '" + o.program +
                       "' was not found on PATH; give its path or install it");
    }
    o.program = found;
  }
  if (o.start_method == "forkserver") {
    const auto info = launch::inspect_program(o.program);
    if (!launch::fork_server_can_start(info)) {
      throw UsageError(
          "--start-method forkserver: PROGRAM '" + o.program + "' is " +
          (info.set_id ? std::string("set-user/group-ID (the loader ignores LD_PRELOAD for it)")
           : info.dynamic_elf
               ? std::string("built with a sanitizer, whose runtime must load first")
               : std::string(
                     "not a dynamically linked ELF program (a script or a static binary)")) +
          "; the fork server needs one; use --start-method spawn");
    }
    if (launch::fork_server_library().empty()) {
      throw UsageError(
          "--start-method forkserver: libdtrain_forkserver.so was not found (looked at "
          "$DTRAIN_FORKSERVER_LIB, the build tree and the install prefix); reinstall "
          "dtrain, set DTRAIN_FORKSERVER_LIB, or use --start-method spawn");
    }
  }
}

std::string fork_server_program(const LaunchOptions& o) {
  // `dtrain deepspeed`'s workers: the shim's PROGRAM, which it would exec without python.
  if (const auto ds = launch::deepspeed_shim_of(o)) {
    if (!ds->no_python) return "";
    return ds->program.find('/') != std::string::npos ? ds->program : find_in_path(ds->program);
  }
  return runs_with_python(o) ? "" : o.program;
}

bool uses_fork_server(const LaunchOptions& o) {
  const std::string program = fork_server_program(o);
  if (o.start_method == "spawn" || program.empty()) return false;
  const auto info = launch::inspect_program(program);
  if (!launch::fork_server_can_start(info)) return false;
  // One worker per node gains nothing from sharing a load - unless the job can restart: then
  // the agent keeps the next attempt's server loaded (a standby) and a restart skips the load.
  const bool can_restart = o.max_restarts > 0 || o.min_nodes > 0;
  return o.start_method == "forkserver" ||
         ((o.nproc_per_node > 1 || can_restart) && launch::fork_server_pays_off(info));
}

}  // namespace dtrain
