// The launcher: what `dtrain run` does, as a library call.
//
// One agent per node starts that node's workers with the torchrun environment contract
// (dtrain/env.h), fans their output in with rank prefixes, watches them, and tears the whole
// job down on the first failure. Node 0's agent (or, with c10d rendezvous, the agent that
// binds the endpoint) hosts the job's store for the whole job.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace dtrain {

struct LaunchOptions {
  // ---- what to run ----
  std::string program;            // a binary, a PATH name, a .py script, or (module) a module
  std::vector<std::string> args;  // its arguments
  bool module = false;            // -m: run `python -u -m program args`. Default: false.
  bool no_python = false;         // --no-python: exec program even if it ends in .py.
  bool run_path = false;          // --run-path: program is a Python file, whatever its name.
  std::string python;             // interpreter for .py/-m. Default: $DTRAIN_PYTHON, else python3.

  // ---- sizes ----
  int nproc_per_node = 1;  // workers on this node. Default: 1.
  int nnodes = 1;          // nodes in the job (elastic: the most, MAX). Default: 1.
  // Elastic (--nnodes MIN:MAX with MIN < MAX, c10d rendezvous; src/launch/elastic_rendezvous.h):
  // the fewest nodes the job runs on. 0 = not elastic. Default: 0.
  int min_nodes = 0;
  std::chrono::milliseconds last_call{
      std::chrono::seconds(30)};  // elastic: wait for more after MIN.
  std::chrono::milliseconds heartbeat_timeout{
      0};  // a silent agent is lost after this; 0 = max(10 s, 50 ticks).
  int node_rank =
      -1;  // this node's rank; -1 = assigned in join order (c10d). Default: 0 for static.
  // Where several agents of the job share a host (engine "ray": bundles of one placement group
  // placed on one node), the workers are numbered per host, as Ray Train's TorchTrainer
  // numbers them: LOCAL_RANK = first_local_rank + i, LOCAL_WORLD_SIZE = host_world_size,
  // NODE_RANK = host_rank (the host's index among the job's hosts). GROUP_RANK stays this
  // agent's node_rank, as torchrun's. host_rank -1: this agent is its host's only one
  // (LOCAL_RANK i, LOCAL_WORLD_SIZE nproc_per_node, no NODE_RANK). Default: -1.
  int host_rank = -1;
  int first_local_rank = 0;  // with host_rank >= 0
  int host_world_size = 0;   // with host_rank >= 0; >= first_local_rank + nproc_per_node
  // Elastic: when one of this node's workers is the root cause of a failure, this agent leaves
  // the job (exits with the worker's code) instead of restarting its workers; the other agents
  // meet again without it (Horovod elastic's blacklisting of a failed host; set by `dtrain
  // horovodrun --min-np`). Default: false.
  bool leave_on_worker_failure = false;

  // ---- rendezvous ----
  std::string rdzv_backend = "static";  // "static" (node ranks given) or "c10d" (joined in order).
  std::string master_addr = "127.0.0.1";  // store host; workers get it as MASTER_ADDR.
  int master_port = -1;          // store port; -1 = not given: 29500 (torchrun's default), on
                                 // one node a free port when 29500 is taken; 0 = a free port.
  std::string rdzv_id = "none";  // job id: agents of one job must agree. Default: "none".
  std::chrono::milliseconds rdzv_timeout{std::chrono::seconds(900)};  // wait for all nodes.
  bool standalone = false;  // one node, c10d on a free local port.
  // The job's store serves only clients that prove this token (docs/security.md): the agents,
  // and C++ workers, which get it as DTRAIN_STORE_TOKEN. From --store-token, else the
  // environment's DTRAIN_STORE_TOKEN. Refused for Python programs: PyTorch's TCPStore client
  // cannot send it. Default: empty (any client, as torchrun's store).
  std::string store_token;

