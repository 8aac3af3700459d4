// Elastic `dtrain horovodrun` (--min-np/--max-np/--host-discovery-script): Horovod's elastic
// driver on dtrain's elastic launcher (src/horovod/horovodrun_elastic.cpp). No libtorch.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace dtrain::hvd {

struct ElasticFlags {
  int np = -1;                        // -np: processes to start with (checked against min/max)
  int min_np = -1;                    // --min-np (default: -np)
  int max_np = -1;                    // --max-np (default: no limit)
  std::string discovery_script;       // --host-discovery-script
  int slots = 1;                      // --slots: for discovered hosts printed without ":slots"
  int start_timeout_s = 30;           // --start-timeout: wait this long for min_np slots at start
  int elastic_timeout_s = 600;        // --elastic-timeout: the survivors wait this long for min_np
  int reset_limit = 100;              // --reset-limit: restarts of the workers after failures
  double discovery_interval_s = 1.0;  // how often the script runs while the job runs
  // Hosts that are not this machine get their agent over ssh (as `dtrain run -H` does):
  int ssh_port = 0;                   // -p/--ssh-port (0: ssh's default)
  std::string ssh_identity;           // -i/--ssh-identity-file
  std::vector<std::string> ssh_args;  // --ssh-arg ARG (repeatable): before the host, e.g. -F CONFIG
};

// The script's output: `host:slots` or `host` (then `default_slots`) per line; blank lines
// and `#` comments are skipped. Throws UsageError naming the line that is wrong.
std::vector<std::pair<std::string, int>> parse_discovery_output(const std::string& output,
                                                                int default_slots,
                                                                const std::string& script);
// Runs the script (an executable file, no arguments) and parses what it printed. Throws
// UsageError when it is missing or not executable, Error when it fails or hangs (> 30 s).
std::vector<std::pair<std::string, int>> run_discovery(const std::string& script,
                                                       int default_slots);

// Checks the elastic flags (UsageError saying what is wrong). Fills the defaults.
void validate_elastic_flags(ElasticFlags& f);

// The elastic driver: hosts the job's store, runs the discovery script, starts one
// `dtrain run --nnodes MIN:MAX --rdzv-backend c10d` agent per host (`self_args` + an
// environment marker make `dtrain horovodrun` that agent; on a host that is not this machine
// it starts over ssh and stops when its ssh's stdin closes), blacklists a host whose agent left
// after one of its workers failed, and starts agents for hosts the script adds.
int run_elastic_driver(const ElasticFlags& f, const std::vector<std::string>& self_args);

// Whether this process is one of the driver's agents (DTRAIN_HVD_ELASTIC_AGENT is set); then
// agent_spec receives the marker's value.
bool is_elastic_agent(std::string* agent_spec);

}  // namespace dtrain::hvd
