// Spark as a cluster engine: how a job is sized and submitted to a Spark cluster.
//
//     dtrain::Distributor d({.num_processes = 4, .local_mode = false,
//                            .cluster = {.engine = "spark", .master = "spark://HOST:7077"}});
//
// The Distributor (and `dtrain run --spark-master URL` from a shell) runs
// `spark-submit --master URL ... share/dtrain/python/dtrain/spark.py --tasks T -- dtrain run ...`.
// That PySpark driver runs one barrier stage of T tasks; task i runs the dtrain agent
// `dtrain run --nnodes T --node-rank i --master-addr <task 0's host> ...` and sends its
// output to the driver, which prints it (rank-prefixed). Results and failures come back
// through the Distributor's store, as with every engine. See python/dtrain/spark.py.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::spark {

// The barrier stage for num_processes workers, sized as PySpark's TorchDistributor sizes
// it: one task per `processes_per_task` processes. processes_per_task 0 means
// TorchDistributor's default: 1 on CPUs, spark.task.resource.gpu.amount (from user_conf,
// else 1) with use_gpu. Each task asks Spark for its processes' resources: spark.task.cpus
// = processes per task, or with use_gpu spark.task.resource.gpu.amount = processes per
// task (one GPU each). Settings in user_conf ("K=V") win over these.
struct Plan {
  int tasks = 1;
  int processes_per_task = 1;
  std::vector<std::pair<std::string, std::string>> conf;  // --conf K=V for spark-submit
};
// Throws UsageError: num_processes < 1, processes_per_task < 0, a conf entry without '=',
// num_processes not a multiple of the processes per task, a GPU amount that is not a whole
// number >= 1.
Plan plan(int num_processes, bool use_gpu, int processes_per_task,
          const std::vector<std::string>& user_conf);

struct SubmitOptions {
  std::string master;          // spark://HOST:PORT (or local[N], yarn, ...)
  std::string spark_submit;    // default: $SPARK_HOME/bin/spark-submit, else PATH
  std::string driver_host;     // spark.driver.host, when set
  double slot_timeout_s = 60;  // wait this long for T free task slots, then fail
};

// spark-submit's command line up to and including "--"; the `dtrain run ...` command follows.
// env: what spark-submit needs set (PYSPARK_PYTHON: the Python beside spark-submit, when
// unset). Throws UsageError when spark-submit or the driver script cannot be found.
struct Command {
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> env;
};
Command submit_command(const SubmitOptions& options, const Plan& plan);
// The same up to (not including) the driver script: spark-submit and its --conf settings.
Command submit_base(const SubmitOptions& options, const Plan& plan);

// ---- a kept application (ClusterOptions::spark_keep_app, the default) ----------------------
// As a notebook keeps its SparkSession between TorchDistributor.run() calls, this process
// keeps one Spark application between Distributor::run() calls: the first run() starts a
// PySpark driver service (`spark-submit ... spark.py --serve SOCKET`, its own process group)
// and waits until its SparkContext is up; every run() then sends its job, one barrier stage,
// to it over a Unix socket through a small client (`python spark.py --client SOCKET ...`,
// which relays the output and exits with the job's status, as spark-submit did). A run() with
// another master or other settings stops the kept application first (a standalone
// application holds its executors' cores). The application stops when this process exits
// (however: the service watches its control connection and this process's PID), after
// idle_timeout without a job, or on stop_app(); its end stops the executors and every agent.
// Concurrent run() calls (Tune's trials) are concurrent jobs of the application, as a
// notebook's threads are: each barrier stage starts once the executors have all its slots
// free at once (Spark's barrier scheduling), so jobs that fit run side by side and the others
// wait in Spark's queue. A run() with other settings while another thread's job runs stops
// that job's application under it.

// The client command of one job in the kept application (started, or restarted when it has
// died or `options`/`plan` differ from its own, waiting at most start_timeout for it).
// Throws Error when the service does not come up (spark-submit's output is on stderr).
Command app_job_command(const SubmitOptions& options, const Plan& plan,
                        std::chrono::seconds idle_timeout, std::chrono::seconds start_timeout);
// The kept application's task slots, asked of Spark itself (its executors' slots for the
// application's resource profile, spark.task.cpus per task, and the tasks running on them),
// starting the application as app_job_command does. Executors register after the application
// starts: the service counts once they hold `plan.tasks` slots and have not changed for 3 s
// (at most options.slot_timeout_s). nullopt when the service does not answer.
struct AppSlots {
  int total = 0;  // task slots of the registered executors
  int free = 0;   // of them, not running a task now
};
std::optional<AppSlots> app_slots(const SubmitOptions& options, const Plan& plan,
                                  std::chrono::seconds idle_timeout,
                                  std::chrono::seconds start_timeout);
// The kept application's id ("app-..."), "" when none is up.
std::string app_id();
// Stops the kept application (if any) and waits (bounded) for its driver to exit.
void stop_app();

// Whether a spark://HOST:PORT master's host is a loopback address (127.x, localhost, ::1):
// then the nodes reach the driver at 127.0.0.1 too.
bool master_is_loopback(const std::string& master);

// What an exit status of the PySpark driver means when no worker reported a failure: too
// few task slots (76), a retried barrier stage refused (75); nullopt for others.
std::optional<std::string> explain_exit(int exit_code);

// The PySpark driver script (python/dtrain/spark.py): $DTRAIN_SPARK_SCRIPT, else the source
// tree's, else the installed one (PREFIX/share/dtrain/python/dtrain/spark.py).
std::string driver_script();

// `dtrain run --spark-master URL [--spark-conf K=V]... [--spark-submit PATH]
// [--spark-slot-timeout S] --nnodes T ... PROGRAM`: when argv has --spark-master (before
// PROGRAM's arguments), execs spark-submit with the rest as the agents' command (never
// returns, or throws UsageError); otherwise returns.
void exec_cli_if_requested(int argc, char** argv);

}  // namespace dtrain::spark