  // ---- workers ----
  int max_restarts = 0;  // restarts of the whole worker group after a failure.
  std::chrono::milliseconds monitor_interval{
      100};  // poll tick (deaths are seen at once via SIGCHLD).
  std::chrono::milliseconds term_timeout{std::chrono::seconds(5)};  // SIGTERM -> SIGKILL grace.
  std::string role = "default";  // ROLE_NAME, and the log prefix "[<role><rank>]:".
  // If set: torchrun's layout, <log_dir>/<run_id>_<random>/attempt_K/<local rank>/ with
  // error.json (the worker's TORCHELASTIC_ERROR_FILE) and, as torchrun, stdout.log and
  // stderr.log of the streams `redirects` or `tee` names (tee = {{-1, 3}}: every rank's full
  // output). Without it, those files and the filtered copies go to a kept
  // $TMPDIR/dtrain-logs-XXXXXX that `dtrain run` names (torchrun keeps a torchelastic_ one),
  // and the error files to a temporary directory removed at exit.
  std::string log_dir;
  // Per local rank (-1 = every rank) bit mask of streams: 1 stdout, 2 stderr.
  std::map<int, int> redirects;  // these streams go to the log files only (not the console).
  std::map<int, int> tee;        // these streams go to both (the console gets every stream
                                 // not redirected, and a teed one even when it is).
  // --local-ranks-filter: the console shows only these local ranks' output (empty: every
  // rank's); the others' still reach the log files.
  std::set<int> local_ranks_filter;
  // --duplicate-stdout/stderr-filters: the console's lines holding any of these strings are
  // also copied, prefixed, to attempt_K/filtered_stdout.log (filtered_stderr.log) in the log
  // directory, one file for the attempt's ranks, as torchrun does.
  std::vector<std::string> duplicate_stdout_filters, duplicate_stderr_filters;
  // The console lines' prefix, torchrun's TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE (a Python
  // string.Template: ${role_name}, ${rank}, ${local_rank}). Empty: "[${role_name}${rank}]:"
  // (torchrun's default has the local rank; dtrain's engines gather several hosts' output on
  // one console, where only the global rank tells the ranks apart).
  std::string log_line_prefix_template;
  std::map<std::string, std::string> extra_env;  // added to every worker's environment.
  // torchrun's --signals-to-handle, given to the workers as TORCHELASTIC_SIGNALS_TO_HANDLE
  // (as torchrun does; dtrain's agent itself stops the workers on SIGTERM, SIGINT, SIGHUP and
  // SIGQUIT whatever it says).
  std::string signals_to_handle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  // torchrun's macro: `${local_rank}` (and `$local_rank`) in PROGRAM's arguments is each
  // worker's local rank, and `$$` is `$` (Python's string.Template.safe_substitute, applied to
  // everything after the executable, as torchrun does). parse_run_args and `dtrain run` set
  // it; false (the default) passes the arguments as they are, as DeepSpeed's and Horovod's
  // launchers do.
  bool expand_local_rank = false;
  // torchrun's --virtual-local-rank: every worker gets LOCAL_RANK 0 and sees one GPU, its local
  // rank's (CUDA_VISIBLE_DEVICES: that entry of the agent's list, else the local rank).
  bool virtual_local_rank = false;
  // torchrun options accepted without an effect here, one line each saying what dtrain does
  // instead; `dtrain run` prints them when it starts.
  std::vector<std::string> notes;
  int stderr_tail_lines = 20;  // lines of the failing rank's stderr in the failure summary.
  // Give workers GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (appended to any GLIBC_TUNABLES they
  // would get): malloc backs its heap with transparent huge pages, which cuts a libtorch
  // worker's start-up (~40 MB of heap touched while loading) by ~20% where page faults are
  // costly, as on VMs. glibc >= 2.35 (older ones ignore it). Default: false.
  bool malloc_hugepages = false;
  // --bind-cores-to-rank (DeepSpeed's launcher flag): bind each local rank to its own share of
  // the node's cores, OMP_NUM_THREADS = that share unless set (src/launch/cpu_binding.h).
  // Default: false.
  bool bind_cores_to_rank = false;
  // --bind-core-list: the logical CPUs to share out instead of the node's physical cores.
  std::vector<int> bind_core_list;
  // How workers start (--start-method). "spawn": each is fork+exec'd and loads its libraries
  // itself. "forkserver": the program is started once with libdtrain_forkserver.so preloaded;
  // once its shared libraries are loaded and initialised, the workers are forked from it
  // (each runs the program's own constructors and main() with its rank's environment, and
  // skips the destructors of those libraries at exit). For dynamically linked programs only.
  // "auto": forkserver when the program links libtorch/libc10/libdtrain directly and there
  // are two or more workers per node or the job can restart (max_restarts > 0, or elastic),
  // else spawn. Python programs always spawn (torchrun's start method, too, only applies to
  // functions). torchrun's "fork" means forkserver. While a job that can still restart runs,
  // the agent keeps the next attempt's fork server loaded and waiting (a standby: one more
  // process holding the program's libraries, no program code run), so a restart forks its
  // workers at once instead of loading libtorch again (~1 s on a loaded 2-core VM).
  // Default: "auto".
  std::string start_method = "auto";
  // If set: when the job fails, its root cause is written there (atomically) as one JSON
  // object: time, host, node_rank, rank (-1: not a worker), local_rank, pid, exit_code,
  // signal, reason, stderr_tail (lines), error_file, error_file_contents. Programs that drive
  // dtrain (the Distributor) read it instead of parsing the console. Default: none.
  std::string failure_file;
  // If set (--failure-store HOST:PORT/KEY): the same JSON is also stored under KEY on the
  // TCPStore at HOST:PORT by every agent that reports it, for programs that drive dtrain on
  // several hosts, where a file on one host is out of their reach (the Distributor in
  // cluster mode). Each failed attempt overwrites the previous one. Default: none.
  std::string failure_store_host;
  int failure_store_port = 0;
  std::string failure_store_key;

