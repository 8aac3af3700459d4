// dtrain::tune's schedulers and variant generation against Ray Tune itself.
//
// Each case is a recorded sequence of results (generated here from a seed: asynchronous
// interleavings of trials reporting noisy learning curves) plus a list of recorded uniform
// draws. The same cases go to tests/tune/ray_scheduler_peer.py, which runs Ray's own
// AsyncHyperBandScheduler / PopulationBasedTraining / FIFOScheduler / generate_variants over
// them (Ray's `random` and numpy draws replaced by the recorded ones, mapped as dtrain maps
// them); both sides drive their scheduler with the same simulated controller (described in
// the peer's docstring). Every decision, status, config and restored checkpoint must agree,
// and both sides must have consumed the same number of draws.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>

#include "dtrain/error.h"
#include "dtrain/tune_schedulers.h"
#include "dtrain/tune_search_space.h"
#include "support/paths.h"

namespace fs = std::filesystem;
using dtrain::tune::Config;
using namespace dtrain::tune;

namespace {

// The simulated controller (Ray's TuneController as the peer fakes it).
class SimContext : public SchedulerContext {
 public:
  std::vector<Trial> trials_store;
  std::map<std::string, Result> last_result;
  std::map<std::string, std::string> restored;

  std::vector<Trial*> trials() override {
    std::vector<Trial*> v;
    for (auto& t : trials_store) v.push_back(&t);
    return v;
  }
  std::string save_checkpoint(Trial& t) override {
    return "ckpt:" + t.id + ":" + last_result[t.id].at("training_iteration").dump();
  }
  void pause_trial(Trial& t) override { t.status = TrialStatus::Paused; }
  void restore_trial(Trial& t, const Config& config, const std::string& checkpoint,
                     const std::string&) override {
    t.config = config;
    restored[t.id] = checkpoint;
  }
};

std::unique_ptr<TrialScheduler> make_scheduler(const Config& c) {
  const Config& o = c.value("options", Config::object());
  const std::string kind = c.at("scheduler");
  if (kind == "asha") {
    AshaOptions a;
    a.time_attr = o.value("time_attr", a.time_attr);
    a.metric = o.value("metric", "");
    a.mode = o.value("mode", "");
    a.max_t = o.value("max_t", a.max_t);
    a.grace_period = o.value("grace_period", a.grace_period);
    a.reduction_factor = o.value("reduction_factor", a.reduction_factor);
    a.brackets = o.value("brackets", a.brackets);
    a.stop_last_trials = o.value("stop_last_trials", a.stop_last_trials);
    return std::make_unique<AshaScheduler>(a);
  }
  if (kind == "pbt") {
    PbtOptions p;
    p.time_attr = o.value("time_attr", p.time_attr);
    p.metric = o.value("metric", "");
    p.mode = o.value("mode", "");
    p.perturbation_interval = o.value("perturbation_interval", p.perturbation_interval);
    p.burn_in_period = o.value("burn_in_period", p.burn_in_period);
    p.hyperparam_mutations = o.at("hyperparam_mutations");
    p.quantile_fraction = o.value("quantile_fraction", p.quantile_fraction);
    p.resample_probability = o.value("resample_probability", p.resample_probability);
    if (o.contains("perturbation_factors")) {
      p.perturbation_factors = o.at("perturbation_factors").get<std::vector<double>>();
    }
    return std::make_unique<PbtScheduler>(p);
  }
  return std::make_unique<FifoScheduler>();
}

Config run_case(const Config& c) {
  auto random = std::make_shared<RecordedRandom>(c.value("draws", std::vector<double>{}));
  if (c.contains("variants")) {
    if (c.value("raises_error", false)) {
      try {
        generate_variants(c.at("variants"), c.at("num_samples").get<int>(), *random);
      } catch (const dtrain::UsageError& e) {
        return Config{{"raised", true}};
      }
      return Config{{"raised", false}};
    }
    auto configs = generate_variants(c.at("variants"), c.at("num_samples").get<int>(), *random);
    return Config{{"configs", configs}, {"draws_used", random->used()}};
  }
  auto sched = make_scheduler(c);
  sched->set_random(random);
  SimContext ctx;
  for (const auto& t : c.at("trials")) {
    Trial trial;
    trial.id = t.at("id");
    trial.config = t.at("config");
    trial.experiment_tag = trial.id;
    ctx.trials_store.push_back(trial);
  }
  for (auto& t : ctx.trials_store) sched->on_trial_add(ctx, t);
  Config events = Config::array();
  for (const auto& ev : c.at("events")) {
    Trial* t = nullptr;
    for (auto& x : ctx.trials_store) {
      if (x.id == ev.at("trial")) t = &x;
    }
    Config rec{{"trial", t->id}};
    if (t->is_finished()) {
      rec["decision"] = "SKIPPED";
      events.push_back(rec);
      continue;
    }
    t->status = TrialStatus::Running;
    if (ev.contains("complete")) {
      ctx.last_result[t->id] = ev.at("complete");
      sched->on_trial_complete(ctx, *t, ev.at("complete"));
      t->status = TrialStatus::Terminated;
      rec["decision"] = "COMPLETE";
    } else {
      const Result& r = ev.at("result");
      ctx.last_result[t->id] = r;
      ctx.restored.erase(t->id);
      Decision d = sched->on_trial_result(ctx, *t, r);
      rec["decision"] = to_string(d);
      if (d == Decision::Stop) {
        t->status = TrialStatus::Terminated;
        sched->on_trial_complete(ctx, *t, r);
      } else if (d == Decision::Pause) {
        t->status = TrialStatus::Paused;
      }
      if (ctx.restored.count(t->id)) rec["restored"] = ctx.restored[t->id];
    }
    rec["status"] = to_string(t->status);
    rec["config"] = t->config;
    rec["tag"] = t->experiment_tag;  // PBT's exploit: "<tag>@perturbed[...]", as Ray's
    events.push_back(rec);
  }
  return Config{{"events", events}, {"draws_used", random->used()}};
}

// Learning curves: trial i has a quality; its metric approaches it with noise. The order
// of reports is a random asynchronous interleaving; some trials start late.
Config make_events(std::mt19937_64& g, int trials, int steps, bool minimize, double time_step,
                   bool with_complete) {
  std::uniform_real_distribution<double> U(0, 1);
  std::vector<double> quality(trials);
  for (auto& q : quality) q = U(g);
  std::vector<int> done(trials, 0);
  Config events = Config::array();
  int left = trials * steps;
  while (left > 0) {
    // Later trials are less likely to go first: some stay PENDING for a while.
    int i = static_cast<int>(std::floor(std::pow(U(g), 0.7) * trials));
    if (i >= trials || done[i] >= steps) continue;
    ++done[i];
    --left;
    const double it = done[i];
    double acc = quality[i] * (1 - std::exp(-it / 3.0)) + 0.05 * U(g);
    acc = std::round(acc * 1e6) / 1e6;
    if (done[i] == 3 && U(g) < 0.2)
      acc = std::round(quality[(i + 1) % trials] * 1e6) / 1e6;  // ties
    Result r{{"training_iteration", done[i]},
             {"time_total_s", std::round(it * time_step * 1e3) / 1e3},
             {minimize ? "loss" : "acc", minimize ? 1 - acc : acc}};
    std::string id = "t";
    id += std::to_string(i);
    Config ev{{"trial", id}};
    if (with_complete && done[i] == steps) {
      ev["complete"] = r;
    } else {
      ev["result"] = r;
    }
    events.push_back(ev);
  }
  return events;
}

Config make_trials(int n, const Config& make_config) {
  Config t = Config::array();
  for (int i = 0; i < n; ++i) {
    Config c = make_config;
    c["seed"] = i;
    std::string id = "t";
    id += std::to_string(i);  // (not "t" + to_string: GCC 12 warns -Wrestrict there, wrongly)
    t.push_back({{"id", id}, {"config", c}});
  }
  return t;
}

std::vector<double> draws(std::mt19937_64& g, int n) {
  std::uniform_real_distribution<double> U(0, 1);
  std::vector<double> d(n);
  for (auto& x : d) x = U(g);
  return d;
}

Config build_cases() {
  Config cases = Config::array();
  std::mt19937_64 g(20261123);
  // ASHA, Ray's defaults but max_t, many rungs, one bracket.
  for (int k = 0; k < 3; ++k) {
    cases.push_back({{"name", "asha_rf3_" + std::to_string(k)},
                     {"scheduler", "asha"},
                     {"options",
                      {{"metric", "acc"},
                       {"mode", "max"},
                       {"max_t", 9},
                       {"grace_period", 1},
                       {"reduction_factor", 3}}},
                     {"trials", make_trials(16, Config::object())},
                     {"events", make_events(g, 16, 10, false, 1.0, true)},
                     {"draws", draws(g, 64)}});
  }
  // ASHA: three brackets (bracket choice from the draws), minimising, rf 2, max_t 16.
  cases.push_back({{"name", "asha_brackets"},
                   {"scheduler", "asha"},
                   {"options",
                    {{"metric", "loss"},
                     {"mode", "min"},
                     {"max_t", 16},
                     {"grace_period", 1},
                     {"reduction_factor", 2},
                     {"brackets", 3}}},
                   {"trials", make_trials(20, Config::object())},
                   {"events", make_events(g, 20, 12, true, 1.0, false)},
                   {"draws", draws(g, 64)}});
  // ASHA on wall-clock-like time, a fractional grace period, stop_last_trials off.
  cases.push_back({{"name", "asha_time_attr"},
                   {"scheduler", "asha"},
                   {"options",
                    {{"metric", "acc"},
                     {"mode", "max"},
                     {"time_attr", "time_total_s"},
                     {"max_t", 20.0},
                     {"grace_period", 2.5},
                     {"reduction_factor", 2.0},
                     {"stop_last_trials", false}}},
                   {"trials", make_trials(12, Config::object())},
                   {"events", make_events(g, 12, 10, false, 1.7, false)},
                   {"draws", draws(g, 64)}});
  // PBT: list, log-uniform, integer and nested mutations; late starters give PAUSE.
  const Config base{{"lr", 0.01}, {"batch_size", 64}, {"layers", 3}, {"opt", {{"momentum", 0.9}}}};
  const Config mutations{{"lr", loguniform(1e-4, 1e-1)},
                         {"batch_size", Config::array({16, 32, 64, 128})},
                         {"layers", randint(1, 6)},
                         {"opt", {{"momentum", uniform(0.5, 0.99)}}}};
  for (int k = 0; k < 3; ++k) {
    cases.push_back({{"name", "pbt_" + std::to_string(k)},
                     {"scheduler", "pbt"},
                     {"options",
                      {{"metric", "acc"},
                       {"mode", "max"},
                       {"time_attr", "training_iteration"},
                       {"perturbation_interval", 2},
                       {"hyperparam_mutations", mutations}}},
                     {"trials", make_trials(8, base)},
                     {"events", make_events(g, 8, 12, false, 1.0, false)},
                     {"draws", draws(g, 4000)}});
  }
  // PBT: wider quantiles, more resampling, a burn-in, minimising on time_total_s, a trial
  // config missing a mutated key (filled from hyperparam_mutations on add).
  Config partial = base;
  partial.erase("layers");
  cases.push_back({{"name", "pbt_quantile_half"},
                   {"scheduler", "pbt"},
                   {"options",
                    {{"metric", "loss"},
                     {"mode", "min"},
                     {"time_attr", "time_total_s"},
                     {"perturbation_interval", 3.0},
                     {"burn_in_period", 4.0},
                     {"quantile_fraction", 0.5},
                     {"resample_probability", 0.5},
                     {"perturbation_factors", {1.5, 0.5}},
                     {"hyperparam_mutations", mutations}}},
                   {"trials", make_trials(6, partial)},
                   {"events", make_events(g, 6, 14, true, 1.3, false)},
                   {"draws", draws(g, 4000)}});
  cases.push_back({{"name", "fifo"},
                   {"scheduler", "fifo"},
                   {"trials", make_trials(4, Config::object())},
                   {"events", make_events(g, 4, 5, false, 1.0, true)}});
  // Variant generation: grids crossed (sorted paths, first fastest) x num_samples, every
  // domain kind, nested parameters, a list holding a domain.
  cases.push_back({{"name", "variants"},
                   {"variants",
                    {{"b", {{"c", grid_search({"x", "y", "z"})}, {"q", quniform(0.1, 1.0, 0.1)}}},
                     {"a", grid_search({1, 2})},
                     {"lr", loguniform(1e-4, 1e-1)},
                     {"n", randint(1, 9)},
                     {"ch", choice({16, "s", true})},
                     {"u", uniform(-1, 1)},
                     {"k", 3}}},
                   {"num_samples", 3},
                   {"draws", draws(g, 200)}});
  // The other domains, drawn from the same recorded draws as Ray draws them.
  cases.push_back({{"name", "variants_more"},
                   {"variants",
                    {{"ql", qloguniform(1e-4, 1e-1, 5e-5)},
                     {"qi", qrandint(0, 10, 5)},
                     {"qi1", qrandint(-3, 4)},
                     {"qin", qrandint(-7, 7, 3)},
                     {"li", lograndint(1, 8)},
                     {"qli", qlograndint(1, 16, 2)},
                     {"qli7", qlograndint(3, 100, 7)},
                     {"n", randn(5, 2)},
                     {"qn", qrandn(0, 1, 0.5)},
                     {"g", grid_search({1, 2})}}},
                   {"num_samples", 8},
                   {"draws", draws(g, 400)}});
  // sample_from (the peer has the same functions by name, in Python): b reads a grid value and
  // a nested one; x reads y, which reads r, drawn after both in the space's order, so x and y
  // wait for later passes (3 in all) while the random draws keep their order; lr_a reads a
  // random value drawn before it. 2 x 2 grid x 2 samples = 8 variants.
  cases.push_back(
      {{"name", "sample_from"},
       {"variants",
        {{"x", sample_from([](const Config& c) { return c.at("y").get<int>() * 2; }, "x_twice_y")},
         {"b", sample_from(
                   [](const Config& c) {
                     return c.at("a").get<int>() * 10 + c.at("n").at("k").get<int>();
                   },
                   "b_from_a_and_n_k")},
         {"y",
          sample_from([](const Config& c) { return c.at("a").get<int>() + c.at("r").get<int>(); },
                      "y_a_plus_r")},
         {"a", grid_search({1, 2})},
         {"n", {{"k", grid_search({3, 4})}}},
         {"r", randint(0, 100)},
         {"lr", loguniform(1e-4, 1e-1)},
         {"lr_a",
          sample_from(
              [](const Config& c) { return c.at("lr").get<double>() / c.at("a").get<int>(); },
              "lr_over_a")}}},
       {"num_samples", 2},
       {"draws", draws(g, 100)}});
  // Zero-argument functions (Ray's tune.sample_from(lambda: ...)): "ticket" counts its calls
  // on each side, so its values show how often and in which order each side calls it among the
  // draws; w reads t, drawn after it, so w waits a pass. 2 grid x 3 samples = 6 variants.
  auto tickets = std::make_shared<int>(0);
  cases.push_back({{"name", "sample_from_no_config"},
                   {"variants",
                    {{"w", sample_from(
                               [](const Config& c) {
                                 return c.at("t").get<int>() * 100 + c.at("r").get<int>();
                               },
                               "w_from_t_and_r")},
                     {"t", sample_from([tickets] { return (*tickets)++; }, "ticket")},
                     {"k", sample_from([] { return 7; }, "seven")},
                     {"r", randint(0, 50)},
                     {"g", grid_search({"x", "y"})},
                     {"u", uniform(0, 1)}}},
                   {"num_samples", 3},
                   {"draws", draws(g, 100)}});
  // A zero-argument function that fails: Ray's "Failed to evaluate expression", at once.
  cases.push_back(
      {{"name", "sample_from_no_config_fails"},
       {"variants",
        {{"f", sample_from([] { return Config("text").get<int>(); }, "no_config_fails")},
         {"r", randint(0, 50)}}},
       {"num_samples", 1},
       {"draws", draws(g, 10)},
       {"raises_error", true}});
  // Two functions that read each other: Ray's RecursiveDependencyError, dtrain's UsageError.
  cases.push_back(
      {{"name", "sample_from_circle"},
       {"variants",
        {{"p", sample_from([](const Config& c) { return c.at("q").get<int>() + 1; }, "p_after_q")},
         {"q",
          sample_from([](const Config& c) { return c.at("p").get<int>() + 1; }, "q_after_p")}}},
       {"num_samples", 1},
       {"raises_error", true}});
  return cases;
}

// Every domain sampled many times with a seed (dtrain's generator), for the peer to set beside
// Ray's own sampling of it (numpy's generator): types, ranges, quantization, the values seen.
const std::vector<std::pair<std::string, Config>>& sampled_domains() {
  static const std::vector<std::pair<std::string, Config>> d{
      {"uniform(-1,1)", uniform(-1, 1)},
      {"loguniform(1e-4,1e-1)", loguniform(1e-4, 1e-1)},
      {"quniform(0,1,0.25)", quniform(0, 1, 0.25)},
      {"qloguniform(1e-4,1e-1,5e-5)", qloguniform(1e-4, 1e-1, 5e-5)},
      {"qloguniform(10,1000,10)", qloguniform(10, 1000, 10)},
      {"randn(0,1)", randn()},
      {"randn(5,2)", randn(5, 2)},
      {"qrandn(0,1,0.5)", qrandn(0, 1, 0.5)},
      {"randint(0,3)", randint(0, 3)},
      {"qrandint(0,10,5)", qrandint(0, 10, 5)},
      {"qrandint(0,10)", qrandint(0, 10)},
      {"qrandint(-7,7,3)", qrandint(-7, 7, 3)},
      {"qrandint(5,5,5)", qrandint(5, 5, 5)},
      {"lograndint(1,8)", lograndint(1, 8)},
      {"lograndint(10,1000)", lograndint(10, 1000)},
      {"qlograndint(1,16,2)", qlograndint(1, 16, 2)},
      {"qlograndint(3,100,7)", qlograndint(3, 100, 7)},
      {"qlograndint(2,9,1)", qlograndint(2, 9, 1)},
  };
  return d;
}

Config sample_case() {
  SeededRandom random(20261129);
  Config items = Config::array();
  for (const auto& [name, domain] : sampled_domains()) {
    Config values = Config::array();
    for (int i = 0; i < 4000; ++i) values.push_back(sample(domain, random));
    items.push_back({{"name", name}, {"domain", domain}, {"values", values}});
  }
  return {{"name", "samples"}, {"seed", 7}, {"samples", items}};
}

// Calls of the domain functions, with whether Ray raises for them (or when it samples them)
// and whether dtrain does (a UsageError when the domain is made). Equal except where dtrain is
// stricter: lograndint(5, 5), whose upper bound is exclusive, Ray samples as 5.
struct DomainCall {
  std::string fn;
  std::vector<double> args;
  bool dtrain_only = false;  // Ray samples it (oddly) without an error; dtrain refuses it
};
const std::vector<DomainCall>& domain_calls() {
  static const std::vector<DomainCall> calls{
      {"quniform", {0.1, 0.9, 0.25}},
      {"quniform", {0, 1, 0.25}},
      {"qloguniform", {0, 1, 0.1}},
      {"qloguniform", {1e-4, 0.1, 3e-5}},
      {"qloguniform", {1e-4, 0.1, 5e-5}},
      {"qloguniform", {0.1, 1, 0}},
      {"randint", {3, 3}},
      {"randint", {0, 3}},
      {"qrandint", {1, 4, 5}},
      {"qrandint", {5, 5, 5}},
      {"qrandint", {3, 3, 1}},
      {"qrandint", {0, 10, 0}},
      {"qrandint", {0, 10, -5}},
      {"qrandint", {-7, 7, 3}},
      {"lograndint", {0, 8}},
      {"lograndint", {2, 8}},
      {"lograndint", {5, 5}, true},
      {"qlograndint", {0, 16, 2}},
      {"qlograndint", {1, 16, 2}},
      {"qlograndint", {3, 5, 7}},
      {"qlograndint", {1, -4, 2}},
      {"randn", {0, 0}},
      {"randn", {0, -1}},
      {"randn", {3, 2}},
      {"qrandn", {0, 0, 0.5}},
      {"qrandn", {0, 1, 0.5}},
      {"qrandn", {0, 1, -0.5}},
  };
  return calls;
}

bool dtrain_raises(const DomainCall& c) {
  const auto& a = c.args;
  const auto i = [&](std::size_t k) { return static_cast<std::int64_t>(a[k]); };
  try {
    if (c.fn == "quniform") quniform(a[0], a[1], a[2]);
    if (c.fn == "qloguniform") qloguniform(a[0], a[1], a[2]);
    if (c.fn == "randint") randint(i(0), i(1));
    if (c.fn == "qrandint") qrandint(i(0), i(1), i(2));
    if (c.fn == "lograndint") lograndint(i(0), i(1));
    if (c.fn == "qlograndint") qlograndint(i(0), i(1), i(2));
    if (c.fn == "randn") randn(a[0], a[1]);
    if (c.fn == "qrandn") qrandn(a[0], a[1], a[2]);
  } catch (const dtrain::UsageError&) {
    return true;
  }
  return false;
}

Config raises_case() {
  Config calls = Config::array();
  for (const auto& c : domain_calls()) {
    Config args = Config::array();
    for (std::size_t k = 0; k < c.args.size(); ++k) {
      // Integers as ints: Ray's integer domains take Python ints.
      const bool integral = c.fn.find("int") != std::string::npos;
      args.push_back(integral ? Config(static_cast<std::int64_t>(c.args[k])) : Config(c.args[k]));
    }
    calls.push_back({{"fn", c.fn}, {"args", args}});
  }
  return {{"name", "raises"}, {"raises", calls}};
}

void expect_raises_match(const Config& ray) {
  ASSERT_EQ(ray.at("raises").size(), domain_calls().size());
  int raised = 0;
  for (std::size_t i = 0; i < domain_calls().size(); ++i) {
    const DomainCall& c = domain_calls()[i];
    const Config& r = ray.at("raises").at(i);
    const bool ray_raises = r.at("raises").get<bool>();
    raised += ray_raises;
    EXPECT_EQ(dtrain_raises(c), ray_raises || c.dtrain_only)
        << r.at("call").dump() << " Ray: " << r.value("error", "no error");
    if (c.dtrain_only) {
      EXPECT_FALSE(ray_raises) << r.at("call").dump();
    }
  }
  EXPECT_GT(raised, 10);
}

// Ray's sampling beside dtrain's (the peer's summaries of both): the same types, every value on
// the grid of q, the same set of values where there are few, and ranges and moments that agree.
void expect_samples_match(const Config& ray) {
  ASSERT_EQ(ray.at("samples").size(), sampled_domains().size());
  for (std::size_t i = 0; i < sampled_domains().size(); ++i) {
    const Config& s = ray.at("samples").at(i);
    SCOPED_TRACE(s.at("name").get<std::string>());
    const Config& theirs = s.at("ray");
    const Config& ours = s.at("dtrain");
    EXPECT_EQ(ours.at("types"), theirs.at("types"));
    if (theirs.contains("on_grid")) {
      EXPECT_EQ(theirs.at("on_grid"), true);
      EXPECT_EQ(ours.at("on_grid"), true);
    }
    const bool unbounded = sampled_domains()[i].second.contains("sd");  // randn, qrandn
    if (theirs.at("distinct").is_array() && !unbounded) {
      EXPECT_EQ(ours.at("distinct"), theirs.at("distinct"));  // every value, and only those
    } else if (!unbounded) {
      const double range = theirs.at("max").get<double>() - theirs.at("min").get<double>();
      EXPECT_NEAR(ours.at("min").get<double>(), theirs.at("min").get<double>(), 0.03 * range);
      EXPECT_NEAR(ours.at("max").get<double>(), theirs.at("max").get<double>(), 0.03 * range);
    }
    const double sd = theirs.at("sd").get<double>();
    EXPECT_NEAR(ours.at("mean").get<double>(), theirs.at("mean").get<double>(), 0.1 * sd + 1e-12);
    EXPECT_NEAR(ours.at("sd").get<double>(), sd, 0.1 * sd + 1e-12);
  }
}

// Appends "a vs b" (built with +=: `" " + a.dump()` makes GCC 12 warn -Wrestrict, wrongly).
void note(std::string& where, const Config& a, const Config& b) {
  where += ' ';
  where += a.dump();
  where += " vs ";
  where += b.dump();
}

bool same(const Config& a, const Config& b, std::string& where) {
  if (a.is_number() && b.is_number()) {
    const double x = a.get<double>(), y = b.get<double>();
    // numpy's exp/log may differ from glibc's in the last bit.
    if (std::fabs(x - y) <= 1e-12 * std::max(1.0, std::fabs(x))) return true;
    note(where, a, b);
    return false;
  }
  if (a.type() != b.type()) {
    note(where, a, b);
    return false;
  }
  if (a.is_object()) {
    if (a.size() != b.size()) {
      note(where, a, b);
      return false;
    }
    for (auto it = a.begin(); it != a.end(); ++it) {
      if (!b.contains(it.key())) {
        where += " missing " + it.key();
        return false;
      }
      std::string w = where + "." + it.key();
      if (!same(it.value(), b.at(it.key()), w)) {
        where = w;
        return false;
      }
    }
    return true;
  }
  if (a.is_array()) {
    if (a.size() != b.size()) {
      where += " sizes " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
      return false;
    }
    for (std::size_t i = 0; i < a.size(); ++i) {
      std::string w = where + "[" + std::to_string(i) + "]";
      if (!same(a[i], b[i], w)) {
        where = w;
        return false;
      }
    }
    return true;
  }
  if (a != b) {
    note(where, a, b);
    return false;
  }
  return true;
}

}  // namespace

