// dtrain::mlflow against a real `mlflow server` (PyPI's mlflow, pinned in
// scripts/requirements.txt), started once for this binary on a free loopback port with a
// sqlite backend in a temporary directory, and stopped at the end. Runs are read back with
// MLflow's own Python client. CTest runs this binary as one test (one server for all cases).
#include <gtest/gtest.h>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "dtrain/error.h"
#include "dtrain/mlflow.h"
#include "support/paths.h"
#include "support/scoped_env.h"
#include "tracking/support.h"
#include "tracking/system_metrics.h"

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using dtrain::test::MlflowServer;
using dtrain::test::read_runs;
using dtrain::test::run_command;

namespace {

dtrain::test::MlflowServerEnvironment* const g_env =
    dtrain::test::MlflowServerEnvironment::add("dtrain_mlflow_");

// The child half of the signal tests: this binary, run again with DTRAIN_TEST_MLFLOW_SIGNAL_CHILD
// set to a signal_flush in ms, queues params and kLoggedSteps metrics (the interval never sends
// them on its own), says "logged RUN_ID" and waits to be stopped. It runs before main.
constexpr int kLoggedSteps = 2500;
const bool g_signal_child = [] {
  const char* flush_ms = std::getenv("DTRAIN_TEST_MLFLOW_SIGNAL_CHILD");
  if (flush_ms == nullptr) return false;
  auto run =
      dtrain::mlflow::Run::start({.flush_interval = std::chrono::hours(1),
                                  .signal_flush = std::chrono::milliseconds(std::atoi(flush_ms))});
  run.log_params({{"world_size", "2"}});
  for (int step = 1; step <= kLoggedSteps; ++step) run.log_metric("loss", 1.0 / step, step);
  std::cout << "logged " << run.id() << std::endl;
  std::this_thread::sleep_for(std::chrono::seconds(120));
  std::_Exit(1);  // never stopped: the test fails on the exit code
}();

std::vector<std::string> train_argv(const std::vector<std::string>& extra) {
  std::vector<std::string> argv{DTRAIN_BIN, "run", "--nproc-per-node", "2", FASHION_MNIST_BIN};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

std::vector<int64_t> steps_of(const nlohmann::json& history) {
  std::vector<int64_t> out;
  for (const auto& p : history) out.push_back(p[0].get<int64_t>());
  return out;
}

std::vector<int64_t> range(int64_t from, int64_t to) {  // [from, to]
  std::vector<int64_t> out;
  for (int64_t i = from; i <= to; ++i) out.push_back(i);
  return out;
}

TEST(MlflowServer, TwoProcessRunLogsExactlyOneRunWithParamsMetricHistoryAndModel) {
  ASSERT_EQ(g_env->error, "");  // fail, never skip, without a server
  // 60000 / 2 ranks / 512 = 59 steps in the epoch.
  auto r = run_command(
      train_argv({"--epochs", "1", "--batch-size", "512", "--log-every", "20"}),
      {.env = {"MLFLOW_TRACKING_URI=" + g_env->server->url(), "MLFLOW_EXPERIMENT_NAME=two_process"},
       .timeout = 300s});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("[default0]:epoch 1 step 40/59 loss"), std::string::npos)
      << r.out;  // the progress API
  auto runs = read_runs(g_env->server->url(), "two_process")["runs"];
  ASSERT_EQ(runs.size(), 1u) << runs.dump(1);  // rank 1 logged nothing
  const auto& run = runs[0];
  EXPECT_EQ(run["status"], "FINISHED");
  EXPECT_EQ(run["params"]["world_size"], "2");
  EXPECT_EQ(run["params"]["batch_size"], "512");
  EXPECT_EQ(run["params"]["effective_batch_size"], "1024");
  EXPECT_EQ(run["params"]["model"], "mlp");
  EXPECT_EQ(run["params"]["lr"], "0.001");  // as Python's log_params({"lr": 0.001}) has it
  EXPECT_EQ(steps_of(run["metrics"]["loss"]), range(1, 59));
  EXPECT_EQ(steps_of(run["metrics"]["samples_per_s"]), range(1, 59));
  for (const auto& p : run["metrics"]["samples_per_s"]) EXPECT_GT(p[1].get<double>(), 0);
  // The loss falls over the epoch.
  EXPECT_LT(run["metrics"]["loss"][58][1].get<double>(),
            run["metrics"]["loss"][0][1].get<double>());
  ASSERT_EQ(run["metrics"]["test_accuracy"].size(), 1u);
  EXPECT_EQ(run["metrics"]["test_accuracy"][0][0], 1);
  EXPECT_GT(run["metrics"]["test_accuracy"][0][1].get<double>(), 0.7);
  std::set<std::string> artifacts(run["artifacts"].begin(), run["artifacts"].end());
  EXPECT_TRUE(artifacts.count("model/MLmodel")) << run["artifacts"];
  EXPECT_TRUE(artifacts.count("model/data/model.pt")) << run["artifacts"];
  EXPECT_TRUE(artifacts.count("state_dict/state_dict.pth")) << run["artifacts"];
}

TEST(MlflowParams, FloatParamIsWrittenAsPythonsStrOfTheFloat) {
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> values{0.001,         1e30,
                                   1e-5,          1e-4,
                                   1e16,          1e15,
                                   5.0,           -0.0,
                                   0.0,           0.1 + 0.2,
                                   1.0 / 3,       -2.5e-7,
                                   1e-300,        5e-324,
                                   123456789.125, 6.02214076e23,
                                   1e22,          1e21,
                                   std::nan(""),  inf,
                                   -inf,          1.7976931348623157e308};
  std::vector<std::string> argv{
      DTRAIN_VENV_PYTHON, "-c",
      "import sys; print('\\n'.join(str(float(a)) for a in sys.argv[1:]))"};
  for (double v : values) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", v);  // exact: Python reads back the same double
    argv.push_back(buf);
  }
  auto r = run_command(argv, {.timeout = 60s});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::istringstream lines(r.out);
  for (double v : values) {
    std::string python;
    ASSERT_TRUE(std::getline(lines, python)) << r.out;
    EXPECT_EQ(dtrain::mlflow::param_value(v), python) << "%.17g of the value: " << v;
  }
}