  // ---- clusters (docs/clusters.md) ----
  // Where the sizes and addresses came from: "local" (flags), "slurm" (a Slurm step: srun
  // --ntasks-per-node=1 dtrain run ...) or "ssh" (a host file). Default: "local".
  std::string engine = "local";
  // The job's hosts in node order with their worker counts (Slurm step or host file).
  std::vector<std::pair<std::string, int>> hosts;
  // Workers get GLOO_SOCKET_IFNAME=ifname: Gloo's traffic goes over that interface (needed
  // when a host name resolves to a loopback address, as Debian's 127.0.1.1 entry does).
  std::string ifname;
  // Print the plan (engine, hosts, ranks per host, master address and port), check every
  // host is reachable, start nothing. Default: false.
  bool dry_run = false;
  // ssh launch (engine "ssh"): how to reach each host, and the dtrain binary there.
  int ssh_port = 0;                   // -p PORT; 0 = ssh's default. Default: 0.
  std::string ssh_identity;           // -i FILE. Default: ssh's default keys.
  std::vector<std::string> ssh_args;  // extra arguments before the host (e.g. -F cfg, -o K=V).
  std::string remote_dtrain;          // dtrain on the hosts. Default: this dtrain's own path.
  // Internal: an agent started over ssh stops its workers and exits when its stdin reaches
  // EOF (the launching dtrain closed it, or the ssh connection broke). Default: false.
  bool stop_on_stdin_eof = false;
};

// Parses `dtrain run` arguments (torchrun's flags, both spellings). Throws UsageError with a
// message naming the flag, the value given and the form expected. Does not validate the
// program; validate_launch_options() does.
LaunchOptions parse_run_args(const std::vector<std::string>& args);

// Checks the options and resolves the program (PATH lookup, executability, .py existence).
// Throws UsageError naming the flag, the value and the form expected.
void validate_launch_options(LaunchOptions& options);

// Whether this node's workers start from a fork server (start_method, resolved as above).
bool uses_fork_server(const LaunchOptions& options);

// Runs the job on this node and returns the exit code `dtrain run` exits with:
// 0 success; a failing worker's exit code (128+N for signal N); 128+N when the agent got
// signal N (SIGINT, SIGTERM, SIGHUP); 1 for rendezvous or store errors. Throws UsageError
// for invalid options (exit code 2). Never returns while one of its workers is alive.
int run_launch(LaunchOptions options);

}  // namespace dtrain
