// A Distributor driver on a cluster engine for tests/spark/spark_test.sh, tests/ray/ray_test.sh
// and their benchmarks.
//   engine_driver [--engine spark|ray] [--nproc N] [--fail-rank R] [--crash-rank R]
//                 [--crash-host H] [--program PATH [ARG]...] [--sleep-rank R|all]
//                 [--exit-rank R --exit-code C] [--kill-rank R]
//     spark (the default): --master URL [--per-task K] [--slot-timeout S] [--keep-app 0|1]
//                 [--app-idle S]
//     ray:        --ray-address ADDR [--per-bundle K] [--strategy S] [--cpus C]
//                 [--placement-timeout S] [--keep-driver 0|1]
// --sleep-rank: that rank (or every rank) sleeps 10 minutes after the all-reduce, so the test
// can SIGKILL the driver while all the agents and workers are known to be alive.
// --exit-rank R --exit-code C / --kill-rank R: that rank exits with code C (std::_Exit) or
// SIGKILLs itself before the all-reduce, while the others wait in it (bench/spark_bench.sh's
// failure cases, as its TorchDistributor peer does them).
// --crash-host H: the worker of local rank 1 on host H raises SIGSEGV (Spark places the
// tasks, so which rank runs on H is known only there).
// --then: the flags after it are the next run() in the same process (the first run's settings,
// then these; with engine "spark" all of them in one kept Spark application); then each run
// is preceded by "--- run K" and followed by "run K: exit E after S s in Spark application ID"
// (engine "ray": "in Ray driver ADDRESS", the kept driver's), and the exit status is the first
// failing run's.
// --keep-app 0: ClusterOptions::spark_keep_app = false (a Spark application per run()).
// --app-idle S: ClusterOptions::spark_app_idle_timeout; --pause S: sleep S s before that run.
// Prints "result rank=R sum=S host=H threads=OMP_NUM_THREADS" per rank, "program ok", "WorkerError
// rank=R host=H exit=E signal=S type=T message=M" (exit 1) or "UsageError: ..." (exit 2).
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/dtrain.h"
#include "dtrain/ray.h"
#include "dtrain/spark.h"

namespace {

std::string hostname() {
  char name[256] = {0};
  ::gethostname(name, sizeof name - 1);
  return name;
}

constexpr int kEveryRank = -2;

std::string where(int fail_rank, int crash_rank, int sleep_rank, const std::string& crash_host,
                  int exit_rank, int exit_code, int kill_rank) {
  auto pg = dtrain::init_process_group();
  if (pg->rank() == fail_rank)
    throw std::runtime_error("failing on purpose on rank " + std::to_string(fail_rank));
  if (pg->rank() == exit_rank) {
    std::fprintf(stderr, "rank %d exits with code %d on purpose\n", exit_rank, exit_code);
    std::_Exit(exit_code);
  }
  if (pg->rank() == kill_rank) {
    std::fprintf(stderr, "rank %d SIGKILLs itself on purpose\n", kill_rank);
    std::raise(SIGKILL);
  }
  auto t = torch::full({1}, static_cast<double>(pg->rank() + 1), torch::kFloat64);
  dtrain::all_reduce(t);
  const char* local_rank = std::getenv("LOCAL_RANK");
  if (pg->rank() == crash_rank || (!crash_host.empty() && hostname() == crash_host && local_rank &&
                                   std::string(local_rank) == "1")) {
    std::raise(SIGSEGV);
  }
  if (sleep_rank == kEveryRank || pg->rank() == sleep_rank)
    std::this_thread::sleep_for(std::chrono::minutes(10));
  const char* threads = std::getenv("OMP_NUM_THREADS");
  return "rank=" + std::to_string(pg->rank()) +
         " sum=" + std::to_string(static_cast<int>(t.item<double>())) + " host=" + hostname() +
         " threads=" + (threads ? threads : "unset");
}

struct Job {
  dtrain::DistributorOptions o{.num_processes = 4, .local_mode = false};
  int fail_rank = -1, crash_rank = -1, sleep_rank = -1, exit_rank = -1, exit_code = 1,
      kill_rank = -1;
  std::string program, crash_host;
  std::vector<std::string> program_args;
  int pause_s = 0;  // sleep this long before the run
};

// One run(): prints its results or its error; 0, 1 (WorkerError) or 2 (UsageError).
int run_one(const Job& j) {
  try {
    dtrain::Distributor d(j.o);
    if (!j.program.empty()) {
      d.run(j.program, j.program_args);
      std::printf("program ok\n");
      return 0;
    }
    for (const auto& r : d.run_all(where, j.fail_rank, j.crash_rank, j.sleep_rank, j.crash_host,
                                   j.exit_rank, j.exit_code, j.kill_rank)) {
      std::printf("result %s\n", r.c_str());
    }
    return 0;
  } catch (const dtrain::WorkerError& e) {
    std::printf("WorkerError rank=%d host=%s exit=%d signal=%d type=%s message=%s\n", e.rank(),
                e.details().host.c_str(), e.exit_code(), e.signal(), e.exception_type().c_str(),
                e.exception_message().c_str());
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  } catch (const dtrain::UsageError& e) {
    std::printf("UsageError: %s\n", e.what());
    return 2;
  }
}

}  // namespace