TEST(MlflowServer, ServerStoppedMidRunAndRestartedLosesNoMetric) {
  ASSERT_EQ(g_env->error, "");  // fail, never skip, without a server
  auto run = dtrain::mlflow::Run::start({.tracking_uri = g_env->server->url(),
                                         .experiment = "restart",
                                         .run_name = "outage",
                                         .fallback_dir = (g_env->dir / "fallback").string(),
                                         .flush_interval = 100ms,
                                         .flush_timeout = 120s,
                                         .request_timeout = 2s});
  ASSERT_TRUE(run.active());
  for (int s = 0; s < 100; ++s) run.log_metric("loss", 1.0 / (s + 1), s);
  ASSERT_TRUE(run.flush(30s));
  g_env->server->stop();
  // Logged while the server is down: queued and spooled to disk; the calls do not wait on the
  // network (had they waited, 2400 calls x the 2 s request timeout would take 80 minutes; the
  // bound is loose so that a loaded machine never fails it).
  auto t0 = std::chrono::steady_clock::now();
  for (int s = 100; s < 2500; ++s) run.log_metric("loss", 1.0 / (s + 1), s);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 60s);
  auto deadline = std::chrono::steady_clock::now() + 20s;
  while (run.stats().spooled == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(50ms);
  auto down = run.stats();
  EXPECT_GT(down.failed_requests, 0);
  EXPECT_GT(down.spooled, 0);
  EXPECT_GT(down.pending, 0);
  std::string error = g_env->server->start();
  ASSERT_TRUE(error.empty()) << error;
  run.end(dtrain::mlflow::RunStatus::Finished);
  EXPECT_EQ(run.stats().pending, 0);
  EXPECT_EQ(run.stats().metrics_sent, 2500);
  auto runs = read_runs(g_env->server->url(), "restart")["runs"];
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0]["status"], "FINISHED");
  const auto& loss = runs[0]["metrics"]["loss"];
  ASSERT_EQ(steps_of(loss), range(0, 2499));
  for (int s = 0; s < 2500; ++s) EXPECT_DOUBLE_EQ(loss[s][1].get<double>(), 1.0 / (s + 1)) << s;
  EXPECT_FALSE(fs::exists(g_env->dir / "fallback"))
      << "everything reached the server; nothing should be in the fallback";
}

TEST(MlflowServer, NanAndInfMetricsAreStoredWithTheRestOfTheirBatch) {
  ASSERT_EQ(g_env->error, "");  // fail, never skip, without a server
  auto run = dtrain::mlflow::Run::start(
      {.tracking_uri = g_env->server->url(), .experiment = "nonfinite", .run_name = "diverged"});
  ASSERT_TRUE(run.active());
  const double inf = std::numeric_limits<double>::infinity();
  // One log_metrics call: one runs/log-batch request with finite and non-finite values.
  run.log_metrics({{"loss", std::nan("")}, {"grad_norm", inf}, {"neg", -inf}, {"lr", 0.001}}, 1);
  run.log_metric("loss", 0.5, 2);
  run.end(dtrain::mlflow::RunStatus::Finished);
  EXPECT_EQ(run.stats().metrics_sent, 5);  // a rejected batch would not count
  auto runs = read_runs(g_env->server->url(), "nonfinite")["runs"];
  ASSERT_EQ(runs.size(), 1u);
  const auto& m = runs[0]["metrics"];
  // What MLflow's Python client gets for the same values: NaN stays NaN; the SQL store keeps
  // +/-Inf as +/-DBL_MAX (sqlalchemy_store.sanitize_metric_value).
  EXPECT_EQ(m["loss"], nlohmann::json::parse(R"([[1, "NaN"], [2, 0.5]])")) << m;
  EXPECT_EQ(m["grad_norm"], nlohmann::json::parse(R"([[1, 1.7976931348623157e308]])")) << m;
  EXPECT_EQ(m["neg"], nlohmann::json::parse(R"([[1, -1.7976931348623157e308]])")) << m;
  EXPECT_EQ(m["lr"], nlohmann::json::parse(R"([[1, 0.001]])")) << m;
}