TEST(TuneParity, SchedulersAndVariantsMatchRayTune) {
  Config cases = build_cases();
  cases.push_back(sample_case());
  cases.push_back(raises_case());
  const fs::path dir =
      fs::temp_directory_path() / ("dtrain-tune-parity-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  { std::ofstream(dir / "cases.json") << cases.dump(); }
  const std::string cmd = std::string(DTRAIN_VENV_PYTHON) + " " + DTRAIN_SOURCE_DIR +
                          "/tests/tune/ray_scheduler_peer.py " + (dir / "cases.json").string() +
                          " " + (dir / "ray.json").string();
  ASSERT_EQ(std::system(cmd.c_str()), 0)
      << "Ray Tune peer failed: " << cmd
      << " (is ray[tune] installed in the venv? scripts/requirements.txt)";
  std::ifstream in(dir / "ray.json");
  const Config ray = Config::parse(in);
  ASSERT_EQ(ray.size(), cases.size());
  int stops = 0, exploits = 0, pauses = 0, perturbed_tags = 0;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].at("name").get<std::string>());
    if (cases[i].contains("samples")) {
      expect_samples_match(ray[i]);
      continue;
    }
    if (cases[i].contains("raises")) {
      expect_raises_match(ray[i]);
      continue;
    }
    const Config ours = run_case(cases[i]);
    if (cases[i].at("name") == "sample_from") {
      EXPECT_EQ(ours.at("configs").size(), 8u);
    }
    if (cases[i].at("name") == "sample_from_no_config") {
      ASSERT_EQ(ours.at("configs").size(), 6u);
      for (int v = 0; v < 6; ++v) EXPECT_EQ(ours.at("configs")[v].at("t"), v);  // once each
    }
    if (cases[i].value("raises_error", false)) {
      EXPECT_EQ(ours.at("raised"), true);
      EXPECT_EQ(ray[i].at("raised"), true) << ray[i].dump();
      continue;
    }
    std::string where = cases[i].at("name").get<std::string>();
    EXPECT_TRUE(same(ours, ray[i], where)) << "first difference at " << where;
    if (ours.contains("events")) {
      for (const auto& e : ours.at("events")) {
        stops += e.at("decision") == "STOP";
        pauses += e.at("decision") == "PAUSE";
        exploits += e.contains("restored");
        perturbed_tags += e.contains("tag") &&
                          e.at("tag").get<std::string>().find("@perturbed[") != std::string::npos;
      }
    }
  }
  // The cases must exercise what they claim to compare.
  EXPECT_GT(stops, 10);
  EXPECT_GT(exploits, 5);
  EXPECT_GT(perturbed_tags, 5);
  EXPECT_GT(pauses, 0);
  std::printf("parity: %zu cases, %d STOP, %d PAUSE, %d exploits, all equal to Ray Tune %s\n",
              cases.size(), stops, pauses, exploits, "2.60.0");
  fs::remove_all(dir);
}

