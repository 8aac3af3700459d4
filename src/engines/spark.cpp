// Engine "spark": one barrier task per processes_per_task workers, each running a dtrain agent,
// submitted through spark-submit or a kept Spark application (src/spark/, dtrain/spark.h).
#include <filesystem>

#include "core/params.h"
#include "dtrain/spark.h"
#include "engines/common.h"
#include "engines/engine.h"

namespace dtrain::engines {
namespace {

SparkOptions options_of(const ClusterOptions& c) {
  const SparkOptions d;
  SparkOptions s;
  s.master = either(c.spark.master, c.master, d.master, "spark.master", "master");
  s.conf = either(c.spark.conf, c.spark_conf, d.conf, "spark.conf", "spark_conf");
  s.processes_per_task =
      either(c.spark.processes_per_task, c.spark_processes_per_task, d.processes_per_task,
             "spark.processes_per_task", "spark_processes_per_task");
  s.submit = either(c.spark.submit, c.spark_submit, d.submit, "spark.submit", "spark_submit");
  s.slot_timeout = either(c.spark.slot_timeout, c.spark_slot_timeout, d.slot_timeout,
                          "spark.slot_timeout", "spark_slot_timeout");
  s.keep_app =
      either(c.spark.keep_app, c.spark_keep_app, d.keep_app, "spark.keep_app", "spark_keep_app");
  s.app_idle_timeout =
      either(c.spark.app_idle_timeout, c.spark_app_idle_timeout, d.app_idle_timeout,
             "spark.app_idle_timeout", "spark_app_idle_timeout");
  return s;
}

class Spark final : public Engine {
 public:
  std::string name() const override { return "spark"; }
  std::string why_not_elastic() const override {
    return "a barrier stage runs all its tasks or none";
  }

  Placement place(const DistributorOptions& o) const override {
    Placement p;
    p.elastic = detail::plan_elastic(o, 1);  // throws when min/max nodes are set
    const SparkOptions s = options_of(o.cluster);
    p.nproc_per_node =
        spark::plan(o.num_processes, o.use_gpu, s.processes_per_task, s.conf).processes_per_task;
    return p;
  }

  // Every agent's output reaches the driver's console: only node 0's prints the whole failure
  // summary.
  bool shared_console() const override { return true; }

  // An agent started by a Spark task (python/dtrain/spark.py sets DTRAIN_SPARK_TASK); its
  // flags give everything else.
  bool adopt(LaunchOptions& o, const RunArgs&, const EnvLookup& env) const override {
    if (!get(env, param::kSparkTask.name)) return false;
    o.engine = name();
    return true;
  }

  std::string driver_address(const DistributorOptions& o, const Placement& p) const override {
    if (spark::master_is_loopback(options_of(o.cluster).master)) return "127.0.0.1";
    return Engine::driver_address(o, p);
  }

  Command agents_command(const JobRequest& r) const override {
    const DistributorOptions& o = r.options;
    const SparkOptions s = options_of(o.cluster);
    const spark::SubmitOptions so{s.master, s.submit, o.cluster.driver_addr,
                                  static_cast<double>(s.slot_timeout.count())};
    const spark::Plan sp = spark::plan(o.num_processes, o.use_gpu, s.processes_per_task, s.conf);
    auto submit =
        s.keep_app ? spark::app_job_command(so, sp, s.app_idle_timeout, std::chrono::seconds(300))
                   : spark::submit_command(so, sp);
    Command c;
    c.argv = std::move(submit.argv);
    // Tasks run in Spark's work directories.
    c.argv.push_back(std::filesystem::absolute(r.launcher).string());
    for (auto& [k, v] : submit.env) c.env.emplace(k, v);
    return c;
  }

  // The kept application's free task slots, asked of Spark (spark::app_slots: its executors'
  // slots less the active stages' running tasks, so net of every job it runs), in worker
  // processes (processes_per_task per slot). Without a kept application every run() is its
  // own spark-submit application, which the cluster manager gives executors only when it
  // starts: nothing to count beforehand (nullopt).
  std::optional<Capacity> capacity(const DistributorOptions& o) const override {
    const SparkOptions s = options_of(o.cluster);
    if (!s.keep_app) return std::nullopt;
    const spark::SubmitOptions so{s.master, s.submit, o.cluster.driver_addr,
                                  static_cast<double>(s.slot_timeout.count())};
    const spark::Plan sp = spark::plan(o.num_processes, o.use_gpu, s.processes_per_task, s.conf);
    const auto slots = spark::app_slots(so, sp, s.app_idle_timeout, std::chrono::seconds(300));
    if (!slots) return std::nullopt;
    return Capacity{slots->total * sp.processes_per_task, slots->free * sp.processes_per_task,
                    true};
  }

  std::optional<std::string> explain_exit(const ClusterOptions&, int exit_code) const override {
    return spark::explain_exit(exit_code);
  }

  std::string describe() const override {
    return "spark (one agent per barrier task of a Spark application)";
  }
};

}  // namespace

const Engine& spark_engine() {
  static const Spark engine;
  return engine;
}

}  // namespace dtrain::engines
