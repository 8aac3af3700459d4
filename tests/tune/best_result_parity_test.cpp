// dtrain::tune::ResultGrid::best_result against Ray Tune's own ResultGrid.get_best_result (the
// venv's Ray 2.60, tests/tune/ray_best_result_peer.py; it must be there: the test fails, never
// skips, without it).
//
// Each case is a few trials' recorded results: hand-made ones where the scopes disagree, NaN
// and infinities at the start, middle and end, fewer than 5 (10) reports, a metric missing from
// some results (Ray's avg then weights by training_iteration, not by count), a restore that
// repeats iterations, nested, integer and boolean metrics, keys Ray leaves out ("config/...",
// "timestamp"), ties; then seeded random ones. For every scope ("last", "all", "avg",
// "last-5-avg", "last-10-avg" and a bad one) and mode, the best trial (or an error) and every
// trial's score must be equal to Ray's.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>

#include "dtrain/error.h"
#include "dtrain/tune.h"
#include "support/paths.h"
#include "tune/state_json.h"

namespace fs = std::filesystem;
using namespace dtrain::tune;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// A result as the Tuner completes it (the keys Ray's metric_analysis leaves out included).
Result result(std::int64_t iteration, const Config& metrics) {
  Result r = metrics;
  r["timestamp"] = 1700000000 + iteration;
  r["training_iteration"] = iteration;
  r["trial_id"] = "x";
  r["config"] = {{"m", 99}, {"lr", 0.1}};
  return r;
}

// A trial reporting `m` once per iteration from 1.
Config trial(const std::string& id, const std::vector<double>& values) {
  Config reports = Config::array();
  for (std::size_t i = 0; i < values.size(); ++i)
    reports.push_back(result(static_cast<std::int64_t>(i) + 1, {{"m", values[i]}}));
  return {{"id", id}, {"reports", reports}};
}

Config one_case(const std::string& name, std::vector<Config> trials,
                const std::string& metric = "m") {
  return {{"name", name}, {"metric", metric}, {"trials", trials}};
}