// MLflow's server refuses a whole runs/log-batch for one bad entry (its client raises). dtrain's
// sender sends such a batch again in halves: only the refused entries are dropped, with a warning
// naming them; every other value logged with them is stored.
TEST(MlflowServer, ARefusedValueIsDroppedAloneAndTheRestOfItsBatchIsStored) {
  ASSERT_EQ(g_env->error, "");  // fail, never skip, without a server
  // The peer: MLflow's own client, the same entries in one log_batch.
  auto py = run_command({DTRAIN_VENV_PYTHON, "-c",
                         "import sys, time\n"
                         "from mlflow.tracking import MlflowClient\n"
                         "from mlflow.entities import Metric\n"
                         "from mlflow.exceptions import MlflowException\n"
                         "c = MlflowClient(sys.argv[1]); e = c.create_experiment('refused_py')\n"
                         "r = c.create_run(e).info.run_id; t = int(time.time() * 1000)\n"
                         "ms = [Metric('loss', 1.0 / s, t, s) for s in range(1, 301)]\n"
                         "ms.insert(150, Metric('loss@train', 1.0, t, 1))\n"
                         "try:\n"
                         "    c.log_batch(r, metrics=ms)\n"
                         "except MlflowException as ex:\n"
                         "    print('REFUSED', ex.error_code)\n"
                         "print('STORED', len(c.get_metric_history(r, 'loss')))\n",
                         g_env->server->url()},
                        {.timeout = 120s});
  ASSERT_EQ(py.exit_code, 0) << py.err;
  EXPECT_NE(py.out.find("REFUSED INVALID_PARAMETER_VALUE"), std::string::npos) << py.out;
  EXPECT_NE(py.out.find("STORED 0"), std::string::npos) << py.out;  // the whole batch

  auto run = dtrain::mlflow::Run::start({.tracking_uri = g_env->server->url(),
                                         .experiment = "refused",
                                         .flush_interval = std::chrono::hours(1)});
  for (int step = 1; step <= 300; ++step) {
    run.log_metric("loss", 1.0 / step, step);
    if (step == 150) run.log_metric("loss@train", 1.0, 1);
  }
  ASSERT_TRUE(run.flush(60s));
  const auto stats = run.stats();
  run.end();
  EXPECT_EQ(stats.rejected, 1);
  EXPECT_EQ(stats.metrics_sent, 300);
  auto runs = read_runs(g_env->server->url(), "refused")["runs"];
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(steps_of(runs[0]["metrics"]["loss"]), range(1, 300));
  EXPECT_FALSE(runs[0]["metrics"].contains("loss@train"));
}

TEST(MlflowServer, ExperimentIdFromTheEnvironmentAsMlflowsClientPicksIt) {
  ASSERT_EQ(g_env->error, "");  // fail, never skip, without a server
  struct Env {  // restored however the test ends: later cases start jobs with our environment
    ~Env() {
      ::unsetenv("MLFLOW_EXPERIMENT_ID");
      ::unsetenv("MLFLOW_EXPERIMENT_NAME");
    }
  } env;
  using dtrain::mlflow::Run;
  std::string id;
  {
    auto made = Run::start({.tracking_uri = g_env->server->url(), .experiment = "by_id"});
    id = made.experiment_id();
  }
  ASSERT_FALSE(id.empty());
  // The id alone (mlflow.tracking.fluent._get_experiment_id_from_env): that experiment.
  ::setenv("MLFLOW_EXPERIMENT_ID", id.c_str(), 1);
  EXPECT_EQ(Run::start({.tracking_uri = g_env->server->url(), .run_name = "id"}).experiment_id(),
            id);
  // Name and id of the same experiment: that one.
  ::setenv("MLFLOW_EXPERIMENT_NAME", "by_id", 1);
  EXPECT_EQ(Run::start({.tracking_uri = g_env->server->url(), .run_name = "both"}).experiment_id(),
            id);
  // Of different experiments ("Default" is 0), or an id naming none: refused, as MLflow's
  // client raises, rather than a run in an experiment nobody asked for.
  ::setenv("MLFLOW_EXPERIMENT_NAME", "Default", 1);
  EXPECT_THROW(Run::start({.tracking_uri = g_env->server->url()}), dtrain::UsageError);
  ::unsetenv("MLFLOW_EXPERIMENT_NAME");
  ::setenv("MLFLOW_EXPERIMENT_ID", "987654", 1);
  try {
    Run::start({.tracking_uri = g_env->server->url()});
    ADD_FAILURE() << "an id naming no experiment was taken";
  } catch (const dtrain::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("'987654'"), std::string::npos) << e.what();
  }
  // An experiment given in the options wins over the environment (mlflow.set_experiment).
  EXPECT_EQ(
      Run::start({.tracking_uri = g_env->server->url(), .experiment_id = id, .run_name = "opt"})
          .experiment_id(),
      id);
  ::unsetenv("MLFLOW_EXPERIMENT_ID");
  // An unreachable server: the local file store keeps the experiment's id; training goes on.
  fs::path fallback = g_env->dir / "by_id_fallback";
  auto offline =
      Run::start({.tracking_uri = "http://127.0.0.1:" + std::to_string(dtrain::test::free_port()),
                  .experiment_id = id,
                  .fallback_dir = fallback.string()});
  EXPECT_EQ(offline.experiment_id(), id);
  EXPECT_TRUE(fs::exists(fallback / id / "meta.yaml"));
  auto runs = read_runs(g_env->server->url(), "by_id")["runs"];
  std::set<std::string> names;
  for (const auto& run : runs) names.insert(run["tags"].value("mlflow.runName", ""));
  EXPECT_EQ(names.count("id") + names.count("both") + names.count("opt"), 3u) << runs.dump(1);
  EXPECT_EQ(runs.size(), 4u);  // and the one that made the experiment; none elsewhere
}

TEST(MlflowServer, UnreachableServerAtStartWarnsAndTrainsOnIntoTheFileStore) {
  ASSERT_EQ(g_env->error, "");                // fail, never skip, without a server
  int dead_port = dtrain::test::free_port();  // nothing listens there
  fs::path fallback = g_env->dir / "offline_mlruns";
  auto r = run_command(
      train_argv({"--epochs", "1", "--batch-size", "512", "--max-steps", "20", "--log-every", "0"}),
      {.env = {"MLFLOW_TRACKING_URI=http://127.0.0.1:" + std::to_string(dead_port),
               "MLFLOW_EXPERIMENT_NAME=offline", "DTRAIN_MLFLOW_FALLBACK_DIR=" + fallback.string()},
       .timeout = 300s});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("dtrain mlflow: warning: cannot start a run at http://127.0.0.1:" +
                       std::to_string(dead_port)),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("training goes on"), std::string::npos) << r.err;
  // The offline run, read back with MLflow's client from the file store.
  auto runs = read_runs("file:" + fallback.string(), "offline")["runs"];
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0]["status"], "FINISHED");
  EXPECT_EQ(runs[0]["params"]["world_size"], "2");
  EXPECT_EQ(steps_of(runs[0]["metrics"]["loss"]), range(1, 20));
  std::set<std::string> artifacts(runs[0]["artifacts"].begin(), runs[0]["artifacts"].end());
  EXPECT_TRUE(artifacts.count("model/MLmodel")) << runs[0]["artifacts"];
}

