// DeepSpeedDistributor: validate the config, write it to a temporary file, run the Distributor.
#include "dtrain/deepspeed_distributor.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/owned_dir.h"
#include "core/params.h"
#include "dtrain/zero_config.h"
#include "zero/config_text.h"

namespace dtrain {
namespace {

constexpr const char* kEnv = param::kDeepSpeedConfig.name;
// The config's directory: /tmp/dtrain-deepspeed-<pid>-XXXXXX.
constexpr const char* kTempDirStem = "dtrain-deepspeed-";

// A string config is JSON text when it opens with '{', else a path.
bool is_json_text(const std::string& s) {
  const auto first = s.find_first_not_of(" \t\r\n");
  return first != std::string::npos && s[first] == '{';
}

nlohmann::json resolve(const nlohmann::json& c) {
  if (c.is_object()) return c;
  if (c.is_string()) {
    // A path or JSON text, read as DeepSpeed reads either (hjson); keep the JSON itself.
    const std::string s = c.get<std::string>();
    if (is_json_text(s)) return zero::read_config_text(s, "deepspeed_config");
    std::ifstream in(s, std::ios::binary);
    if (!in) throw zero::ConfigError(s + ": cannot read the DeepSpeed config file");
    std::ostringstream text;
    text << in.rdbuf();
    return zero::read_config_text(text.str(), s);
  }
  throw UsageError(
      "DeepSpeedDistributor: deepspeed_config must be a JSON object, a path or JSON text");
}

// No config: null, or an empty string (Spark's distributor then passes `--deepspeed` alone).
bool no_config(const nlohmann::json& c) {
  return c.is_null() || (c.is_string() && c.get<std::string>().empty());
}

// Where an object or JSON text is written for the workers.
std::string written_config(const std::string& dir) { return dir + "/ds_config.json"; }

// The file the workers get: a path given stays the user's, as Spark's distributor passes it on;
// an object or JSON text is written to `dir`; no config, no file ("").
std::string config_file(const nlohmann::json& c, const std::string& dir) {
  if (no_config(c)) return "";
  if (c.is_string() && !is_json_text(c.get<std::string>())) return c.get<std::string>();
  return written_config(dir);
}

}  // namespace

std::string deepspeed_config_path() {
  auto p = param::kDeepSpeedConfig.get_if_set();
  if (!p)
    throw UsageError(std::string("deepspeed_config_path(): $") + kEnv +
                     " is not set; call it in a function a DeepSpeedDistributor runs, and give "
                     "that distributor a deepspeed_config");
  return *p;
}

nlohmann::json deepspeed_config() { return resolve(nlohmann::json(deepspeed_config_path())); }

DistributorOptions DeepSpeedDistributor::make_options(DeepSpeedDistributorOptions& o,
                                                      const std::string& path) {
  if (o.num_gpus < 1)
    throw UsageError("DeepSpeedDistributor: num_gpus must be >= 1, got " +
                     std::to_string(o.num_gpus));
  if (o.nnodes < 1)
    throw UsageError("DeepSpeedDistributor: nnodes must be >= 1, got " + std::to_string(o.nnodes));
  if (o.local_mode && o.nnodes > 1)
    throw UsageError(
        "DeepSpeedDistributor: nnodes = " + std::to_string(o.nnodes) +
        " needs local_mode = false (a cluster engine); local mode runs on this machine only");
  DistributorOptions d = o.distributor;
  d.num_processes = o.num_gpus * o.nnodes;
  d.local_mode = o.local_mode;
  d.use_gpu = o.use_gpu;
  if (!o.local_mode) d.cluster.nodes = o.nnodes;
  if (!path.empty()) d.env[kEnv] = path;
  return d;
}

DeepSpeedDistributor::DeepSpeedDistributor(DeepSpeedDistributorOptions o)
    : config_(no_config(o.deepspeed_config) ? nlohmann::json() : resolve(o.deepspeed_config)),
      dir_(std::make_unique<detail::OwnedTempDir>(kTempDirStem)),
      config_path_(config_file(o.deepspeed_config, dir_->path())),
      distributor_(make_options(o, config_path_)) {
  if (config_.is_null()) return;
  // Fails here, naming the key, rather than in every worker (a throw removes the directory).
  zero::parse_config(config_, o.num_gpus * o.nnodes);
  if (config_path_ != written_config(dir_->path())) return;  // the user's own file
  std::ofstream out(config_path_);
  out << config_.dump(2) << "\n";
  if (!out) throw Error("DeepSpeedDistributor: cannot write " + config_path_);
}

DeepSpeedDistributor::~DeepSpeedDistributor() = default;

void DeepSpeedDistributor::run(const std::string& program, const std::vector<std::string>& args) {
  // What Spark's DeepspeedTorchDistributor runs: the program's arguments, then `--deepspeed`
  // and, with a config, `--deepspeed_config PATH`.
  std::vector<std::string> all = args;
  all.push_back("--deepspeed");
  if (!config_path_.empty()) all.insert(all.end(), {"--deepspeed_config", config_path_});
  distributor_.run(program, all);
}

}  // namespace dtrain