TEST(TuneSearchSpace, SeededSearchIsReproducibleAndInBounds) {
  const Config space{{"lr", loguniform(1e-4, 1e-1)},
                     {"bs", choice({32, 64})},
                     {"w", randint(8, 12)},
                     {"q", quniform(0.0, 1.0, 0.25)},
                     {"g", grid_search({1, 2, 3})}};
  auto a = generate_variants(space, 5, std::uint64_t{42});
  auto b = generate_variants(space, 5, std::uint64_t{42});
  auto c = generate_variants(space, 5, std::uint64_t{43});
  ASSERT_EQ(a.size(), 15u);
  EXPECT_EQ(count_variants(space, 5), 15u);
  EXPECT_EQ(Config(a), Config(b));
  EXPECT_NE(Config(a), Config(c));
  for (const auto& x : a) {
    EXPECT_GE(x["lr"].get<double>(), 1e-4);
    EXPECT_LT(x["lr"].get<double>(), 1e-1);
    EXPECT_TRUE(x["w"].is_number_integer());
    EXPECT_GE(x["w"].get<int>(), 8);
    EXPECT_LT(x["w"].get<int>(), 12);
    const double q = x["q"].get<double>();
    EXPECT_DOUBLE_EQ(q, std::round(q * 4) / 4);
  }
}

