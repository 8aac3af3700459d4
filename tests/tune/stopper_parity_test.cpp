// dtrain::tune's stoppers against Ray Tune's own (ray.tune.stopper, the venv's Ray 2.60).
//
// Each case is a stopper (or a combination) and a recorded stream of results from several
// trials, interleaved as asynchronous trials report: learning curves that level off (some
// exactly, some within noise), results without the metric, ties. The same cases go to
// tests/tune/ray_stopper_peer.py, which builds Ray's classes with the same arguments and calls
// them in the same order; for every result `stopper(trial_id, result)` and then `stop_all()`
// must answer the same on both sides ("ERROR" where Ray raises and dtrain throws UsageError),
// and a FunctionStopper's function must get the same arguments. Constructor arguments Ray
// refuses must be the ones dtrain refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>

#include <unistd.h>

#include "dtrain/error.h"
#include "dtrain/tune_stoppers.h"
#include "support/paths.h"

namespace fs = std::filesystem;
using namespace dtrain::tune;

namespace {

std::vector<Config> g_seen;  // what the FunctionStopper functions were called with

FunctionStopper::Function make_function(const Config& o) {
  const std::string name = o.at("fn");
  if (name == "score_at_least") {
    const double bound = o.at("bound");
    return [bound](const std::string& id, const Result& r) {
      g_seen.push_back(Config::array({id, r}));
      return r.contains("score") && r.at("score").get<double>() >= bound;
    };
  }
  const int k = o.at("k");
  return [k](const std::string& id, const Result& r) {
    g_seen.push_back(Config::array({id, r}));
    const bool odd = std::stoi(id.substr(1)) % 2 == 1;
    return odd && r.at("training_iteration").get<int>() % k == 0;
  };
}

std::shared_ptr<Stopper> make_stopper(const Config& spec) {
  const std::string kind = spec.at("kind");
  const Config o = spec.value("options", Config::object());
  if (kind == "max_iter") return std::make_shared<MaximumIterationStopper>(o.at("max_iter"));
  if (kind == "trial_plateau") {
    TrialPlateauOptions p{.metric = o.at("metric")};
    p.std = o.value("std", p.std);
    p.num_results = o.value("num_results", p.num_results);
    p.grace_period = o.value("grace_period", p.grace_period);
    if (o.contains("metric_threshold")) p.metric_threshold = o.at("metric_threshold");
    p.mode = o.value("mode", "");
    return std::make_shared<TrialPlateauStopper>(p);
  }
  if (kind == "experiment_plateau") {
    ExperimentPlateauOptions p{.metric = o.at("metric")};
    p.std = o.value("std", p.std);
    p.top = o.value("top", p.top);
    p.mode = o.value("mode", p.mode);
    p.patience = o.value("patience", p.patience);
    return std::make_shared<ExperimentPlateauStopper>(p);
  }
  if (kind == "timeout") {
    return std::make_shared<TimeoutStopper>(
        std::chrono::duration<double>(o.at("seconds").get<double>()));
  }
  if (kind == "function") return std::make_shared<FunctionStopper>(make_function(o));
  std::vector<std::shared_ptr<Stopper>> parts;
  for (const auto& s : spec.at("stoppers")) parts.push_back(make_stopper(s));
  return std::make_shared<CombinedStopper>(parts);
}

Config run_case(const Config& c) {
  if (c.contains("construct")) {
    try {
      make_stopper(c.at("construct"));
      return {{"raises", false}};
    } catch (const dtrain::UsageError&) {
      return {{"raises", true}};
    }
  }
  g_seen.clear();
  auto stopper = make_stopper(c.at("stopper"));
  Config decisions = Config::array();
  for (const auto& ev : c.at("events")) {
    Config rec = Config::object();
    try {
      rec["stop"] = (*stopper)(ev.at("trial").get<std::string>(), ev.at("result"));
    } catch (const dtrain::UsageError&) {
      rec["stop"] = "ERROR";
    }
    rec["stop_all"] = stopper->stop_all();
    decisions.push_back(rec);
  }
  Config seen = Config::array();
  for (auto& s : g_seen) seen.push_back(s);
  return {{"decisions", decisions}, {"seen", seen}};
}

double round6(double x) { return std::round(x * 1e6) / 1e6; }

// Trials t0..t{n-1} report `steps` results each, interleaved at random. Trial i's metric levels
// off at quality q_i: q_i * (1 - 0.6^it) plus noise that shrinks by `decay` per step; with
// `flat_after` > 0 the value is exactly q_i from that step on. `missing`: the chance a result
// lacks the metric. Results look like the Tuner's (not flattened: "config" is an object).
Config make_events(std::mt19937_64& g, int n, int steps, const std::string& metric, double noise,
                   double decay, int flat_after = 0, double missing = 0, bool ties = false) {
  std::uniform_real_distribution<double> U(0, 1);
  std::vector<double> q(n);
  for (auto& x : q) x = ties ? 0.5 : round6(0.3 + 0.6 * U(g));
  std::vector<int> done(n, 0);
  Config events = Config::array();
  for (int left = n * steps; left > 0;) {
    const int i = static_cast<int>(std::floor(std::pow(U(g), 0.8) * n));
    if (i >= n || done[i] >= steps) continue;
    const int it = ++done[i];
    --left;
    double v = q[i] * (1 - std::pow(0.6, it)) + noise * std::pow(decay, it) * (U(g) - 0.5);
    if (flat_after > 0 && it >= flat_after) v = q[i];
    std::string id = "t";
    id += std::to_string(i);
    Result r = Result::object();
    if (!(missing > 0 && U(g) < missing)) r[metric] = round6(v);
    r["done"] = false;
    r["training_iteration"] = it;
    r["trial_id"] = id;
    r["time_total_s"] = round6(it * 1.5);
    r["config"] = {{"lr", round6(0.01 * (i + 1))}, {"nested", {{"a", i}}}};
    r["iterations_since_restore"] = it;
    events.push_back({{"trial", id}, {"result", r}});
  }
  return events;
}

// Exact values on the edges (a sd equal to `std`, a value equal to the threshold): trial
// t{i % trials} reports values[i] as "score".
Config fixed_events(int trials, const std::vector<double>& values) {
  Config events = Config::array();
  std::vector<int> it(trials, 0);
  for (std::size_t i = 0; i < values.size(); ++i) {
    const int t = static_cast<int>(i % trials);
    std::string id = "t";
    id += std::to_string(t);
    events.push_back(
        {{"trial", id},
         {"result", {{"score", values[i]}, {"training_iteration", ++it[t]}, {"trial_id", id}}}});
  }
  return events;
}

Config stopper(const std::string& kind, Config options) {
  return {{"kind", kind}, {"options", std::move(options)}};
}
Config combined(std::vector<Config> parts) {
  Config s{{"kind", "combined"}, {"stoppers", Config::array()}};
  for (auto& p : parts) s["stoppers"].push_back(std::move(p));
  return s;
}

Config build_cases() {
  std::mt19937_64 g(20261129);
  Config cases = Config::array();
  auto add = [&](const std::string& name, Config spec, Config events) {
    cases.push_back({{"name", name}, {"stopper", std::move(spec)}, {"events", std::move(events)}});
  };
  add("max_iter_3", stopper("max_iter", {{"max_iter", 3}}),
      make_events(g, 4, 6, "score", 0.1, 0.9));
  add("max_iter_1", stopper("max_iter", {{"max_iter", 1}}),
      make_events(g, 3, 3, "score", 0.1, 0.9));
  add("max_iter_0", stopper("max_iter", {{"max_iter", 0}}),
      make_events(g, 2, 2, "score", 0.1, 0.9));
  // Ray's defaults (std 0.01, 4 results, grace 4) on curves whose noise shrinks.
  for (int k = 0; k < 3; ++k) {
    add("trial_plateau_default_" + std::to_string(k),
        stopper("trial_plateau", {{"metric", "score"}}), make_events(g, 5, 14, "score", 0.05, 0.8));
  }
  add("trial_plateau_flat",
      stopper("trial_plateau",
              {{"metric", "score"}, {"std", 1e-9}, {"num_results", 3}, {"grace_period", 2}}),
      make_events(g, 4, 10, "score", 0.02, 0.9, 5));
  add("trial_plateau_threshold_max",
      stopper("trial_plateau", {{"metric", "score"},
                                {"std", 0.05},
                                {"num_results", 3},
                                {"grace_period", 5},
                                {"metric_threshold", 0.6},
                                {"mode", "max"}}),
      make_events(g, 6, 12, "score", 0.05, 0.85));
  add("trial_plateau_threshold_min",
      stopper("trial_plateau", {{"metric", "loss"},
                                {"std", 0.03},
                                {"num_results", 5},
                                {"grace_period", 1},
                                {"metric_threshold", 0.5},
                                {"mode", "min"}}),
      make_events(g, 6, 12, "loss", 0.05, 0.85));
  // Ray's `if self._metric_threshold:`: a threshold of 0 needs no mode, and is not checked.
  add("trial_plateau_threshold_zero",
      stopper("trial_plateau", {{"metric", "score"}, {"std", 0.02}, {"metric_threshold", 0.0}}),
      make_events(g, 3, 10, "score", 0.03, 0.8));
  add("trial_plateau_holes",
      stopper("trial_plateau",
              {{"metric", "score"}, {"std", 0.05}, {"num_results", 2}, {"grace_period", 2}}),
      make_events(g, 4, 12, "score", 0.02, 0.8, 0, 0.15));
  add("trial_plateau_holes_threshold",
      stopper("trial_plateau", {{"metric", "score"},
                                {"std", 0.05},
                                {"num_results", 2},
                                {"grace_period", 2},
                                {"metric_threshold", 0.1},
                                {"mode", "max"}}),
      make_events(g, 3, 10, "score", 0.02, 0.8, 0, 0.2));
  // Ray's defaults: min, top 10, std 0.001, patience 0.
  add("experiment_plateau_default", stopper("experiment_plateau", {{"metric", "loss"}}),
      make_events(g, 4, 12, "loss", 0.0004, 0.9, 0, 0, true));
  add("experiment_plateau_max_patience",
      stopper("experiment_plateau",
              {{"metric", "score"}, {"std", 0.01}, {"top", 3}, {"mode", "max"}, {"patience", 2}}),
      make_events(g, 5, 10, "score", 0.01, 0.7, 0, 0, true));
  add("experiment_plateau_missing",
      stopper("experiment_plateau", {{"metric", "score"}, {"std", 0.5}, {"top", 2}}),
      make_events(g, 3, 4, "score", 0.01, 0.7, 0, 0.3));
  // any(): a stopper after the first that said yes is not asked about that result.
  add("combined",
      combined(
          {stopper("max_iter", {{"max_iter", 7}}),
           stopper("trial_plateau",
                   {{"metric", "score"}, {"std", 0.02}, {"num_results", 3}, {"grace_period", 3}}),
           stopper("experiment_plateau", {{"metric", "score"},
                                          {"std", 0.004},
                                          {"top", 4},
                                          {"mode", "max"},
                                          {"patience", 1}})}),
      make_events(g, 5, 10, "score", 0.02, 0.8, 6, 0, true));
  add("function_score", stopper("function", {{"fn", "score_at_least"}, {"bound", 0.6}}),
      make_events(g, 4, 8, "score", 0.05, 0.9, 0, 0.1));
  add("combined_function_timeouts",
      combined({stopper("function", {{"fn", "every_kth_of_odd_trials"}, {"k", 3}}),
                stopper("timeout", {{"seconds", 3600.0}}), stopper("max_iter", {{"max_iter", 5}})}),
      make_events(g, 4, 7, "score", 0.05, 0.9));
  add("timeout_zero", stopper("timeout", {{"seconds", 0.0}}),
      make_events(g, 2, 3, "score", 0.05, 0.9));
  // sd of {0, 1} is exactly 0.5: TrialPlateau wants < std, ExperimentPlateau <= std.
  add("trial_plateau_sd_equal",
      stopper("trial_plateau",
              {{"metric", "score"}, {"std", 0.5}, {"num_results", 2}, {"grace_period", 1}}),
      fixed_events(1, {0, 1, 0, 1, 1, 1}));
  add("experiment_plateau_sd_equal",
      stopper("experiment_plateau",
              {{"metric", "score"}, {"std", 0.5}, {"top", 2}, {"mode", "min"}}),
      fixed_events(2, {3, 2, 1, 0.5}));
  add("experiment_plateau_sd_equal_max",
      stopper("experiment_plateau",
              {{"metric", "score"}, {"std", 0.5}, {"top", 2}, {"mode", "max"}, {"patience", 1}}),
      fixed_events(2, {0, 1, 2, 0.5, 1, 2}));
  for (const std::string mode : {"min", "max"}) {
    add("trial_plateau_at_threshold_" + mode,
        stopper("trial_plateau", {{"metric", "score"},
                                  {"std", 0.1},
                                  {"num_results", 2},
                                  {"grace_period", 2},
                                  {"metric_threshold", 0.5},
                                  {"mode", mode}}),
        fixed_events(1, {0.5, 0.5, 0.25, 0.25, 0.75, 0.75}));
  }
  // Constructor arguments: Ray raises ValueError exactly where dtrain throws UsageError.
  const std::vector<std::pair<std::string, Config>> constructs{
      {"tp_threshold_without_mode",
       stopper("trial_plateau", {{"metric", "m"}, {"metric_threshold", 0.5}})},
      {"tp_threshold_bad_mode",
       stopper("trial_plateau", {{"metric", "m"}, {"metric_threshold", 0.5}, {"mode", "avg"}})},
      {"tp_threshold_zero_without_mode",
       stopper("trial_plateau", {{"metric", "m"}, {"metric_threshold", 0.0}})},
      {"tp_plain", stopper("trial_plateau", {{"metric", "m"}})},
      {"ep_mode", stopper("experiment_plateau", {{"metric", "m"}, {"mode", "avg"}})},
      {"ep_top_1", stopper("experiment_plateau", {{"metric", "m"}, {"top", 1}})},
      {"ep_top_2", stopper("experiment_plateau", {{"metric", "m"}, {"top", 2}})},
      {"ep_patience", stopper("experiment_plateau", {{"metric", "m"}, {"patience", -1}})},
      {"ep_std_zero", stopper("experiment_plateau", {{"metric", "m"}, {"std", 0.0}})},
      {"ep_std_negative", stopper("experiment_plateau", {{"metric", "m"}, {"std", -0.5}})},
      {"ep_plain", stopper("experiment_plateau", {{"metric", "m"}})},
  };
  for (const auto& [name, spec] : constructs)
    cases.push_back({{"name", name}, {"construct", spec}});
  return cases;
}

}  // namespace

