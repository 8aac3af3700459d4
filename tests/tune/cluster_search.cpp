// A Tune search on a cluster engine, for tests/tune/spark_trials_test.sh, spark_room_test.sh,
// ray_room_test.sh and ssh_warm_test.sh: trials x = 1..N of P processes each, I reports S seconds
// apart; every report carries the ranks' host names (all-gathered as a bitmask of n1/n2), when the
// run's process started and the report was made (wall clock).
//   tune_cluster_search --storage DIR --engine spark|ssh|ray [--master URL] [--hosts LIST]
//       [--ray-address GCS]
//       [--ssh-port P --ssh-identity K --ssh-arg A...] [--trials N] [--nproc P]
//       [--iterations I] [--sleep S] [--kill-trial X] [--max-concurrent M] [--hold X:FILE...]
//       [--gpus G]
// --kill-trial X: trial x = X's rank 1 SIGKILLs itself before its 2nd report, once (its trial
// is retried from its checkpoint, max_failures 1). --max-concurrent M: max_concurrent_trials.
// --hold X:FILE: trial x = X waits for FILE (at most 120 s) before its first iteration, so the
// caller decides when that trial ends. --gpus G: trial_resources.gpus. Prints per trial
//   "trial ID x=X status=S failures=F iterations=I world=W hosts=n1,n2 pid=PID"
//   "span ID start=T0 end=T1 first_report_s=F" (F: time_total_s of the first report of the
//   trial's first run, i.e. from the Tuner starting the trial to its first report)
//   "gpus ID cvd=LIST" (with --gpus: rank 0's CUDA_VISIBLE_DEVICES, "<unset>" when unset)
// and exits 0; "UsageError: ..." exit 2; "error: ..." exit 1. Each worker writes
// TRIAL_DIR/origin_HOST_PID: its grandparent's pid (the warm fork server's, when forked from
// one).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/dtrain.h"
#include "dtrain/tune.h"

namespace fs = std::filesystem;
namespace tune = dtrain::tune;