// sample_from on dtrain's side alone: its value from the resolved config, across passes, and
// each way it can go wrong named in the error.
TEST(TuneSearchSpace, SampleFromReadsResolvedValuesAndErrorsAreClear) {
  const Config space = {
      {"double_w", sample_from([](const Config& c) { return c.at("w").get<double>() * 2; })},
      {"g", grid_search({"a", "b", "c"})},
      {"w", uniform(0, 1)},
      {"tag", sample_from([](const Config& c) { return c.at("g").get<std::string>() + "!"; })}};
  const auto configs = generate_variants(space, 2, std::uint64_t{5});
  ASSERT_EQ(configs.size(), 6u);
  EXPECT_EQ(count_variants(space, 2), 6u);
  for (const auto& c : configs) {
    EXPECT_EQ(c.at("double_w").get<double>(), 2 * c.at("w").get<double>()) << c.dump();
    EXPECT_EQ(c.at("tag"), c.at("g").get<std::string>() + "!") << c.dump();
  }
  auto error_of = [](const Config& s) {
    try {
      generate_variants(s, 1, std::uint64_t{1});
    } catch (const dtrain::UsageError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto has = [](const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
  };
  const std::string circle =
      error_of({{"p", sample_from([](const Config& c) { return c.at("q").get<int>(); }, "p_fn")},
                {"q", sample_from([](const Config& c) { return c.at("p").get<int>(); }, "q_fn")}});
  EXPECT_TRUE(has(circle, "depend on values never resolved") && has(circle, "'q_fn' at '/q'"))
      << circle;
  const std::string missing =
      error_of({{"m", sample_from([](const Config& c) { return c.at("nope"); }, "reads_nope")}});
  EXPECT_TRUE(has(missing, "failed to evaluate sample_from 'reads_nope' at '/m'")) << missing;
  const std::string nested =
      error_of({{"d", sample_from([](const Config&) { return uniform(0, 1); }, "returns_domain")}});
  EXPECT_TRUE(has(nested, "returned") && has(nested, "plain value")) << nested;
  const std::string wrong_type = error_of(
      {{"s", "text"},
       {"t", sample_from([](const Config& c) { return c.at("s").get<int>(); }, "int_of_text")}});
  EXPECT_TRUE(has(wrong_type, "'int_of_text' at '/t' failed with every other value resolved"))
      << wrong_type;
  EXPECT_THROW(sample_from(nullptr), dtrain::UsageError);
  EXPECT_THROW(sample_from(SampleFunctionNoConfig{}), dtrain::UsageError);
  // A zero-argument function reads no config, so its type_error is no reason to wait.
  const std::string no_config =
      error_of({{"z", sample_from([] { return Config("s").get<int>(); }, "zero_arg_type_error")},
                {"later", uniform(0, 1)}});
  EXPECT_TRUE(has(no_config, "failed to evaluate sample_from 'zero_arg_type_error' at '/z'"))
      << no_config;
  RecordedRandom r({0.5});
  EXPECT_THROW(sample(sample_from([](const Config&) { return 1; }), r), dtrain::UsageError);
  // A space read back from elsewhere (a saved search) names no function of this process.
  const std::string foreign =
      error_of({{"f", {{"__domain__", "sample_from"}, {"function", "f"}, {"id", 1u << 30}}}});
  EXPECT_TRUE(has(foreign, "names no function of this process")) << foreign;
  // PBT resamples its mutations without a config: a sample_from there is refused up front.
  PbtOptions pbt;
  pbt.hyperparam_mutations = {{"lr", sample_from([](const Config&) { return 0.1; }, "lr_fn")}};
  try {
    PbtScheduler scheduler(pbt);
    ADD_FAILURE() << "PBT took a sample_from mutation";
  } catch (const dtrain::UsageError& e) {
    EXPECT_TRUE(has(e.what(), "hyperparam_mutations[\"lr\"] is a sample_from")) << e.what();
  }
}

TEST(TuneSearchSpace, BadInputIsAClearError) {
  EXPECT_THROW(uniform(1, 1), dtrain::UsageError);
  EXPECT_THROW(loguniform(0, 1), dtrain::UsageError);
  EXPECT_THROW(randint(3, 3), dtrain::UsageError);
  EXPECT_THROW(quniform(0.05, 1, 0.1), dtrain::UsageError);
  EXPECT_THROW(choice({}), dtrain::UsageError);
  EXPECT_THROW(generate_variants(Config{{"a", 1}}, 0, std::uint64_t{1}), dtrain::UsageError);
  EXPECT_THROW(generate_variants(Config{{"a", {{"__domain__", "gauss"}}}}, 1, std::uint64_t{1}),
               dtrain::UsageError);
  EXPECT_THROW(AshaScheduler(AshaOptions{.max_t = 1, .grace_period = 2}), dtrain::UsageError);
  EXPECT_THROW(PbtScheduler(PbtOptions{}), dtrain::UsageError);
}

TEST(TuneAsha, RungsAsRayComputesThem) {
  AshaScheduler s({.max_t = 100, .grace_period = 1, .reduction_factor = 4, .brackets = 3});
  EXPECT_EQ(s.milestones(0), (std::vector<double>{64, 16, 4, 1}));
  EXPECT_EQ(s.milestones(1), (std::vector<double>{64, 16, 4}));
  EXPECT_EQ(s.milestones(2), (std::vector<double>{64, 16}));
}