Config build_cases() {
  std::vector<Config> cases;
  // Each scope its own winner: a rises late (last), b peaks early (all), c steady (avg, 10).
  cases.push_back(one_case("scopes_disagree",
                           {trial("a", {1, 1, 1, 2, 2, 3, 9}), trial("b", {10, 2, 2, 2, 2, 2, 2}),
                            trial("c", {4, 4, 4, 4, 4, 4, 4}), trial("d", {0, 0, 5, 5, 5, 5, 5})}));
  // More than 10 reports: the windows slide.
  std::vector<double> longer, steady;
  for (int i = 0; i < 14; ++i) {
    longer.push_back(i < 4 ? 20.0 - i : 0.5 * i);
    steady.push_back(5.25);
  }
  cases.push_back(one_case("windows_slide", {trial("a", longer), trial("b", steady)}));
  // NaN and infinities: at the start, in the window and out of it, inf - inf, only NaN.
  cases.push_back(
      one_case("nan_and_inf",
               {trial("nan_first", {kNaN, 1, 2, 3, 4, 5, 6}),
                trial("nan_mid", {3, 4, kNaN, 8, 8, 8, 8, 8}), trial("nan_last", {9, 9, kNaN}),
                trial("inf", {1, kInf, 2, 2, 2, 2, 2}), trial("inf_minus_inf", {kInf, -kInf, 3}),
                trial("minus_inf", {-kInf, 0.5, 0.25}), trial("only_nan", {kNaN, kNaN})}));
  // Fewer than 5 reports, one trial with a single report, one without the metric at all.
  Config other = {{"id", "other"}, {"reports", {result(1, {{"loss", 1.0}})}}};
  cases.push_back(one_case("few_reports", {trial("one", {3}), trial("two", {1, 5}),
                                           trial("three", {2.5, 2.5, 2.75}), other}));
  // Every score NaN or infinite: no best trial (Ray raises, dtrain throws).
  cases.push_back(one_case("no_finite_score", {trial("a", {kNaN}), trial("b", {kInf, kNaN})}));
  // The metric missing from the first and some later results: Ray's avg starts at its first
  // value and weights by training_iteration (7, then (2 + 4 * 7) / 5 at iteration 5, ...).
  Config gaps = Config::array();
  gaps.push_back(result(1, {{"loss", 1}}));
  gaps.push_back(result(2, {{"loss", 1}}));
  gaps.push_back(result(3, {{"loss", 1}}));
  gaps.push_back(result(4, {{"m", 7}}));
  gaps.push_back(result(5, {{"m", 2}}));
  gaps.push_back(result(6, {{"loss", 1}}));
  gaps.push_back(result(7, {{"m", 3.5}}));
  cases.push_back(one_case("metric_skips_results",
                           {{{"id", "gaps"}, {"reports", gaps}}, trial("full", {3, 3, 3, 3})}));
  // A restore from the checkpoint of iteration 2 after iteration 4: 3 and 4 come again; Ray
  // counts both runs' results (step 3 twice in avg).
  Config restored = Config::array();
  for (std::int64_t i : {1, 2, 3, 4, 3, 4, 5})
    restored.push_back(result(i, {{"m", 1.5 * static_cast<double>(i) + (i > 2 ? 0.25 : 0)}}));
  cases.push_back(one_case("restore_repeats_iterations",
                           {{{"id", "restored"}, {"reports", restored}}, trial("plain", {4, 4})}));
  // A nested metric, integers, booleans.
  Config nested_a = Config::array(), nested_b = Config::array();
  for (int i = 1; i <= 6; ++i) {
    nested_a.push_back(result(i, {{"eval", {{"loss", 1.0 / i}}}}));
    nested_b.push_back(result(i, {{"eval", {{"loss", 0.3}}}}));
  }
  cases.push_back(one_case(
      "nested", {{{"id", "a"}, {"reports", nested_a}}, {{"id", "b"}, {"reports", nested_b}}},
      "eval/loss"));
  Config ints_a = Config::array(), ints_b = Config::array(), bools = Config::array();
  for (int i = 1; i <= 7; ++i) {
    ints_a.push_back(result(i, {{"n", i * i}}));
    ints_b.push_back(result(i, {{"n", 13}}));
    bools.push_back(result(i, {{"n", i % 3 == 0}}));
  }
  cases.push_back(one_case("integers_and_booleans",
                           {{{"id", "squares"}, {"reports", ints_a}},
                            {{"id", "thirteen"}, {"reports", ints_b}},
                            {{"id", "bools"}, {"reports", bools}}},
                           "n"));
  // Keys Ray leaves out of metric_analysis: the config and the timestamp are no metric.
  cases.push_back(
      one_case("config_is_no_metric", {trial("a", {1, 2}), trial("b", {3, 4})}, "config/lr"));
  cases.push_back(
      one_case("timestamp_is_no_metric", {trial("a", {1, 2}), trial("b", {3, 4})}, "timestamp"));
  cases.push_back(one_case("training_iteration_is", {trial("a", {1, 2, 3}), trial("b", {3, 4})},
                           "training_iteration"));
  // Ties: the first trial wins.
  cases.push_back(one_case("ties", {trial("a", {1, 3}), trial("b", {2, 2}), trial("c", {3, 1})}));

  // Seeded random trials: small integers and halves (exact ties, exact averages), NaN and
  // infinities now and then, results without the metric, restores.
  std::mt19937 g(2024);
  auto pick = [&](int n) { return static_cast<int>(g() % static_cast<unsigned>(n)); };
  for (int c = 0; c < 40; ++c) {
    std::vector<Config> trials;
    const int num_trials = 2 + pick(4);
    for (int t = 0; t < num_trials; ++t) {
      Config reports = Config::array();
      const int n = pick(14);
      std::int64_t it = 0;
      for (int k = 0; k < n; ++k) {
        it = pick(10) == 0 && it > 2 ? it - 1 - pick(2) : it + 1;  // a restore now and then
        const int kind = pick(20);
        Config m;
        if (kind == 0) {
          m = {{"other", 1}};
        } else if (kind == 1) {
          m = {{"m", kNaN}};
        } else if (kind == 2) {
          m = {{"m", pick(2) == 0 ? kInf : -kInf}};
        } else if (kind < 8) {
          m = {{"m", pick(6)}};
        } else {
          m = {{"m", pick(40) / 4.0 - 2.0}};
        }
        reports.push_back(result(it, m));
      }
      trials.push_back({{"id", "t" + std::to_string(t)}, {"reports", reports}});
    }
    cases.push_back(one_case("random_" + std::to_string(c), trials));
  }
  return cases;
}

// The TrialResults of a case: `reports` as fit() fills it; `history` what the restores left.
ResultGrid grid_of(const Config& c) {
  std::vector<TrialResult> trials;
  for (const auto& t : c.at("trials")) {
    TrialResult r;
    r.id = t.at("id");
    for (const auto& x : t.at("reports")) r.reports.push_back(x);
    r.history = r.reports;
    trials.push_back(std::move(r));
  }
  return ResultGrid(std::move(trials), "", "", "");
}

bool same_score(const std::optional<double>& ours, const Config& theirs) {
  if (theirs.is_null()) return !ours.has_value();
  if (!ours) return false;
  const double t = theirs.is_boolean() ? (theirs.get<bool>() ? 1.0 : 0.0) : theirs.get<double>();
  return (std::isnan(*ours) && std::isnan(t)) || *ours == t;
}

std::string text(const std::optional<double>& v) {
  if (!v) return "none";
  std::ostringstream s;
  s.precision(17);
  s << *v;
  return s.str();
}

}  // namespace

