// Spark engine: sizing (as TorchDistributor) and the spark-submit command line.
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>

#include "dtrain/error.h"
#include "dtrain/spark.h"
#include "launch/options_internal.h"

namespace dtrain::spark {

namespace {

bool executable(const std::string& p) { return !p.empty() && ::access(p.c_str(), X_OK) == 0; }
bool readable(const std::string& p) { return !p.empty() && ::access(p.c_str(), R_OK) == 0; }

std::string self_dir() {
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : exe.parent_path().string();
}

}  // namespace

Plan plan(int num_processes, bool use_gpu, int processes_per_task,
          const std::vector<std::string>& user_conf) {
  if (num_processes < 1) {
    throw UsageError("DistributorOptions::num_processes must be at least 1, got " +
                     std::to_string(num_processes));
  }
  if (processes_per_task < 0) {
    throw UsageError(
        "ClusterOptions::spark_processes_per_task must be >= 0 (0: as "
        "TorchDistributor), got " +
        std::to_string(processes_per_task));
  }
  std::map<std::string, std::string> given;
  for (const auto& kv : user_conf) {
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw UsageError("ClusterOptions::spark_conf: '" + kv +
                       "' is not KEY=VALUE (e.g. "
                       "spark.executor.memory=2g)");
    }
    given[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  const std::string gpu_key = "spark.task.resource.gpu.amount";
  int per = processes_per_task;
  if (per == 0 && use_gpu && given.count(gpu_key)) {
    // TorchDistributor: one process per GPU of the task; a fraction of a GPU is no process.
    char* end = nullptr;
    const double amount = std::strtod(given[gpu_key].c_str(), &end);
    if (end == given[gpu_key].c_str() || *end != '\0' || amount < 1 ||
        amount != std::floor(amount)) {
      throw UsageError(gpu_key + " is '" + given[gpu_key] +
                       "'; with use_gpu every task runs one "
                       "process per GPU, so it must be a whole number >= 1");
    }
    per = static_cast<int>(amount);
  }
  if (per == 0) per = 1;
  if (num_processes % per != 0) {
    throw UsageError("DistributorOptions::num_processes (" + std::to_string(num_processes) +
                     ") must be a multiple of the processes each Spark task runs (" +
                     std::to_string(per) + "): every task runs the same number of workers");
  }
  Plan p;
  p.processes_per_task = per;
  p.tasks = num_processes / per;
  std::map<std::string, std::string> conf = {
      // One failed task must not make Spark run the barrier stage (the training) again.
      {"spark.task.maxFailures", "1"},
      {"spark.stage.maxConsecutiveAttempts", "1"},
      // Spark's own slot check retries 40 x 15 s by default: answer within seconds.
      {"spark.scheduler.barrier.maxConcurrentTasksCheck.interval", "1s"},
      {"spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures", "5"},
      {"spark.python.worker.reuse", "false"},
  };
  if (use_gpu) {
    conf[gpu_key] = std::to_string(per);
  } else {
    conf["spark.task.cpus"] = std::to_string(per);
  }
  for (const auto& [k, v] : given) conf[k] = v;
  p.conf.assign(conf.begin(), conf.end());
  return p;
}

std::optional<std::string> explain_exit(int exit_code) {
  // The statuses python/dtrain/spark.py exits with (REFUSED_RETRY, NO_SLOTS).
  if (exit_code == 76) {
    return "the Spark cluster has too few free task slots for the barrier stage (one task per "
           "node of processes; the count is above, on stderr): add workers or cores, lower "
           "spark.task.cpus or num_processes, or raise ClusterOptions::spark_slot_timeout";
  }
  if (exit_code == 75) {
    return "Spark retried the barrier stage after a failure; dtrain refused to train a second "
           "time (its messages are above, on stderr): run the job again";
  }
  return std::nullopt;
}

bool master_is_loopback(const std::string& master) {
  const std::string scheme = "spark://";
  if (master.rfind(scheme, 0) != 0) return master.rfind("local", 0) == 0;
  std::string host = master.substr(scheme.size());
  host = host.substr(0, host.find_first_of(",/"));
  if (!host.empty() && host[0] == '[') {
    host = host.substr(1, host.find(']') - 1);
  } else {
    host = host.substr(0, host.rfind(':'));
  }
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

std::string driver_script() {
  if (const char* env = std::getenv("DTRAIN_SPARK_SCRIPT"); env && *env) {
    if (!readable(env)) {
      throw UsageError(std::string("DTRAIN_SPARK_SCRIPT: '") + env + "' is not a readable file");
    }
    return env;
  }
#ifdef DTRAIN_SPARK_SCRIPT_SOURCE
  if (readable(DTRAIN_SPARK_SCRIPT_SOURCE)) return DTRAIN_SPARK_SCRIPT_SOURCE;
#endif
  // Installed: PREFIX/bin/dtrain (or a program in PREFIX/bin) -> PREFIX/share/dtrain/python.
  const std::string beside = self_dir() + "/../share/dtrain/python/dtrain/spark.py";
  if (readable(beside)) return beside;
#ifdef DTRAIN_SPARK_SCRIPT_INSTALL
  if (readable(DTRAIN_SPARK_SCRIPT_INSTALL)) return DTRAIN_SPARK_SCRIPT_INSTALL;
#endif
  throw UsageError(
      "cannot find dtrain's PySpark driver (python/dtrain/spark.py, installed under "
      "share/dtrain/python); reinstall dtrain or set DTRAIN_SPARK_SCRIPT to its path");
}

Command submit_base(const SubmitOptions& o, const Plan& plan) {
  if (o.master.empty()) {
    throw UsageError(
        "ClusterOptions::master is empty: engine \"spark\" needs the Spark master "
        "URL (spark://HOST:7077 for a standalone cluster)");
  }
  std::string submit = o.spark_submit;
  if (submit.empty()) {
    if (const char* home = std::getenv("SPARK_HOME"); home && *home) {
      submit = std::string(home) + "/bin/spark-submit";
    } else {
      submit = find_in_path("spark-submit");
    }
  }
  if (!executable(submit)) {
    throw UsageError("engine \"spark\" needs spark-submit (" +
                     (submit.empty() ? std::string("not on PATH, SPARK_HOME unset")
                                     : "'" + submit + "' is not executable") +
                     "): pip install pyspark (it carries Spark) and put its bin on PATH, set "
                     "SPARK_HOME, or set ClusterOptions::spark_submit");
  }
  Command c;
  c.argv = {submit, "--master", o.master};
  for (const auto& [k, v] : plan.conf) c.argv.insert(c.argv.end(), {"--conf", k + "=" + v});
  // A loopback master: the executors are on this machine and reach the driver on loopback.
  const std::string driver_host = !o.driver_host.empty()         ? o.driver_host
                                  : master_is_loopback(o.master) ? "127.0.0.1"
                                                                 : "";
  if (!driver_host.empty())
    c.argv.insert(c.argv.end(), {"--conf", "spark.driver.host=" + driver_host});
  if (!std::getenv("PYSPARK_PYTHON")) {
    // pip's spark-submit sits beside the Python that has pyspark (a venv's bin).
    const std::string python = std::filesystem::path(submit).parent_path().string() + "/python";
    if (executable(python)) {
      c.env.emplace_back("PYSPARK_PYTHON", python);
      c.env.emplace_back("PYSPARK_DRIVER_PYTHON", python);
    }
  }
  return c;
}

Command submit_command(const SubmitOptions& o, const Plan& plan) {
  Command c = submit_base(o, plan);
  char timeout[32];
  std::snprintf(timeout, sizeof timeout, "%g", o.slot_timeout_s);
  c.argv.insert(c.argv.end(), {driver_script(), "--tasks", std::to_string(plan.tasks),
                               "--slot-timeout", timeout, "--"});
  return c;
}

void exec_cli_if_requested(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) != "run") return;
  std::vector<std::string> rest;
  SubmitOptions o;
  std::vector<std::string> conf;
  int nnodes = 1;
  std::string nnodes_text;  // checked only for a Spark run: the launcher checks its own
  bool spark = false;
  int i = 2;
  auto value = [&](const std::string& flag) -> std::string {
    const std::string a = argv[i];
    if (a.size() > flag.size() && a[flag.size()] == '=') return a.substr(flag.size() + 1);
    if (i + 1 >= argc) throw UsageError("dtrain run: " + flag + " needs a value");
    return argv[++i];
  };
  auto is = [&](const std::string& flag) {
    const std::string a = argv[i];
    return a == flag || a.rfind(flag + "=", 0) == 0;
  };
  // Only the launcher's options: they end at "--" or at PROGRAM (the first word that is
  // neither an option nor the value of one; values here never start with '-').
  bool program = false;
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    if (program || a == "--") {
      rest.push_back(a);
      program = true;
      continue;
    }
    if (is("--spark-master")) {
      o.master = value("--spark-master");
      spark = true;
    } else if (is("--spark-conf")) {
      conf.push_back(value("--spark-conf"));
    } else if (is("--spark-submit")) {
      o.spark_submit = value("--spark-submit");
    } else if (is("--spark-slot-timeout")) {
      o.slot_timeout_s = std::atof(value("--spark-slot-timeout").c_str());
    } else if (is("--nnodes")) {
      nnodes_text = value("--nnodes");
    } else {
      rest.push_back(a);
    }
  }
  if (!spark) return;
  if (!nnodes_text.empty()) {
    char* end = nullptr;
    const long n = std::strtol(nnodes_text.c_str(), &end, 10);
    if (*end != '\0' || n < 1) {
      throw UsageError(
          "dtrain run --spark-master: --nnodes must be a whole number >= 1 (the "
          "Spark tasks, one agent each), got '" +
          nnodes_text + "'");
    }
    nnodes = static_cast<int>(n);
  }
  // T tasks of one agent each; the agent's processes are --nproc-per-node.
  Plan p = plan(nnodes, false, 1, conf);
  Command c = submit_command(o, p);
  c.argv.push_back(self_dir() + "/" +
                   std::filesystem::read_symlink("/proc/self/exe").filename().string());
  c.argv.push_back("run");
  c.argv.insert(c.argv.end(), rest.begin(), rest.end());
  for (const auto& [k, v] : c.env) ::setenv(k.c_str(), v.c_str(), 1);
  std::vector<char*> args;
  for (auto& s : c.argv) args.push_back(s.data());
  args.push_back(nullptr);
  ::execv(args[0], args.data());
  throw UsageError("dtrain run --spark-master: cannot run " + c.argv[0] + ": " +
                   std::strerror(errno));
}

}  // namespace dtrain::spark