TEST(TuneStopperParity, StoppersDecideAsRayTunesOwn) {
  const Config cases = build_cases();
  const fs::path dir =
      fs::temp_directory_path() / ("dtrain-stopper-parity-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "cases.json") << cases.dump();
  const std::string cmd = std::string(DTRAIN_VENV_PYTHON) + " " + DTRAIN_SOURCE_DIR +
                          "/tests/tune/ray_stopper_peer.py " + (dir / "cases.json").string() + " " +
                          (dir / "ray.json").string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "Ray Tune stopper peer failed: " << cmd;
  std::ifstream in(dir / "ray.json");
  const Config ray = Config::parse(in);
  int stops = 0, stop_alls = 0, errors = 0, raises = 0, decisions = 0;
  for (const auto& c : cases) {
    const std::string name = c.at("name");
    const Config ours = run_case(c);
    ASSERT_TRUE(ray.contains(name)) << name;
    const Config& theirs = ray.at(name);
    if (c.contains("construct")) {
      EXPECT_EQ(ours.at("raises"), theirs.at("raises")) << name;
      raises += theirs.at("raises").get<bool>();
      continue;
    }
    ASSERT_EQ(ours.at("decisions").size(), theirs.at("decisions").size()) << name;
    for (std::size_t i = 0; i < ours.at("decisions").size(); ++i) {
      EXPECT_EQ(ours.at("decisions")[i], theirs.at("decisions")[i])
          << name << " result " << i << ": " << c.at("events")[i].dump();
      const Config& d = theirs.at("decisions")[i];
      stops += d.at("stop") == true;
      errors += d.at("stop") == "ERROR";
      stop_alls += d.at("stop_all") == true;
      ++decisions;
    }
    EXPECT_EQ(ours.at("seen"), theirs.at("seen")) << name;
  }
  // The cases exercise every outcome (a case set that never stops would prove nothing).
  EXPECT_GT(stops, 20);
  EXPECT_GT(stop_alls, 3);
  EXPECT_GT(errors, 0);
  EXPECT_GT(raises, 3);
  std::printf(
      "stopper parity: %d decisions (%d stops, %d stop_all, %d errors), %d constructors "
      "refused\n",
      decisions, stops, stop_alls, errors, raises);
  fs::remove_all(dir);
}

TEST(TuneStopperParity, TimeoutStopperCountsFromItsFirstCheck) {
  // Bounds, not timings: well inside the budget it holds, past it it has ended.
  TimeoutStopper t(std::chrono::seconds(2));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // before the first check: free
  EXPECT_FALSE(t(std::string("t0"), Result::object()));
  EXPECT_FALSE(t.stop_all());  // the first check starts the clock
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_FALSE(t.stop_all());
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  EXPECT_TRUE(t.stop_all());
  EXPECT_THROW(TimeoutStopper(std::chrono::seconds(-1)), dtrain::UsageError);
  EXPECT_THROW(FunctionStopper(nullptr), dtrain::UsageError);
  EXPECT_THROW(CombinedStopper(std::vector<std::shared_ptr<Stopper>>{nullptr}), dtrain::UsageError);
}
