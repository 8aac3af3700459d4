// Internals of `dtrain run` parsing shared by the CLI and the tests.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/hostfile.h"  // parse_hostfile, parse_host_list
#include "core/paths.h"     // find_in_path, shell_quote
#include "dtrain/launch.h"

namespace CLI {
class App;
}

namespace dtrain {

// Raw flag values as typed; run_args_to_options() checks and converts them.
struct RunArgs {
  std::string nproc;   // empty: 1, or each host's slots in a host file
  std::string nnodes;  // empty: 1, or the Slurm step's node count
  std::string node_rank;
  std::string master_addr;  // empty: 127.0.0.1, or the Slurm step's / host file's first host
  std::string master_port;
  std::string rdzv_endpoint;
  std::string rdzv_backend = "static";
  std::string rdzv_id = "none";
  std::string rdzv_timeout = "900";
  std::string rdzv_conf;
  bool standalone = false;
  std::string max_restarts = "0";
  std::string monitor_interval = "0.1";
  std::string term_timeout = "5";
  std::string log_dir;
  std::string redirects = "0";
  std::string tee = "0";
  std::string role = "default";
  bool module = false;
  bool no_python = false;
  std::string start_method = "auto";
  bool run_path = false;
  // torchrun 2.x options (see add_run_options)
  std::string event_log_handler = "null";
  std::string local_ranks_filter;
  std::string duplicate_stdout_filters, duplicate_stderr_filters;  // "a,b" (",," is a comma)
  std::string local_addr;
  std::string logs_specs;
  std::string numa_binding;
  std::string signals_to_handle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  bool virtual_local_rank = false;
  std::vector<std::string> env;
  bool malloc_hugepages = false;
  bool bind_cores_to_rank = false;
  std::string bind_core_list;
  std::string failure_file;
  std::string failure_store;
  std::string store_token;  // --store-token TOKEN, '-': the first line of stdin
  // clusters
  std::string hostfile;
  std::string host_list;  // -H host1:2,host2:2
  std::string ssh_port;
  std::string ssh_identity;
  std::vector<std::string> ssh_args;
  std::string remote_dtrain;
  std::string ifname;
  bool dry_run = false;
  bool no_slurm = false;
  bool stdin_eof = false;  // internal (--stop-on-stdin-eof): set by the ssh launcher
  // internal (--log-line-prefix-template): the launching host's
  // TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, passed by the ssh launcher to the other hosts' agents
  std::string log_line_prefix_template;
};

// Declares every `dtrain run` flag on `run`, bound to `a`.
CLI::App& add_run_options(CLI::App& run, RunArgs& a);
// torchrun's (argparse's) abbreviated flags: `args` (`dtrain run`'s, up to PROGRAM or a "--")
// with each long flag given as a prefix of exactly one of torchrun's option strings
// ("--nnode 2", "--nproc_per=2") spelled out. A prefix of several is a UsageError naming them,
// as argparse's "ambiguous option"; a prefix of dtrain's own flags only is an unknown option
// (they are not abbreviated). PROGRAM's own arguments are left alone. `more` declares flags the
// caller adds beside add_run_options' (dtrain's --mlflow-run-id); `abbreviated` names more
// flags that abbreviate as torchrun's (`dtrain launch`'s --use-env and --use_env, as
// torch.distributed.launch's parser takes them).
std::vector<std::string> spell_out_abbreviations(
    std::vector<std::string> args, const std::function<void(CLI::App&)>& more = nullptr,
    const std::vector<std::string>& abbreviated = {});
// torchrun 2.11's answer to `--FLAG=` (argparse takes "" as the value) among `args` (`dtrain
// run`'s, up to PROGRAM or "--"): where torchrun stops, a UsageError naming the flag (with
// torchrun's error); where it goes on, the argument is removed (CLI11 would take the next
// argument as its value) and, where "" is not the flag's default, its name (dashed) returned for
// apply_empty_values(): an empty role, no signal to handle, a random run id. dtrain's own flags
// have no torchrun to follow: an empty value is a UsageError.
std::vector<std::string> take_empty_values(std::vector<std::string>& args);
void apply_empty_values(RunArgs& a, const std::vector<std::string>& names);
// Throws UsageError for a `--flag=` with an empty value among `options` (the arguments before
// PROGRAM): CLI11 would take the next argument as its value (`--role= true sh` ran sh).
void refuse_empty_values(const std::vector<std::string>& options);
// `what` (an error about a flag, e.g. "--nproc-per-node: got 'abc' ...") with the PET_ variable
// it names when that flag is not among `args` but the variable is set through `env`: the
// value came from there (torchrun's PET_<NAME> fallback), so the user is told where to look.
std::string name_env_source(const std::string& what, const std::vector<std::string>& args,
                            const std::function<const char*(const char*)>& env);
// torchrun's answer to a PET_<NAME> variable that is set but empty, for the options not among
// `args` (those before PROGRAM): a UsageError naming the variable where torchrun 2.11 stops on
// it (PET_NNODES=, PET_MAX_RESTARTS=, PET_STANDALONE=, ...); an empty role, no signal to handle and
// an empty run id in `a` for PET_ROLE=, PET_SIGNALS_TO_HANDLE= and PET_RDZV_ID= (torchrun runs so;
// a random run id, as torchrun's); nothing where torchrun runs as without the variable
// (PET_LOG_DIR=, ...).
void apply_empty_pet_variables(RunArgs& a, const std::vector<std::string>& args,
                               const std::function<const char*(const char*)>& env);
LaunchOptions run_args_to_options(const RunArgs& a, const std::vector<std::string>& rest);
// The same, reading Slurm's variables through `env` (tests pass a map).
LaunchOptions run_args_to_options(const RunArgs& a, const std::vector<std::string>& rest,
                                  const std::function<const char*(const char*)>& env);

// The `dtrain run` arguments that start node `node_rank`'s agent of an ssh launch.
std::vector<std::string> agent_args(const LaunchOptions& o, int node_rank);
// `ssh [--ssh-arg...] -o BatchMode=yes -o ConnectTimeout=10 [-p PORT] [-i KEY] HOST`: what runs
// a command on HOST (appended as one word) for an ssh launch.
std::vector<std::string> ssh_command(const LaunchOptions& o, const std::string& host);
// dtrain's path on the hosts: --remote-dtrain, else this program's own.
std::string remote_dtrain(const LaunchOptions& o);
// Runs a host-file job: one agent per host over ssh (src/launch/ssh_launch.cpp).
int run_ssh_launch(const LaunchOptions& o);
// ssh HOST 'test -x DTRAIN' on every host of `o` at once: per host "" when it is reachable
// and has dtrain, else why not. Bounded by ssh's ConnectTimeout and a hard 30 s.
std::vector<std::string> check_ssh_hosts(const LaunchOptions& o);
// Runs this node's agent (src/launch/agent.cpp); returns `dtrain run`'s exit code.
int run_agent(LaunchOptions options);
// --dry-run: prints the plan and checks the hosts (src/launch/dry_run.cpp); 0 when every host
// is reachable, else 2.
int print_plan(const LaunchOptions& o);

std::map<int, int> parse_stream_spec(const std::string& flag, const std::string& value);
std::pair<std::string, int> parse_endpoint(const std::string& flag, const std::string& value);
bool runs_with_python(const LaunchOptions& o);
// The program a fork server would start for `o`'s workers: PROGRAM, or for a `dtrain deepspeed`
// job (launch/deepspeed_worker.h) the shim's PROGRAM (looked up on PATH as its exec would); ""
// when the workers run in Python. uses_fork_server() decides on this program.
std::string fork_server_program(const LaunchOptions& o);

}  // namespace dtrain
