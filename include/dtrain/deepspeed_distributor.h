// DeepSpeedDistributor: the Distributor with a DeepSpeed config, as Spark's (Databricks')
// DeepspeedTorchDistributor(numGpus, nnodes, localMode, useGpu, deepspeedConfig).
//
//   dtrain::DeepSpeedDistributor d({.num_gpus = 2, .deepspeed_config = config_json});
//   double loss = d.run(train);   // train() calls zero::initialize(model, deepspeed_config_path())
//   d.run("/path/to/train_binary", {"--epochs", "1"});
//   // the program sees: --epochs 1 --deepspeed --deepspeed_config /tmp/.../ds_config.json
//
// A thin layer over dtrain::Distributor. The config is validated on the driver (for the world
// size num_gpus * nnodes, so a bad key fails before any worker starts) and handed to the
// workers as Spark's distributor hands it: programs get their own arguments, then `--deepspeed`
// and `--deepspeed_config PATH`; functions find PATH through deepspeed_config_path(). PATH is
// the user's own file when deepspeed_config names one, else (a JSON object or JSON text) a
// temporary file that lives as long as this object. No config (null, or "") gives programs
// `--deepspeed` alone, as Spark's does. Without a GPU (use_gpu = false) num_gpus is the number
// of CPU processes per node. In cluster mode (local_mode = false) PATH must be on a filesystem
// every node sees (for a temporary file, set TMPDIR to one).
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/distributor.h"

namespace dtrain {
namespace detail {
class OwnedTempDir;
}

struct DeepSpeedDistributorOptions {
  int num_gpus = 1;  // processes per node (GPUs with use_gpu, else CPU processes). Default: 1.
  int nnodes = 1;    // nodes; > 1 needs local_mode = false. Default: 1.
  bool local_mode = true;
  bool use_gpu = false;
  // DeepSpeed's config: a JSON object, or a string holding a path to a JSON file or JSON text;
  // null or "" for none (the program brings its own). Default: none.
  nlohmann::json deepspeed_config;
  // Everything else the Distributor takes (timeout, env, log_dir, cluster...); its
  // num_processes, local_mode and use_gpu are set from the fields above.
  DistributorOptions distributor;
};

// In a worker started by a DeepSpeedDistributor: the path of the config file (also in
// $DTRAIN_DEEPSPEED_CONFIG). Throws UsageError elsewhere.
std::string deepspeed_config_path();
// The config itself, parsed.
nlohmann::json deepspeed_config();

class DeepSpeedDistributor {
 public:
  // Throws zero::ConfigError for an invalid config, UsageError for bad options.
  explicit DeepSpeedDistributor(DeepSpeedDistributorOptions options);
  ~DeepSpeedDistributor();
  DeepSpeedDistributor(const DeepSpeedDistributor&) = delete;
  DeepSpeedDistributor& operator=(const DeepSpeedDistributor&) = delete;

  // The PATH the workers get: the user's file, the temporary one, or "" without a config.
  const std::string& config_path() const { return config_path_; }
  const nlohmann::json& config() const { return config_; }
  Distributor& distributor() { return distributor_; }

  // Function mode, as Distributor::run / run_all.
  template <class F, class... Args>
  requires(!std::is_convertible_v<F, std::string>) auto run(F&& fn, Args&&... args) {
    return distributor_.run(std::forward<F>(fn), std::forward<Args>(args)...);
  }
  template <class F, class... Args>
  requires(!std::is_convertible_v<F, std::string>) auto run_all(F&& fn, Args&&... args) {
    return distributor_.run_all(std::forward<F>(fn), std::forward<Args>(args)...);
  }
  // Program mode: `program args... --deepspeed --deepspeed_config PATH` on every worker
  // (`program args... --deepspeed` without a config).
  void run(const std::string& program, const std::vector<std::string>& args = {});

 private:
  static DistributorOptions make_options(DeepSpeedDistributorOptions& o, const std::string& path);
  nlohmann::json config_;
  std::unique_ptr<detail::OwnedTempDir> dir_;  // removed with this object, or by the next one
                                               // made on the host if this process was killed
  std::string config_path_;
  Distributor distributor_;
};

}  // namespace dtrain
