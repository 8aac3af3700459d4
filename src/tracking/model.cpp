// dtrain::mlflow::log_model: a libtorch module as an MLflow model (weights + MLmodel).
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "dtrain/mlflow.h"

namespace fs = std::filesystem;

namespace dtrain::mlflow {

void log_model(Run& run, const torch::nn::Module& module, const std::string& artifact_path) {
  if (!run.active()) return;
  fs::path dir =
      fs::temp_directory_path() / ("dtrain-model-" + std::to_string(getpid()) + "-" + run.id());
  fs::create_directories(dir / "data");
  {
    torch::serialize::OutputArchive archive;
    module.save(archive);
    archive.save_to((dir / "data" / "model.pt").string());
  }
  int64_t parameters = 0;
  for (const auto& p : module.parameters()) parameters += p.numel();
  std::time_t now = std::time(nullptr);
  char utc[32];
  std::strftime(utc, sizeof utc, "%Y-%m-%d %H:%M:%S", std::gmtime(&now));
  {
    std::ofstream mlmodel(dir / "MLmodel");
    mlmodel
        << "artifact_path: " << artifact_path << "\n"
        << "flavors:\n"
        << "  dtrain_libtorch:\n"
        << "    data: data/model.pt\n"
        << "    format: torch::serialize::OutputArchive (load with torch::load or torch.jit.load)\n"
        << "    module: " << module.name() << "\n"
        << "    parameters: " << parameters << "\n"
        << "    libtorch_version: " << TORCH_VERSION << "\n"
        << "run_id: " << run.id() << "\n"
        << "utc_time_created: '" << utc << "'\n";
  }
  run.log_artifact(dir.string(), artifact_path);
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace dtrain::mlflow