int main(int argc, char** argv) {
  dtrain::init(argc, argv);
  std::vector<Job> jobs(1);
  jobs[0].o.cluster.engine = "spark";
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "--then") {  // the next run() in this process: the same settings, then its flags
      Job next = jobs.back();
      next.program.clear();
      next.program_args.clear();
      next.fail_rank = next.crash_rank = next.sleep_rank = next.exit_rank = next.kill_rank = -1;
      next.crash_host.clear();
      next.pause_s = 0;
      jobs.push_back(next);
      continue;
    }
    Job& j = jobs.back();
    if (!j.program.empty()) {
      j.program_args.push_back(flag);
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "flag %s needs a value\n", flag.c_str());
      return 2;
    }
    std::string value = argv[++i];
    dtrain::DistributorOptions& o = j.o;
    if (flag == "--master")
      o.cluster.master = value;
    else if (flag == "--nproc")
      o.num_processes = std::stoi(value);
    else if (flag == "--per-task")
      o.cluster.spark_processes_per_task = std::stoi(value);
    else if (flag == "--keep-app")
      o.cluster.spark_keep_app = value != "0";
    else if (flag == "--app-idle")
      o.cluster.spark_app_idle_timeout = std::chrono::seconds(std::stoi(value));
    else if (flag == "--pause")
      j.pause_s = std::stoi(value);
    else if (flag == "--fail-rank")
      j.fail_rank = std::stoi(value);
    else if (flag == "--crash-rank")
      j.crash_rank = std::stoi(value);
    else if (flag == "--crash-host")
      j.crash_host = value;
    else if (flag == "--exit-rank")
      j.exit_rank = std::stoi(value);
    else if (flag == "--exit-code")
      j.exit_code = std::stoi(value);
    else if (flag == "--kill-rank")
      j.kill_rank = std::stoi(value);
    else if (flag == "--sleep-rank")
      j.sleep_rank = value == "all" ? kEveryRank : std::stoi(value);
    else if (flag == "--slot-timeout")
      o.cluster.spark_slot_timeout = std::chrono::seconds(std::stoi(value));
    else if (flag == "--engine")
      o.cluster.engine = value;
    else if (flag == "--ray-address")
      o.cluster.ray.address = value;
    else if (flag == "--per-bundle")
      o.cluster.ray.processes_per_bundle = std::stoi(value);
    else if (flag == "--strategy")
      o.cluster.ray.strategy = value;
    else if (flag == "--cpus")
      o.cluster.ray.num_cpus_per_process = std::stod(value);
    else if (flag == "--placement-timeout")
      o.cluster.ray.placement_timeout = std::chrono::seconds(std::stoi(value));
    else if (flag == "--keep-driver")
      o.cluster.ray.keep_driver = value != "0";
    else if (flag == "--program")
      j.program = value;
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (jobs.size() == 1) return run_one(jobs[0]);
  int rc = 0;
  for (size_t k = 0; k < jobs.size(); ++k) {
    std::printf("--- run %zu\n", k + 1);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(jobs[k].pause_s));
    const auto t0 = std::chrono::steady_clock::now();
    const int r = run_one(jobs[k]);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (jobs[k].o.cluster.engine == "ray") {
      std::printf("run %zu: exit %d after %.2f s in Ray driver %s\n", k + 1, r, s,
                  dtrain::ray::kept_driver().c_str());
    } else {
      std::printf("run %zu: exit %d after %.2f s in Spark application %s\n", k + 1, r, s,
                  dtrain::spark::app_id().c_str());
    }
    std::fflush(stdout);
    if (r != 0 && rc == 0) rc = r;
  }
  return rc;
}