TEST(MlflowServer, FailedWorkerLeavesTheRunFailedWithTheRootCause) {
  ASSERT_EQ(g_env->error, "");  // fail, never skip, without a server
  // The run exists before the job (as a scheduler or the Distributor would open it).
  auto made = run_command(
      {DTRAIN_VENV_PYTHON, "-c",
       "import sys; from mlflow.tracking import MlflowClient; c = MlflowClient(sys.argv[1]); "
       "print(c.create_run(c.create_experiment('failed')).info.run_id)",
       g_env->server->url()},
      {.timeout = 120s});
  ASSERT_EQ(made.exit_code, 0) << made.err;
  std::string run_id = made.out.substr(0, made.out.find_last_not_of("\n") + 1);
  run_id = run_id.substr(run_id.find_last_of('\n') + 1);
  auto r = run_command(
      train_argv({"--epochs", "1", "--batch-size", "512", "--log-every", "0", "--crash-at-step",
                  "5", "--crash-rank", "1"}),
      {.env = {"MLFLOW_TRACKING_URI=" + g_env->server->url(), "MLFLOW_RUN_ID=" + run_id},
       .timeout = 300s});
  ASSERT_NE(r.exit_code, 0) << r.out << r.err;
  auto runs = read_runs(g_env->server->url(), "failed")["runs"];
  ASSERT_EQ(runs.size(), 1u) << runs.dump(1);
  const auto& run = runs[0];
  EXPECT_EQ(run["run_id"], run_id);
  EXPECT_EQ(run["status"], "FAILED");
  EXPECT_EQ(run["tags"]["dtrain.failed_rank"], "1") << run["tags"];
  EXPECT_EQ(run["tags"]["dtrain.failed_exit_code"], "3") << run["tags"];
  EXPECT_NE(run["tags"]["dtrain.stderr_tail"].get<std::string>().find(
                "crashing on purpose on rank 1 at step 5"),
            std::string::npos)
      << run["tags"];
  // Rank 0 logged into the same run (MLFLOW_RUN_ID) before the job failed.
  EXPECT_EQ(run["params"]["world_size"], "2");
}

// Runs the signal child (signal_flush `flush_ms`) against the server, SIGTERMs it once it has
// queued everything, and returns how it ended.
dtrain::test::RunResult signalled_child(const std::string& flush_ms, std::vector<std::string> env) {
  env.push_back("DTRAIN_TEST_MLFLOW_SIGNAL_CHILD=" + flush_ms);
  env.push_back("MLFLOW_TRACKING_URI=" + g_env->server->url());
  auto child = dtrain::test::Process::start({fs::read_symlink("/proc/self/exe").string()},
                                            {.env = env, .timeout = 180s});
  const bool logged =
      child.wait_for([](const std::string& out,
                        const std::string&) { return out.find("logged ") != std::string::npos; },
                     120s);
  EXPECT_TRUE(logged) << child.out() << child.err();
  if (logged) child.signal(SIGTERM);
  return child.finish(60s);
}

// `dtrain run` stops a failed job's other workers with SIGTERM: what rank 0 had queued (params,
// the last steps' metrics) reaches the server before the process dies of the signal.
TEST(MlflowServer, WorkerStoppedBySigtermFirstSendsWhatItQueued) {
  ASSERT_EQ(g_env->error, "");  // fail, never skip, without a server
  auto r = signalled_child("30000", {"MLFLOW_EXPERIMENT_NAME=signalled"});
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.out << r.err;  // still dies of the signal
  auto runs = read_runs(g_env->server->url(), "signalled")["runs"];
  ASSERT_EQ(runs.size(), 1u) << runs.dump(1);
  EXPECT_EQ(runs[0]["params"]["world_size"], "2");
  EXPECT_EQ(steps_of(runs[0]["metrics"]["loss"]), range(1, kLoggedSteps));
}

// With less time than the server needs, what it did not take is in the spool file: the server's
// values and the spool's together are every step (the batch in flight at the signal may be in
// both: it leaves the queue only once the server answers).
TEST(MlflowServer, WhatASignalledRunCannotSendInTimeIsInTheSpool) {
  ASSERT_EQ(g_env->error, "");  // fail, never skip, without a server
  const fs::path tmp = g_env->dir / "signal_tmp";
  fs::create_directories(tmp);
  auto r =
      signalled_child("1", {"MLFLOW_EXPERIMENT_NAME=signalled_short", "TMPDIR=" + tmp.string()});
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.out << r.err;
  const std::string out = r.out;
  const auto at = out.find("logged ") + 7;
  const std::string run_id = out.substr(at, out.find('\n', at) - at);
  std::map<int64_t, int> seen;  // step -> times seen
  for (const auto& run : read_runs(g_env->server->url(), "signalled_short")["runs"])
    for (const auto& p : run["metrics"]["loss"]) ++seen[p[0].get<int64_t>()];
  const size_t on_server = seen.size();
  const fs::path spool =
      tmp / ("dtrain-mlflow-spool-" + std::to_string(::getuid())) / (run_id + ".jsonl");
  if (on_server < static_cast<size_t>(kLoggedSteps)) {
    EXPECT_NE(r.err.find("stopped by a signal"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(spool.string()), std::string::npos) << r.err;
    std::ifstream in(spool);
    ASSERT_TRUE(in.good()) << "no spool file " << spool;
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line);
      if (j["kind"] == 0 && j["key"] == "loss") ++seen[j["step"].get<int64_t>()];
    }
  }
  std::vector<int64_t> steps;
  size_t twice = 0;
  for (const auto& [step, n] : seen) {
    steps.push_back(step);
    twice += n > 1 ? 1 : 0;
  }
  EXPECT_EQ(steps, range(1, kLoggedSteps)) << on_server << " on the server";
  EXPECT_LE(twice, 1000u) << "more than the one batch in flight both sent and spooled";
}

