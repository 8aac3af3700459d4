// A tune::Tuner driver for the cluster tests (tests/cluster/tune_test.sh, tests/ray/ray_test.sh):
// a search whose trials are Distributor jobs with local_mode = false on a cluster engine.
//   tune_cluster_driver --storage DIR --engine ssh|slurm|mpi|ray [--hosts LIST] [--ssh-port P]
//                       [--ssh-identity K] [--ssh-arg A]... [--nodes N] [--nproc N]
//                       [--mpi-launcher L] [--ray-address A] [--trials N] [--sleep S]
//                       [--inject-failure 0|1]
// Trials x = 1 .. N (default 2), 2 processes each, 3 reports each with a checkpoint, S seconds
// (default 0) apart; trial x = 2 throws on rank 1 at its 2nd iteration once (max_failures 1;
// --inject-failure 0: it does not) and is restarted from its checkpoint. Every report carries
// the all-reduced rank sum, how many ranks run on host n2, and when the run started and the
// report was made (wall clock). Prints one line per trial:
//   "trial ID x=X status=S failures=F iterations=I rank_sum=R on_n2=N world=W restored=C"
// and "span ID start=T0 end=T1" (the first report's run start, the last report's time; s since
// the epoch), then exits 0; or "UsageError: ..." (exit 2), or "error: ..." (exit 1).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/dtrain.h"
#include "dtrain/tune.h"

namespace fs = std::filesystem;
namespace tune = dtrain::tune;

namespace {

double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void trainable(tune::Config config) {
  const double t0 = wall_now();
  auto pg = dtrain::init_process_group();
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  const double x = config.at("x").get<double>();
  int start = 0;
  if (auto ckpt = tune::get_checkpoint()) std::ifstream(fs::path(*ckpt) / "state") >> start;
  const fs::path marker = fs::path(tune::trial_dir()) / "failed_once";
  for (int it = start + 1; it <= 3; ++it) {
    std::this_thread::sleep_for(std::chrono::duration<double>(config.value("sleep", 0.0)));
    if (x == 2 && it == 2 && pg->rank() == 1 && config.value("inject_failure", true) &&
        !fs::exists(marker)) {
      std::ofstream(marker) << host;
      throw std::runtime_error(std::string("injected failure on rank 1 at ") + host);
    }
    auto t =
        torch::tensor({static_cast<double>(pg->rank() + 1), std::string(host) == "n2" ? 1.0 : 0.0},
                      torch::kFloat64);
    dtrain::all_reduce(t);
    std::string ckpt;
    if (pg->rank() == 0) {
      const fs::path tmp = fs::path(tune::trial_dir()) / "tmp_ckpt";
      fs::create_directories(tmp);
      std::ofstream(tmp / "state") << it;
      ckpt = tmp.string();
    }
    tune::report({{"score", x * it},
                  {"rank_sum", t[0].item<double>()},
                  {"on_n2", t[1].item<double>()},
                  {"world", pg->world_size()},
                  {"restored", start},
                  {"t0", t0},
                  {"t", wall_now()}},
                 ckpt);
  }
}

}  // namespace

int main(int argc, char** argv) {
  dtrain::init(argc, argv);
  tune::TuneOptions o{.metric = "score",
                      .mode = "max",
                      .trial_resources = {.processes = 2},
                      .local_mode = false,
                      .max_failures = 1,
                      .verbose = true};
  o.trial_timeout = std::chrono::seconds(120);
  o.report_timeout = std::chrono::seconds(60);
  int trials = 2;
  double sleep_s = 0;
  bool inject_failure = true;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--storage")
      o.storage_path = value;
    else if (flag == "--engine")
      o.cluster.engine = value;
    else if (flag == "--hosts")
      o.cluster.hosts = value;
    else if (flag == "--ssh-port")
      o.cluster.ssh_port = std::stoi(value);
    else if (flag == "--ssh-identity")
      o.cluster.ssh_identity = value;
    else if (flag == "--ssh-arg")
      o.cluster.ssh_args.push_back(value);
    else if (flag == "--nodes")
      o.cluster.nodes = std::stoi(value);
    else if (flag == "--nproc")
      o.trial_resources.processes = std::stoi(value);
    else if (flag == "--mpi-launcher")
      o.cluster.mpi_launcher = value;
    else if (flag == "--ray-address")
      o.cluster.ray.address = value;
    else if (flag == "--trials")
      trials = std::stoi(value);
    else if (flag == "--sleep")
      sleep_s = std::stod(value);
    else if (flag == "--inject-failure")
      inject_failure = value != "0";
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  try {
    std::vector<tune::Config> xs;
    for (int x = 1; x <= trials; ++x) xs.push_back(x);
    tune::Tuner tuner(
        trainable,
        tune::Config{
            {"x", tune::grid_search(xs)}, {"sleep", sleep_s}, {"inject_failure", inject_failure}},
        o);
    auto results = tuner.fit();
    for (const auto& t : results.trials()) {
      const auto& l = t.last_result;
      std::printf(
          "trial %s x=%d status=%s failures=%d iterations=%zu rank_sum=%g on_n2=%g world=%d "
          "restored=%d\n",
          t.id.c_str(), t.config.at("x").get<int>(), tune::to_string(t.status), t.num_failures,
          t.history.size(), l.value("rank_sum", -1.0), l.value("on_n2", -1.0), l.value("world", -1),
          l.value("restored", -1));
      double start = 0, end = 0;
      for (const auto& h : t.history) {
        const double a = h.value("t0", 0.0), b = h.value("t", 0.0);
        if (start == 0 || a < start) start = a;
        end = std::max(end, b);
      }
      std::printf("span %s start=%.3f end=%.3f\n", t.id.c_str(), start, end);
    }
    std::fflush(stdout);
    return 0;
  } catch (const dtrain::UsageError& e) {
    std::printf("UsageError: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    return 1;
  }
}
