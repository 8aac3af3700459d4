// Internals of `dtrain run` parsing shared by the CLI and the tests.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/launch.h"

namespace CLI {
class App;
}

namespace dtrain {

// Raw flag values as typed; run_args_to_options() checks and converts them.
struct RunArgs {
  std::string nproc = "1";
  std::string nnodes = "1";
  std::string node_rank;
  std::string master_addr = "127.0.0.1";
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
  std::string start_method = "spawn";
  std::string unused_run_path;
  std::vector<std::string> env;
  bool malloc_hugepages = false;
  std::string failure_file;
};

// Declares every `dtrain run` flag on `run`, bound to `a`.
CLI::App& add_run_options(CLI::App& run, RunArgs& a);
LaunchOptions run_args_to_options(const RunArgs& a, const std::vector<std::string>& rest);

std::map<int, int> parse_stream_spec(const std::string& flag, const std::string& value);
std::pair<std::string, int> parse_endpoint(const std::string& flag, const std::string& value);
bool runs_with_python(const LaunchOptions& o);

}  // namespace dtrain