// A run of MLflow's own client with log_system_metrics=True: prints its run id.
std::string python_system_metrics_run(const std::string& experiment, double seconds,
                                      const std::string& run_id = "") {
  auto r = run_command(
      {DTRAIN_VENV_PYTHON, "-c",
       "import sys, time, mlflow\n"
       "mlflow.set_tracking_uri(sys.argv[1]); mlflow.set_experiment(sys.argv[2])\n"
       "with mlflow.start_run(run_id=sys.argv[4] or None, log_system_metrics=True) as run:\n"
       "    time.sleep(float(sys.argv[3]))\n"
       "print('RUN_ID=' + run.info.run_id)\n",
       g_env->server->url(), experiment, std::to_string(seconds), run_id},
      {.env = {"MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL=0.5"}, .timeout = 120s});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const auto at = r.out.find("RUN_ID=");
  if (at == std::string::npos) return "";
  return r.out.substr(at + 7, r.out.find('\n', at) - at - 7);
}

std::string dtrain_system_metrics_run(const std::string& experiment, double seconds,
                                      const std::string& run_id = "") {
  dtrain::test::ScopedEnv env;
  env.set("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.5");
  auto run = dtrain::mlflow::Run::start({.tracking_uri = g_env->server->url(),
                                         .experiment = experiment,
                                         .run_id = run_id,
                                         .log_system_metrics = true});
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  run.end();
  return run_id.empty() ? run.id() : run_id;
}

nlohmann::json run_by_id(const std::string& experiment, const std::string& id) {
  const auto runs = read_runs(g_env->server->url(), experiment)["runs"];
  for (const auto& run : runs)
    if (run["run_id"] == id) return run;
  ADD_FAILURE() << "no run " << id << " in " << experiment << ": " << runs.dump();
  return nlohmann::json::object();
}

std::map<std::string, nlohmann::json> system_metrics_of(const nlohmann::json& run) {
  std::map<std::string, nlohmann::json> out;
  for (const auto& [key, history] : run["metrics"].items())
    if (key.rfind("system/", 0) == 0) out[key] = history;
  return out;
}

// dtrain's system metrics beside MLflow's own monitor on this machine, the same interval: the
// same names, steps from 0, one-decimal means.
TEST(MlflowServer, SystemMetricsAreMlflowsNamesAndSteps) {
  ASSERT_EQ(g_env->error, "");  // fail, never skip, without a server
  const auto py =
      system_metrics_of(run_by_id("system_py", python_system_metrics_run("system_py", 2.3)));
  const auto ours = system_metrics_of(
      run_by_id("system_dtrain", dtrain_system_metrics_run("system_dtrain", 2.3)));
  std::set<std::string> py_names, our_names;
  for (const auto& [k, v] : py) py_names.insert(k);
  for (const auto& [k, v] : ours) our_names.insert(k);
  EXPECT_EQ(our_names, py_names);
  EXPECT_EQ(our_names.size(), 8u);  // CPU 3, disk 3, network 2 (no GPU here)
  for (const auto& [name, history] : ours) {
    ASSERT_GE(history.size(), 3u) << name;  // samples at 0, 0.5, 1.0, (1.5), ...
    EXPECT_NEAR(static_cast<double>(history.size()), static_cast<double>(py.at(name).size()), 1)
        << name;
    for (size_t i = 0; i < history.size(); ++i) {
      EXPECT_EQ(history[i][0], static_cast<int64_t>(i)) << name;
      const double v = history[i][1].get<double>();
      EXPECT_GE(v, 0) << name;
      if (name.find("network") == std::string::npos) {
        EXPECT_NEAR(v * 10, std::round(v * 10), 1e-6) << name << " " << v;  // round(x, 1)
      }
      if (name.find("percentage") != std::string::npos) {
        EXPECT_LE(v, 100) << name;
      }
    }
  }
  // psutil's first cpu_percent() in a thread is 0.0; so is dtrain's first sample.
  EXPECT_EQ(ours.at("system/cpu_utilization_percentage")[0][1].get<double>(), 0.0);
}

// dtrain's readings are psutil's: psutil read between two readings of dtrain's sampler lies
// between them (the disk and memory of a busy machine move; the bracket is a few ms wide).
TEST(MlflowSystemMetrics, ReadingsArePsutilsReadings) {
  auto reading = [] {
    dtrain::mlflow::detail::SystemSampler sampler;
    sampler.collect();
    return sampler.aggregate();
  };
  for (int attempt = 0; attempt < 3; ++attempt) {
    const auto before = reading();
    auto r = run_command(
        {DTRAIN_VENV_PYTHON, "-c",
         "import os, psutil\n"
         "d = psutil.disk_usage(os.sep); m = psutil.virtual_memory()\n"
         "print(d.used / 1e6, d.free / 1e6, d.percent, m.used / 1e6, m.used / m.total * 100)\n"},
        {.timeout = 60s});
    const auto after = reading();
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::istringstream in(r.out);
    std::map<std::string, double> psutil;
    for (const char* name :
         {"disk_usage_megabytes", "disk_available_megabytes", "disk_usage_percentage",
          "system_memory_usage_megabytes", "system_memory_usage_percentage"})
      in >> psutil[name];
    ASSERT_TRUE(in) << r.out;
    std::vector<std::string> outside;
    for (const auto& [name, value] : psutil) {
      // One decimal of rounding, and 0.5 MB / 0.1 points of movement either side.
      const double slack = name.find("percentage") != std::string::npos ? 0.15 : 0.6;
      const double lo = std::min(before.at(name), after.at(name)) - slack;
      const double hi = std::max(before.at(name), after.at(name)) + slack;
      if (value < lo || value > hi)
        outside.push_back(name + " " + std::to_string(value) + " not in [" + std::to_string(lo) +
                          ", " + std::to_string(hi) + "]");
    }
    if (outside.empty()) return;
    if (attempt == 2) {
      for (const auto& o : outside) ADD_FAILURE() << o;
    }
  }
}

