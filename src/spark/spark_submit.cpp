// Spark engine: sizing (as TorchDistributor) and the spark-submit command line.
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>

#include "core/driver_service.h"
#include "core/hostfile.h"
#include "core/params.h"
#include "core/paths.h"
#include "dtrain/error.h"
#include "dtrain/spark.h"

namespace dtrain::spark {

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
  return is_loopback_host(host);
}

std::string driver_script() { return detail::python_script("spark.py", param::kSparkScript); }

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
  if (!is_executable_file(submit)) {
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
    if (is_executable_file(python)) {
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
  const auto flags = detail::scan_run_flags(
      argc, argv,
      {"--spark-master", "--spark-conf", "--spark-submit", "--spark-slot-timeout", "--nnodes"},
      "--spark-master");
  if (!flags) return;
  SubmitOptions o;
  o.master = flags->value("--spark-master");
  o.spark_submit = flags->value("--spark-submit");
  if (flags->given.count("--spark-slot-timeout"))
    o.slot_timeout_s = std::atof(flags->value("--spark-slot-timeout").c_str());
  std::vector<std::string> conf;
  if (auto it = flags->given.find("--spark-conf"); it != flags->given.end()) conf = it->second;
  int nnodes = 1;
  // Checked only for a Spark run: the launcher checks its own.
  if (const std::string text = flags->value("--nnodes"); !text.empty()) {
    char* end = nullptr;
    const long n = std::strtol(text.c_str(), &end, 10);
    if (*end != '\0' || n < 1) {
      throw UsageError("dtrain " + flags->command +
                       " --spark-master: --nnodes must be a whole number >= 1 (the "
                       "Spark tasks, one agent each), got '" +
                       text + "'");
    }
    nnodes = static_cast<int>(n);
  }
  // T tasks of one agent each; the agent's processes are --nproc-per-node.
  Plan p = plan(nnodes, false, 1, conf);
  Command c = submit_command(o, p);
  c.argv.push_back(detail::self_path());
  c.argv.push_back(flags->command);
  c.argv.insert(c.argv.end(), flags->rest.begin(), flags->rest.end());
  detail::exec_driver(c.argv, c.env, "dtrain " + flags->command + " --spark-master");
}

}  // namespace dtrain::spark