namespace {

// The parent of process `pid` (0 when it cannot be read).
int parent_of(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(stat.substr(close + 2));
  char state;
  int ppid = 0;
  rest >> state >> ppid;
  return ppid;
}

double wall() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void trial(tune::Config config) {
  const double started = wall();
  const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES");
  auto pg = dtrain::init_process_group();
  char name[256] = {0};
  ::gethostname(name, sizeof name - 1);
  const std::string host = name;
  // Where this worker came from: origin_HOST_PID holds its parent's parent (a warm fork
  // server's pid when it was forked from one, through the launch server of its launch).
  std::ofstream(fs::path(tune::trial_dir()) / ("origin_" + host + "_" + std::to_string(::getpid())))
      << parent_of(::getppid()) << "\n";
  int from = 0;
  if (auto c = tune::get_checkpoint()) std::ifstream(fs::path(*c) / "it") >> from;
  const fs::path once = fs::path(tune::trial_dir()) / "killed_once";
  if (const std::string x = config.at("x").dump(); config.at("hold").contains(x)) {
    const auto hold = config.at("hold").at(x).get<std::string>();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (!fs::exists(hold)) {
      if (std::chrono::steady_clock::now() > deadline)
        throw std::runtime_error("trial x=" + x + ": " + hold + " did not appear within 120 s");
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  for (int it = from + 1; it <= config.at("iterations").get<int>(); ++it) {
    std::this_thread::sleep_for(std::chrono::duration<double>(config.at("sleep").get<double>()));
    if (config.at("x").get<int>() == config.at("kill").get<int>() && it == 2 && pg->rank() == 1 &&
        !fs::exists(once)) {
      std::ofstream(once) << host << " " << ::getpid();
      ::kill(::getpid(), SIGKILL);
    }
    // Bit 0: a rank on n1, bit 1: a rank on n2 (summed over ranks, then > 0).
    auto t = torch::tensor({host == "n1" ? 1.0 : 0.0, host == "n2" ? 1.0 : 0.0}, torch::kFloat64);
    dtrain::all_reduce(t);
    std::string ckpt;
    if (pg->rank() == 0) {
      const fs::path dir = fs::path(tune::trial_dir()) / "ckpt_tmp";
      fs::create_directories(dir);
      std::ofstream(dir / "it") << it;
      ckpt = dir.string();
    }
    tune::report({{"score", it},
                  {"on_n1", t[0].item<double>()},
                  {"on_n2", t[1].item<double>()},
                  {"world", pg->world_size()},
                  {"pid", static_cast<int>(::getpid())},
                  {"t0", started},
                  {"t", wall()},
                  {"cvd", cvd ? cvd : "<unset>"}},
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
  o.trial_timeout = std::chrono::seconds(150);
  o.report_timeout = std::chrono::seconds(60);
  int trials = 2, iterations = 3, kill = 0;
  double sleep_s = 0;
  tune::Config hold = tune::Config::object();  // x -> file
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], v = argv[i + 1];
    if (flag == "--storage")
      o.storage_path = v;
    else if (flag == "--engine")
      o.cluster.engine = v;
    else if (flag == "--master")
      o.cluster.spark.master = v;
    else if (flag == "--hosts")
      o.cluster.ssh.hosts = v;
    else if (flag == "--ray-address")
      o.cluster.ray.address = v;
    else if (flag == "--ssh-port")
      o.cluster.ssh.port = std::stoi(v);
    else if (flag == "--ssh-identity")
      o.cluster.ssh.identity = v;
    else if (flag == "--ssh-arg")
      o.cluster.ssh.args.push_back(v);
    else if (flag == "--trials")
      trials = std::stoi(v);
    else if (flag == "--nproc")
      o.trial_resources.processes = std::stoi(v);
    else if (flag == "--iterations")
      iterations = std::stoi(v);
    else if (flag == "--sleep")
      sleep_s = std::stod(v);
    else if (flag == "--kill-trial")
      kill = std::stoi(v);
    else if (flag == "--max-concurrent")
      o.max_concurrent_trials = std::stoi(v);
    else if (flag == "--gpus")
      o.trial_resources.gpus = std::stod(v);
    else if (flag == "--hold" && v.find(':') != std::string::npos)
      hold[v.substr(0, v.find(':'))] = fs::absolute(v.substr(v.find(':') + 1)).string();
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  try {
    std::vector<tune::Config> xs;
    for (int x = 1; x <= trials; ++x) xs.push_back(x);
    tune::Tuner tuner(trial,
                      tune::Config{{"x", tune::grid_search(xs)},
                                   {"iterations", iterations},
                                   {"sleep", sleep_s},
                                   {"kill", kill},
                                   {"hold", hold}},
                      o);
    const auto grid = tuner.fit();
    for (const auto& t : grid.trials()) {
      const auto& l = t.last_result;
      std::string hosts;
      if (l.value("on_n1", 0.0) > 0) hosts += "n1";
      if (l.value("on_n2", 0.0) > 0) hosts += hosts.empty() ? "n2" : ",n2";
      std::printf("trial %s x=%d status=%s failures=%d iterations=%zu world=%d hosts=%s\n",
                  t.id.c_str(), t.config.at("x").get<int>(), tune::to_string(t.status),
                  t.num_failures, t.history.size(), l.value("world", -1), hosts.c_str());
      double start = 0, end = 0;
      for (const auto& h : t.history) {
        if (start == 0 || h.value("t0", 0.0) < start) start = h.value("t0", 0.0);
        end = std::max(end, h.value("t", 0.0));
      }
      const double first = t.history.empty() ? -1 : t.history.front().value("time_total_s", -1.0);
      std::printf("span %s start=%.3f end=%.3f first_report_s=%.3f\n", t.id.c_str(), start, end,
                  first);
      if (o.trial_resources.gpus > 0)
        std::printf("gpus %s cvd=%s\n", t.id.c_str(), l.value("cvd", "").c_str());
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