TEST(TuneBestResultParity, ScopesChooseAndScoreAsRayTunesGetBestResult) {
  const Config cases = build_cases();
  const fs::path dir =
      fs::temp_directory_path() / ("dtrain-best-result-parity-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "cases.json") << dtrain::tune::detail::dump_state_json(cases);
  const std::string cmd = std::string(DTRAIN_VENV_PYTHON) + " " + DTRAIN_SOURCE_DIR +
                          "/tests/tune/ray_best_result_peer.py " + (dir / "cases.json").string() +
                          " " + (dir / "ray.json").string();
  ASSERT_EQ(std::system(cmd.c_str()), 0)
      << "Ray Tune peer failed (the venv's ray[tune] is required): " << cmd;
  std::ifstream in(dir / "ray.json");
  std::stringstream ray_text;
  ray_text << in.rdbuf();
  const Config ray = dtrain::tune::detail::parse_state_json(ray_text.str(), "ray.json");
  fs::remove_all(dir);

  int answers = 0, errors = 0, non_finite = 0;
  int unfiltered_differs = 0;                    // choices filter_nan_and_inf=false changes
  std::map<std::string, int> differs_from_last;  // scope -> cases choosing another trial
  for (const auto& c : cases) {
    const std::string name = c.at("name");
    ASSERT_TRUE(ray.contains(name)) << name;
    const ResultGrid grid = grid_of(c);
    const std::string metric = c.at("metric");
    for (const std::string scope :
         {"last", "all", "avg", "last-5-avg", "last-10-avg", "last-3-avg"}) {
      for (const std::string mode : {"min", "max"}) {
        const std::string key = scope + "/" + mode;
        const Config& theirs = ray.at(name).at(key);
        std::string ours;
        try {
          ours = grid.best_result(metric, mode, scope).id;
        } catch (const dtrain::UsageError&) {
          ours = "ERROR";
        }
        EXPECT_EQ(ours, theirs.at("best").get<std::string>()) << name << " " << key;
        errors += ours == "ERROR";
        ++answers;
        std::string unfiltered;
        try {
          unfiltered = grid.best_result(metric, mode, scope, false).id;
        } catch (const dtrain::UsageError&) {
          unfiltered = "ERROR";
        }
        EXPECT_EQ(unfiltered, theirs.at("unfiltered").get<std::string>())
            << name << " " << key << " filter_nan_and_inf=false";
        unfiltered_differs += unfiltered != ours;
        ++answers;
        if (scope == "last-3-avg") continue;  // refused: no scores
        if (ours != "ERROR" && ours != grid.best_result(metric, mode, "last").id)
          ++differs_from_last[scope];
        for (std::size_t i = 0; i < grid.size(); ++i) {
          const auto s = ResultGrid::score(grid[i], metric, mode, scope);
          EXPECT_TRUE(same_score(s, theirs.at("scores")[i]))
              << name << " " << key << " trial " << grid[i].id << ": dtrain " << text(s) << ", Ray "
              << theirs.at("scores")[i].dump();
          non_finite += s && !std::isfinite(*s);
        }
      }
    }
  }
  // The cases must exercise what they claim to compare.
  EXPECT_GT(non_finite, 50);
  EXPECT_GT(unfiltered_differs, 20);
  for (const char* scope : {"all", "avg", "last-5-avg", "last-10-avg"})
    EXPECT_GT(differs_from_last[scope], 3) << scope;
  std::printf(
      "best_result parity: %zu cases, %d answers (%d errors), %d non-finite scores; choices "
      "other than scope \"last\"'s: all %d, avg %d, last-5-avg %d, last-10-avg %d; %d changed "
      "by filter_nan_and_inf=false; all equal to Ray Tune 2.60.0\n",
      cases.size(), answers, errors, non_finite, differs_from_last["all"], differs_from_last["avg"],
      differs_from_last["last-5-avg"], differs_from_last["last-10-avg"], unfiltered_differs);
}

TEST(TuneBestResult, ABadScopeNamesTheAllowedOnes) {
  std::vector<TrialResult> trials(2);
  trials[0].history = {result(1, {{"m", 1}})};
  trials[1].history = {result(1, {{"m", 2}})};
  const ResultGrid grid(trials, "m", "max", "");
  EXPECT_EQ(grid.best_result("m", "max", "avg").history[0].at("m"), 2);
  try {
    grid.best_result("m", "max", "last-3-avg");
    FAIL() << "no error for scope last-3-avg";
  } catch (const dtrain::UsageError& e) {
    const std::string what = e.what();
    for (const char* s :
         {"\"all\"", "\"last\"", "\"avg\"", "\"last-5-avg\"", "\"last-10-avg\"", "last-3-avg"})
      EXPECT_NE(what.find(s), std::string::npos) << what;
  }
}