// A run continued by id goes on after its last system step, whichever client logged it: MLflow
// continues dtrain's steps, and dtrain MLflow's.
TEST(MlflowServer, AContinuedRunsSystemStepsGoOnAcrossClients) {
  ASSERT_EQ(g_env->error, "");  // fail, never skip, without a server
  const std::string id = dtrain_system_metrics_run("system_resume", 1.3);
  auto steps = [&] {
    return steps_of(
        system_metrics_of(run_by_id("system_resume", id)).at("system/disk_usage_megabytes"));
  };
  const auto first = steps();
  ASSERT_GE(first.size(), 2u);
  EXPECT_EQ(first, range(0, static_cast<int64_t>(first.size()) - 1));
  python_system_metrics_run("system_resume", 1.3, id);
  const auto second = steps();
  ASSERT_GT(second.size(), first.size());
  EXPECT_EQ(second, range(0, static_cast<int64_t>(second.size()) - 1));  // no step twice
  dtrain_system_metrics_run("system_resume", 1.3, id);
  const auto third = steps();
  ASSERT_GT(third.size(), second.size());
  EXPECT_EQ(third, range(0, static_cast<int64_t>(third.size()) - 1));
}

// Ends run `id` as another client would: runs/update through the server's REST API (Python's
// urllib, no MLflow import: it takes a few ms, so the run's timing is the test's).
void end_run_from_another_client(const std::string& id) {
  auto r = run_command(
      {DTRAIN_VENV_PYTHON, "-c",
       "import json, sys, urllib.request\n"
       "body = json.dumps({'run_id': sys.argv[2], 'status': 'FINISHED'}).encode()\n"
       "req = urllib.request.Request(sys.argv[1] + '/api/2.0/mlflow/runs/update', body,\n"
       "                             {'Content-Type': 'application/json'})\n"
       "urllib.request.urlopen(req, timeout=30).read()\n",
       g_env->server->url(), id},
      {.timeout = 60s});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// A run another client ends stops its system metrics, as MLflow's monitor (which asks the
// server after every sample) stops: both runs sample every 0.25 s, are ended elsewhere after
// 1.5 s and stay open 2.5 s more; each keeps only the steps of its first 1.5 s.
TEST(MlflowServer, ARunEndedByAnotherClientLogsNoMoreSystemMetrics) {
  ASSERT_EQ(g_env->error, "");  // fail, never skip, without a server
  auto r = run_command(
      {DTRAIN_VENV_PYTHON, "-c",
       "import sys, time, mlflow\n"
       "mlflow.set_tracking_uri(sys.argv[1]); mlflow.set_experiment('system_ended_py')\n"
       "with mlflow.start_run(log_system_metrics=True) as run:\n"
       "    time.sleep(1.5)\n"
       "    mlflow.MlflowClient().set_terminated(run.info.run_id)\n"
       "    time.sleep(2.5)\n"
       "print('RUN_ID=' + run.info.run_id)\n",
       g_env->server->url()},
      {.env = {"MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL=0.25"}, .timeout = 120s});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto at = r.out.find("RUN_ID=");
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string py_id = r.out.substr(at + 7, r.out.find('\n', at) - at - 7);

  std::string id;
  {
    dtrain::test::ScopedEnv env;
    env.set("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.25");
    auto run = dtrain::mlflow::Run::start({.tracking_uri = g_env->server->url(),
                                           .experiment = "system_ended",
                                           .log_system_metrics = true});
    id = run.id();
    std::this_thread::sleep_for(1500ms);
    end_run_from_another_client(id);
    std::this_thread::sleep_for(2500ms);
    run.end();
  }
  auto count = [](const std::string& experiment, const std::string& run_id) {
    return system_metrics_of(run_by_id(experiment, run_id))["system/disk_usage_megabytes"].size();
  };
  const size_t py = count("system_ended_py", py_id), ours = count("system_ended", id);
  // 1.5 s / 0.25 s = 6 samples; 16 had the monitors gone on for the run's 4 s.
  EXPECT_GE(py, 3u);
  EXPECT_LE(py, 9u);
  EXPECT_GE(ours, 3u);
  EXPECT_LE(ours, 9u);
  EXPECT_NEAR(static_cast<double>(ours), static_cast<double>(py), 3) << ours << " vs MLflow " << py;
}

// Continuing an ended run makes it RUNNING again, as mlflow.start_run(run_id=...) does (and
// its system metrics go on, not stopped at once by the status above).
TEST(MlflowServer, AContinuedEndedRunIsRunningAgainUntilItEnds) {
  ASSERT_EQ(g_env->error, "");  // fail, never skip, without a server
  const std::string id = dtrain_system_metrics_run("system_reopened", 0.1);
  auto samples = [](const nlohmann::json& run_json) {
    return system_metrics_of(run_json)["system/disk_usage_megabytes"].size();
  };
  const auto ended = run_by_id("system_reopened", id);
  ASSERT_EQ(ended["status"], "FINISHED");
  const size_t before = samples(ended);
  dtrain::test::ScopedEnv env;
  env.set("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.25");
  auto run = dtrain::mlflow::Run::start({.tracking_uri = g_env->server->url(),
                                         .experiment = "system_reopened",
                                         .run_id = id,
                                         .log_system_metrics = true});
  EXPECT_EQ(run_by_id("system_reopened", id)["status"], "RUNNING");
  // The reopened run's monitor goes on sampling: wait (bounded) for a sample past those the
  // first run logged, however slowly this machine runs read_runs.py.
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  size_t reopened = before;
  while (reopened <= before && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(250ms);
    reopened = samples(run_by_id("system_reopened", id));
  }
  EXPECT_GT(reopened, before) << "no system metrics sampled in 60 s after reopening the run";
  run.end();
  const auto run_json = run_by_id("system_reopened", id);
  EXPECT_EQ(run_json["status"], "FINISHED");
  EXPECT_GE(samples(run_json), reopened);
}

// What MLflow refuses in its variables, dtrain refuses before it makes a run, saying which.
TEST(MlflowServer, BadSystemMetricsVariablesAreRefusedAsMlflowRefusesThem) {
  ASSERT_EQ(g_env->error, "");  // fail, never skip, without a server
  auto python_refuses = [](const std::string& value) {
    auto r = run_command({DTRAIN_VENV_PYTHON, "-c",
                          "import sys, mlflow\n"
                          "mlflow.set_tracking_uri(sys.argv[1])\n"
                          "mlflow.start_run(); mlflow.end_run()\n",
                          g_env->server->url()},
                         {.env = {"MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING=" + value,
                                  "MLFLOW_EXPERIMENT_NAME=system_bad_python"},
                          .timeout = 120s});
    return r.exit_code != 0 && r.err.find("ValueError") != std::string::npos;
  };
  for (const char* value : {"yes", "on", ""}) {
    dtrain::test::ScopedEnv env;
    env.set("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", value);
    EXPECT_TRUE(python_refuses(value)) << value;
    try {
      dtrain::mlflow::Run::start(
          {.tracking_uri = g_env->server->url(), .experiment = "system_bad"});
      ADD_FAILURE() << "accepted MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING=" << value;
    } catch (const dtrain::UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING"),
                std::string::npos)
          << e.what();
    }
  }
  for (const char* value : {"True", "1", "FALSE", "0"}) {
    dtrain::test::ScopedEnv env;
    env.set("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", value);
    EXPECT_FALSE(python_refuses(value)) << value;
    EXPECT_NO_THROW(dtrain::mlflow::Run::start(
        {.tracking_uri = g_env->server->url(), .experiment = "system_bad"}))
        << value;
  }
  for (const char* interval : {"abc", "-1", "nan"}) {
    dtrain::test::ScopedEnv env;
    env.set("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "true");
    env.set("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", interval);
    EXPECT_THROW(dtrain::mlflow::Run::start(
                     {.tracking_uri = g_env->server->url(), .experiment = "system_bad"}),
                 dtrain::UsageError)
        << interval;
  }
  // dtrain refuses before it makes a run (MLflow makes the run, then raises): the four accepted.
  EXPECT_EQ(read_runs(g_env->server->url(), "system_bad")["runs"].size(), 4u);
}

TEST(MlflowServer, WorkerKilledBySignalIsFailedAndOnlyAStoppedLauncherIsKilled) {
  ASSERT_EQ(g_env->error, "");  // fail, never skip, without a server
  auto open_run = [](const std::string& name) {
    auto run = dtrain::mlflow::Run::start(
        {.tracking_uri = g_env->server->url(), .experiment = "outcome", .run_name = name});
    run.end(dtrain::mlflow::RunStatus::Running);  // left open, as a scheduler's run would be
    return run.id();
  };
  const std::string crashed = open_run("worker-sigkilled"), stopped = open_run("launcher-stopped");
  const std::vector<std::string> env{"MLFLOW_TRACKING_URI=" + g_env->server->url()};
  // A worker dies of SIGKILL (as the kernel's OOM killer would kill it): the launcher exits
  // 137, and the run FAILED, with the signal in the root cause. (`$$$$`: `dtrain run`, as
  // torchrun, makes `$$` in an argument one `$`.)
  auto r = run_command({DTRAIN_BIN, "run", "--mlflow-run-id", crashed, "--nproc-per-node", "1",
                        "/bin/sh", "-c", "kill -9 $$$$"},
                       {.env = env, .timeout = 60s});
  ASSERT_EQ(r.exit_code, 137) << r.err;
  // The launcher gets SIGTERM (the user or a scheduler stops the job): 143, and KILLED.
  auto launcher = dtrain::test::Process::start(
      {DTRAIN_BIN, "run", "--mlflow-run-id", stopped, "--nproc-per-node", "1", "/bin/sh", "-c",
       "echo started; exec sleep 30"},
      {.env = env, .timeout = 60s});
  ASSERT_TRUE(
      launcher.wait_for([](const std::string& out,
                           const std::string&) { return out.find("started") != std::string::npos; },
                        30s))
      << launcher.err();
  launcher.signal(SIGTERM);
  auto s = launcher.finish(30s);
  ASSERT_EQ(s.exit_code, 143) << s.err;
  std::map<std::string, nlohmann::json> by_id;
  const auto runs = read_runs(g_env->server->url(), "outcome")["runs"];
  for (const auto& run : runs) by_id[run["run_id"]] = run;
  ASSERT_EQ(by_id.size(), 2u);
  const auto& c = by_id[crashed];
  EXPECT_EQ(c["status"], "FAILED") << c;
  EXPECT_EQ(c["tags"]["dtrain.job_exit_code"], "137") << c["tags"];
  EXPECT_EQ(c["tags"]["dtrain.failed_rank"], "0") << c["tags"];
  EXPECT_EQ(c["tags"]["dtrain.failed_signal"], "9") << c["tags"];
  const auto& k = by_id[stopped];
  EXPECT_EQ(k["status"], "KILLED") << k;
  EXPECT_EQ(k["tags"]["dtrain.job_exit_code"], "143") << k["tags"];
  EXPECT_FALSE(k["tags"].contains("dtrain.failed_rank")) << k["tags"];  // no worker failed
}

TEST(MlflowServer, DistributorOpensADriverRunAndRankZerosRunNestsUnderIt) {
  ASSERT_EQ(g_env->error, "");  // fail, never skip, without a server
  auto r = run_command(
      {DISTRIBUTOR_EXAMPLE_BIN, "--nproc", "2", "--epochs", "1"},
      {.env = {"MLFLOW_TRACKING_URI=" + g_env->server->url(), "MLFLOW_EXPERIMENT_NAME=distributor"},
       .timeout = 300s});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto runs = read_runs(g_env->server->url(), "distributor")["runs"];
  ASSERT_EQ(runs.size(), 2u) << runs.dump(1);
  const auto& parent = runs[0]["parent"] == "" ? runs[0] : runs[1];
  const auto& child = runs[0]["parent"] == "" ? runs[1] : runs[0];
  EXPECT_EQ(parent["tags"]["mlflow.runName"], "distributor");
  EXPECT_EQ(parent["status"], "FINISHED");
  EXPECT_EQ(parent["tags"]["dtrain.job_exit_code"], "0");
  EXPECT_EQ(child["parent"], parent["run_id"]);
  EXPECT_EQ(child["status"], "FINISHED");
  EXPECT_EQ(child["params"]["world_size"], "2");
  EXPECT_EQ(steps_of(child["metrics"]["loss"]), range(1, 1));
}

// A run the user chose (MLFLOW_RUN_ID, as `dtrain run --mlflow-run-id`): the Distributor's job
// logs into it and tags it with the outcome; no driver run of its own.
TEST(MlflowServer, DistributorLogsIntoTheRunMlflowRunIdNames) {
  ASSERT_EQ(g_env->error, "");  // fail, never skip, without a server
  auto mine = dtrain::mlflow::Run::start({.tracking_uri = g_env->server->url(),
                                          .experiment = "distributor-chosen",
                                          .run_name = "mine"});
  ASSERT_TRUE(mine.active());
  auto r = run_command(
      {DISTRIBUTOR_EXAMPLE_BIN, "--nproc", "2", "--epochs", "1"},
      {.env = {"MLFLOW_TRACKING_URI=" + g_env->server->url(),
               "MLFLOW_EXPERIMENT_NAME=distributor-chosen", "MLFLOW_RUN_ID=" + mine.id()},
       .timeout = 300s});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto runs = read_runs(g_env->server->url(), "distributor-chosen")["runs"];
  ASSERT_EQ(runs.size(), 1u) << runs.dump(1);
  const auto& run = runs[0];
  EXPECT_EQ(run["run_id"], mine.id());
  EXPECT_EQ(run["tags"]["mlflow.runName"], "mine");
  EXPECT_EQ(run["tags"]["dtrain.job_exit_code"], "0") << run["tags"];
  EXPECT_EQ(run["status"], "FINISHED");
  EXPECT_EQ(run["params"]["world_size"], "2");
  EXPECT_EQ(steps_of(run["metrics"]["loss"]), range(1, 1));
}

// Last in this file, after every other case's requests (thousands of lines of the server's
// access log): the UI still renders a run.
TEST(MlflowServer, HeadlessChromiumShowsTheRunsMetricChartInMlflowsUi) {
  ASSERT_EQ(g_env->error, "");  // fail, never skip, without a server
  auto run = dtrain::mlflow::Run::start(
      {.tracking_uri = g_env->server->url(), .experiment = "ui", .run_name = "ui-check"});
  ASSERT_TRUE(run.active());
  for (int s = 1; s <= 200; ++s) run.log_metric("loss", 2.3 * std::exp(-s / 40.0) + 0.25, s);
  run.end(dtrain::mlflow::RunStatus::Finished);
  std::string page = g_env->server->url() + "/#/experiments/" + run.experiment_id() + "/runs/" +
                     run.id() + "/model-metrics";
  // The rendered page (after the UI's scripts fetched the run from the server) names the run.
  // (The chart itself draws lazily; the screenshot below, with the window's viewport, has it.)
  auto dom = run_command(
      {"/usr/bin/chromium", "--headless=new", "--no-sandbox", "--disable-gpu",
       "--disable-dev-shm-usage", "--user-data-dir=" + (g_env->dir / "chromium-dom").string(),
       "--virtual-time-budget=60000", "--dump-dom", page},
      {.timeout = 120s});
  ASSERT_EQ(dom.exit_code, 0) << dom.err;
  EXPECT_NE(dom.out.find("ui-check"), std::string::npos) << dom.out.substr(0, 3000);
  fs::path png = g_env->dir / "mlflow_run.png";
  auto shot = run_command(
      {std::string(DTRAIN_SOURCE_DIR) + "/tools/mlflow_screenshot.sh", page, png.string()},
      {.timeout = 150s});
  ASSERT_EQ(shot.exit_code, 0) << shot.err;
  ASSERT_TRUE(fs::exists(png));
  auto stats =
      run_command({DTRAIN_VENV_PYTHON,
                   std::string(DTRAIN_SOURCE_DIR) + "/tests/tracking/image_stats.py", png.string()},
                  {.timeout = 60s});
  ASSERT_EQ(stats.exit_code, 0) << stats.err;
  auto img = nlohmann::json::parse(stats.out);
  EXPECT_EQ(img["width"], 1400);
  EXPECT_GT(img["colors"].get<int>(), 50) << img;  // a page with text and a chart, not a blank one
  EXPECT_GT(img["non_white"].get<double>(), 0.01) << img;
  if (const char* keep = std::getenv("DTRAIN_KEEP_SCREENSHOT"))
    fs::copy_file(png, keep, fs::copy_options::overwrite_existing);
}

}  // namespace
