// dtrain::tune's MLflow logging against a real `mlflow server` (PyPI's mlflow, pinned in
// scripts/requirements.txt; tests/tracking/support.h starts it): the search is a parent run,
// every trial a child run with its config as params and its reports as metric history, read
// back with MLflow's own Python client.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "dtrain/tune.h"
#include "tracking/support.h"
#include "tune/mlflow_trials.h"

namespace fs = std::filesystem;
using namespace dtrain::tune;

namespace {

// Three reports; the trial with x = 3 fails after its first.
void reporting_trainable(Config config) {
  const double x = config.at("x").get<double>();
  for (int it = 1; it <= 3; ++it) {
    if (x == 3 && it == 2) throw std::runtime_error("injected failure");
    // A diverging run's loss: NaN, then infinite (MLflow gets them, as from Ray's callback).
    const double diverged = it == 2 ? std::nan("") : it == 3 ? -HUGE_VAL : 1.0;
    report({{"score", x * it}, {"half", 0.5 * it}, {"diverged", diverged}});
  }
}

}  // namespace

TEST(TuneMlflow, EveryTrialIsAChildRunOfTheSearchWithConfigParamsAndMetricHistory) {
  const fs::path dir =
      fs::temp_directory_path() / ("dtrain-tune-mlflow-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const auto t0 = std::chrono::steady_clock::now();
  auto since = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  dtrain::test::MlflowServer server(dir / "server", dtrain::test::free_port());
  ASSERT_EQ(server.start(), "");  // fail, never skip, without a server
  std::cerr << "mlflow server up after " << since() << " s\n";
  // Through the environment, as a user would: the Tuner's runs go there, and the trials'
  // processes (a Distributor each, which would open a run of its own) must open none.
  ::setenv("MLFLOW_TRACKING_URI", server.url().c_str(), 1);
  ::setenv("MLFLOW_EXPERIMENT_NAME", "tune_search", 1);
  Tuner tuner(
      reporting_trainable,
      Config{{"x", grid_search({1.0, 2.0, 3.0})}, {"model", {{"width", 8}, {"act", "relu"}}}},
      {.metric = "score",
       .mode = "max",
       .max_concurrent_trials = 2,
       .storage_path = (dir / "search").string(),
       .name = "mlflow_search",
       // Ray's trial_name_creator: x = 3 named "x3/<id>"; "" (the others) keeps Ray's name.
       .trial_name_creator =
           [](const dtrain::tune::Trial& t) {
             return t.config.at("x") == 3.0 ? "x3/" + t.id : std::string();
           },
       .verbose = false});
  ResultGrid grid = tuner.fit();
  std::cerr << "search done after " << since() << " s\n";
  ::unsetenv("MLFLOW_TRACKING_URI");
  ::unsetenv("MLFLOW_EXPERIMENT_NAME");
  ASSERT_EQ(grid.size(), 3u);

  auto runs = dtrain::test::read_runs(server.url(), "tune_search")["runs"];
  std::cerr << "runs read back after " << since() << " s\n";
  ASSERT_EQ(runs.size(), 4u) << runs.dump(1);  // the search and its 3 trials, nothing else
  nlohmann::json parent;
  std::map<std::string, nlohmann::json> children;  // by trial id
  for (const auto& r : runs) {
    if (r["parent"] == "") {
      parent = r;
    } else {
      children[r["tags"].value("dtrain.tune.trial_id", "?")] = r;
    }
  }
  ASSERT_TRUE(parent.is_object()) << runs.dump(1);
  EXPECT_EQ(parent["status"], "FINISHED");
  EXPECT_EQ(parent["tags"]["mlflow.runName"], "mlflow_search");
  ASSERT_EQ(children.size(), 3u) << runs.dump(1);
  for (const auto& t : grid.trials()) {
    ASSERT_TRUE(children.count(t.id)) << t.id << " has no run: " << runs.dump(1);
    const nlohmann::json run = children[t.id];
    EXPECT_EQ(run["parent"], parent["run_id"]) << t.id;
    // Named as Ray's MLflowLoggerCallback names it: str(trial), "<trainable>_<trial id>" (the
    // trainable without with_name is "train_fn") or trial_name_creator's name as it returned
    // it, also as the "trial_name" tag.
    const double x = t.config.at("x").get<double>();
    const std::string name = x == 3.0 ? "x3/" + t.id : "train_fn_" + t.id;
    EXPECT_EQ(t.name, name);
    EXPECT_EQ(run["tags"]["mlflow.runName"], name);
    EXPECT_EQ(run["tags"]["trial_name"], name);
    // The config as params, nested keys joined by "/".
    EXPECT_EQ(run["params"]["x"], t.config.at("x").dump());
    EXPECT_EQ(run["params"]["model/width"], "8");
    EXPECT_EQ(run["params"]["model/act"], "relu");
    // Every report as history, step = training_iteration, equal to the Tuner's own history.
    const nlohmann::json score = run["metrics"].value("score", nlohmann::json::array());
    ASSERT_EQ(score.size(), t.history.size()) << t.id << ": " << run.dump(1);
    for (std::size_t i = 0; i < t.history.size(); ++i) {
      EXPECT_EQ(score[i][0].get<int64_t>(), static_cast<int64_t>(i + 1));
      EXPECT_DOUBLE_EQ(score[i][1].get<double>(), x * static_cast<double>(i + 1));
      EXPECT_DOUBLE_EQ(run["metrics"].at("half").at(i).at(1).get<double>(),
                       0.5 * static_cast<double>(i + 1));
      EXPECT_EQ(run["metrics"].at("training_iteration").at(i).at(1).get<double>(),
                static_cast<double>(i + 1));
      // As Ray's MLflowLoggerCallback: the flattened result's numbers, the config's too.
      EXPECT_EQ(run["metrics"].at("config/x").at(i).at(1).get<double>(), x);
      EXPECT_EQ(run["metrics"].at("iterations_since_restore").at(i).at(1).get<double>(),
                static_cast<double>(i + 1));
      // NaN and -inf are logged (read_runs.py spells NaN as a string); MLflow's server keeps
      // an infinity as the largest double of its sign, as it does for its own client's.
      const nlohmann::json diverged = run["metrics"].at("diverged").at(i).at(1);
      if (i == 1) {
        EXPECT_EQ(diverged, "NaN") << t.id;
      } else {
        EXPECT_EQ(diverged.get<double>(), i == 2 ? -std::numeric_limits<double>::max() : 1.0)
            << t.id << " " << i;
      }
      // The trial's own history keeps the numbers the trainable reported.
      const double h = t.history[i].at("diverged").get<double>();
      EXPECT_TRUE(i == 1 ? std::isnan(h) : i == 2 ? h == -HUGE_VAL : h == 1.0) << h;
    }
    if (x == 3) {
      EXPECT_EQ(t.status, TrialStatus::Error);
      EXPECT_EQ(run["status"], "FAILED");
      EXPECT_EQ(run["tags"]["dtrain.tune.status"], "ERROR");
      EXPECT_NE(run["tags"].value("dtrain.tune.error", "").find("injected failure"),
                std::string::npos)
          << run.dump(1);
      EXPECT_EQ(score.size(), 1u);
    } else {
      EXPECT_EQ(t.status, TrialStatus::Terminated) << t.error;
      EXPECT_EQ(run["status"], "FINISHED");
      EXPECT_EQ(run["tags"]["dtrain.tune.status"], "TERMINATED");
      EXPECT_EQ(score.size(), 3u);
    }
  }
  server.stop();
  fs::remove_all(dir);
}

// Which result values Ray's MLflowLoggerCallback logs, and as what: Python's float(value).
TEST(TuneMlflow, ResultValuesAreTakenAsPythonsFloatTakesThem) {
  const std::vector<std::string> texts = {
      "1",         "-2.5",        " 3e2 ", "1_000",    "1__0",      "_1",      "1_",    ".5",
      "5.",        ".",           "",      "  ",       "e5",        "1e_5",    "1e1_0", "nan",
      "-NaN",      "inf",         "+inf",  "Infinity", "-infinity", "infinit", "0x10",  "1,5",
      "127.0.0.1", "abc12_00000", "12_34", "+",        "-.5e-3",    "1.5\n",   "\t7\t", "1 2",
      "nan(1)",    "--1",         "1e",    "1.2.3"};
  nlohmann::json in = nlohmann::json::array();
  for (const auto& t : texts) in.push_back(t);
  const std::string script =
      "import json, sys\n"
      "out = []\n"
      "for t in json.loads(sys.argv[1]):\n"
      "    try:\n"
      "        v = float(t)\n"
      "        out.append('nan' if v != v else repr(v))\n"
      "    except ValueError:\n"
      "        out.append(None)\n"
      "print(json.dumps(out))\n";
  auto r = dtrain::test::run_command({DTRAIN_VENV_PYTHON, "-c", script, in.dump()},
                                     {.timeout = std::chrono::seconds(60)});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json theirs = nlohmann::json::parse(r.out);
  ASSERT_EQ(theirs.size(), texts.size());
  for (std::size_t i = 0; i < texts.size(); ++i) {
    const auto ours = dtrain::tune::detail::python_float(texts[i]);
    if (theirs[i].is_null()) {
      EXPECT_FALSE(ours.has_value()) << "'" << texts[i] << "' gave " << *ours;
    } else if (theirs[i] == "nan") {
      EXPECT_TRUE(ours && std::isnan(*ours)) << "'" << texts[i] << "'";
    } else {
      ASSERT_TRUE(ours.has_value()) << "'" << texts[i] << "' is " << theirs[i];
      EXPECT_EQ(std::stod(theirs[i].get<std::string>()), *ours) << "'" << texts[i] << "'";
    }
  }
  // Not strings: booleans as 0/1, numbers as they are, None and containers not at all.
  EXPECT_EQ(dtrain::tune::detail::python_float(true), 1.0);
  EXPECT_EQ(dtrain::tune::detail::python_float(3), 3.0);
  EXPECT_FALSE(dtrain::tune::detail::python_float(nullptr).has_value());
  EXPECT_FALSE(dtrain::tune::detail::python_float(nlohmann::json::array({1})).has_value());
}

int main(int argc, char** argv) {
  dtrain::init(argc, argv);  // a trial's worker runs its trainable here and exits
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
