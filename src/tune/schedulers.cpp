// FIFO, ASHA and PBT: Ray Tune's decision rules (Ray 2.60), one for one. Where a line
// mirrors a non-obvious detail of Ray's code, the comment says which.
#include "dtrain/tune_schedulers.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "dtrain/error.h"
#include "tune/trial_names.h"

namespace dtrain::tune {

const char* to_string(TrialStatus s) {
  switch (s) {
    case TrialStatus::Pending:
      return "PENDING";
    case TrialStatus::Running:
      return "RUNNING";
    case TrialStatus::Paused:
      return "PAUSED";
    case TrialStatus::Terminated:
      return "TERMINATED";
    case TrialStatus::Error:
      return "ERROR";
  }
  return "?";
}

const char* to_string(Decision d) {
  switch (d) {
    case Decision::Continue:
      return "CONTINUE";
    case Decision::Pause:
      return "PAUSE";
    case Decision::Stop:
      return "STOP";
    case Decision::Noop:
      return "NOOP";
  }
  return "?";
}

// ---- TrialScheduler ---------------------------------------------------------------------

void TrialScheduler::set_metric_mode(const std::string& metric, const std::string& mode,
                                     const char* who) {
  // Ray's set_search_properties: the scheduler's own metric/mode win over the Tuner's.
  if (metric_.empty()) metric_ = metric;
  if (mode_.empty()) mode_ = mode;
  if (!mode_.empty() && mode_ != "min" && mode_ != "max") {
    throw UsageError(std::string("tune::") + who + ": mode must be \"min\" or \"max\", got \"" +
                     mode_ + "\"");
  }
  metric_op_ = mode_ == "max" ? 1.0 : mode_ == "min" ? -1.0 : 0.0;
}

void TrialScheduler::set_search_properties(const std::string& metric, const std::string& mode) {
  set_metric_mode(metric, mode, "TrialScheduler");
}

void TrialScheduler::on_trial_add(SchedulerContext&, Trial&) {}
void TrialScheduler::on_trial_complete(SchedulerContext&, Trial&, const Result&) {}
void TrialScheduler::on_trial_error(SchedulerContext&, Trial&) {}

Trial* TrialScheduler::choose_trial_to_run(SchedulerContext& ctx) {
  auto trials = ctx.trials();
  for (Trial* t : trials) {
    if (t->status == TrialStatus::Pending) return t;
  }
  for (Trial* t : trials) {
    if (t->status == TrialStatus::Paused) return t;
  }
  return nullptr;
}

// ---- ASHA -------------------------------------------------------------------------------

namespace {

std::string fmt(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

bool has_number(const Result& r, const std::string& key) {
  return r.is_object() && r.contains(key) && r.at(key).is_number();
}

// numpy.nanpercentile(values, p), method "linear", bit for bit: q = p / 100, virtual index
// (n - 1) * q, and numpy's _lerp (which interpolates from the upper neighbour when the
// weight is >= 0.5). NaNs are dropped; all NaN gives NaN.
double nanpercentile(std::vector<double> v, double p) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return std::isnan(x); }), v.end());
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  const double q = p / 100.0;
  const double n = static_cast<double>(v.size());
  const double vi = (n - 1) * q;
  if (vi >= n - 1) return v.back();
  if (vi < 0) return v.front();
  const double prev = std::floor(vi);
  const double a = v[static_cast<std::size_t>(prev)];
  const double b = v[static_cast<std::size_t>(prev) + 1];
  const double t = vi - prev;
  const double diff = b - a;
  return t >= 0.5 ? b - diff * (1 - t) : a + diff * t;
}

}  // namespace

AshaScheduler::AshaScheduler(AshaOptions o) : o_(std::move(o)) {
  if (!(o_.max_t > 0))
    throw UsageError("tune::AshaScheduler: max_t must be > 0, got " + fmt(o_.max_t));
  if (!(o_.grace_period > 0)) {
    throw UsageError("tune::AshaScheduler: grace_period must be > 0, got " + fmt(o_.grace_period));
  }
  if (!(o_.max_t >= o_.grace_period)) {
    throw UsageError("tune::AshaScheduler: grace_period (" + fmt(o_.grace_period) +
                     ") must be <= max_t (" + fmt(o_.max_t) + ")");
  }
  if (!(o_.reduction_factor > 1)) {
    throw UsageError("tune::AshaScheduler: reduction_factor must be > 1, got " +
                     fmt(o_.reduction_factor));
  }
  if (o_.brackets < 1) {
    throw UsageError("tune::AshaScheduler: brackets must be >= 1, got " +
                     std::to_string(o_.brackets));
  }
  metric_ = o_.metric;
  mode_ = o_.mode;
  set_metric_mode("", "", "AshaScheduler");
  for (int s = 0; s < o_.brackets; ++s) {
    // Ray: MAX_RUNGS = int(log(max_t / min_t) / log(rf) - s + 1), truncated toward zero;
    // milestones min_t * rf ** (k + s), highest first.
    const double x = std::log(o_.max_t / o_.grace_period) / std::log(o_.reduction_factor) - s + 1;
    const long max_rungs = static_cast<long>(std::trunc(x));
    Bracket b;
    for (long k = max_rungs - 1; k >= 0; --k) {
      b.rungs.push_back(
          {o_.grace_period * std::pow(o_.reduction_factor, static_cast<double>(k + s)), {}});
    }
    brackets_.push_back(std::move(b));
  }
}

void AshaScheduler::set_search_properties(const std::string& metric, const std::string& mode) {
  set_metric_mode(metric, mode, "AshaScheduler");
}

std::vector<double> AshaScheduler::milestones(int bracket) const {
  std::vector<double> m;
  for (const auto& r : brackets_.at(static_cast<std::size_t>(bracket)).rungs)
    m.push_back(r.milestone);
  return m;
}

void AshaScheduler::on_trial_add(SchedulerContext&, Trial& trial) {
  if (metric_.empty() || metric_op_ == 0) {
    throw UsageError("tune::AshaScheduler: no metric or mode (metric=\"" + metric_ + "\", mode=\"" +
                     mode_ + "\"); set them in AshaOptions or in the Tuner's options");
  }
  // Ray: softmax over the brackets' rung counts, then np.random.choice(p=...): one draw
  // even with a single bracket, mapped as numpy does (searchsorted(cdf, u, 'right')).
  int max_size = 0;
  for (const auto& b : brackets_) max_size = std::max(max_size, static_cast<int>(b.rungs.size()));
  std::vector<double> cdf;
  double sum = 0;
  for (const auto& b : brackets_) {
    sum += std::pow(M_E, static_cast<double>(static_cast<int>(b.rungs.size()) - max_size));
    cdf.push_back(sum);
  }
  const double u = random().uniform01();
  std::size_t idx = 0;
  while (idx + 1 < cdf.size() && !(cdf[idx] / sum > u)) ++idx;
  trial_bracket_.emplace_back(trial.id, static_cast<int>(idx));
}

bool AshaScheduler::cutoff(const Rung& rung, double* out) const {
  if (rung.recorded.empty()) return false;
  std::vector<double> v;
  for (const auto& [id, score] : rung.recorded) v.push_back(score);
  *out = nanpercentile(std::move(v), (1 - 1 / o_.reduction_factor) * 100);
  return true;
}

Decision AshaScheduler::bracket_on_result(Bracket& b, const std::string& trial_id, double cur_iter,
                                          double cur_rew) {
  Decision action = Decision::Continue;
  for (auto& rung : b.rungs) {
    const bool recorded = std::any_of(rung.recorded.begin(), rung.recorded.end(),
                                      [&](const auto& e) { return e.first == trial_id; });
    if (cur_iter >= rung.milestone && recorded && !o_.stop_last_trials) break;
    if (cur_iter < rung.milestone || recorded) continue;
    double c;
    if (cutoff(rung, &c) && cur_rew < c) action = Decision::Stop;
    rung.recorded.emplace_back(trial_id, cur_rew);
    break;
  }
  return action;
}

Decision AshaScheduler::on_trial_result(SchedulerContext&, Trial& trial, const Result& result) {
  if (!has_number(result, o_.time_attr) || !has_number(result, metric_)) return Decision::Continue;
  const double t = result.at(o_.time_attr).get<double>();
  Decision action;
  if (t >= o_.max_t && o_.stop_last_trials) {
    action = Decision::Stop;
  } else {
    auto it = std::find_if(trial_bracket_.begin(), trial_bracket_.end(),
                           [&](const auto& e) { return e.first == trial.id; });
    if (it == trial_bracket_.end()) {
      throw InternalError("tune::AshaScheduler: a result for trial " + trial.id +
                          " that was never added");
    }
    action = bracket_on_result(brackets_[static_cast<std::size_t>(it->second)], trial.id, t,
                               metric_op_ * result.at(metric_).get<double>());
  }
  if (action == Decision::Stop) ++num_stopped_;
  return action;
}

void AshaScheduler::on_trial_complete(SchedulerContext&, Trial& trial, const Result& result) {
  if (!has_number(result, o_.time_attr) || !has_number(result, metric_)) return;
  auto it = std::find_if(trial_bracket_.begin(), trial_bracket_.end(),
                         [&](const auto& e) { return e.first == trial.id; });
  if (it == trial_bracket_.end()) return;
  bracket_on_result(brackets_[static_cast<std::size_t>(it->second)], trial.id,
                    result.at(o_.time_attr).get<double>(),
                    metric_op_ * result.at(metric_).get<double>());
  trial_bracket_.erase(it);
}

// ---- PBT --------------------------------------------------------------------------------

namespace {

void check_mutations(const Config& m, const std::string& where) {
  for (auto it = m.begin(); it != m.end(); ++it) {
    const Config& v = it.value();
    if (is_domain(v) && v.at("__domain__") == "sample_from") {
      throw UsageError("tune::PbtScheduler: hyperparam_mutations[\"" + where + it.key() +
                       "\"] is a sample_from, which PBT cannot resample (it needs a config); "
                       "give a list of values or a random domain");
    }
    if (is_domain(v) || v.is_array()) continue;
    if (v.is_object()) {
      check_mutations(v, where + it.key() + ".");
      continue;
    }
    throw UsageError("tune::PbtScheduler: hyperparam_mutations[\"" + where + it.key() +
                     "\"] must be a list of values, a domain (uniform, ...) or an object of "
                     "those; got " +
                     v.dump());
  }
}

}  // namespace

PbtScheduler::PbtScheduler(PbtOptions o) : o_(std::move(o)) {
  if (!o_.hyperparam_mutations.is_object() || o_.hyperparam_mutations.empty()) {
    throw UsageError(
        "tune::PbtScheduler: give hyperparam_mutations (which parameters PBT may "
        "change, and how)");
  }
  check_mutations(o_.hyperparam_mutations, "");
  if (o_.quantile_fraction > 0.5 || o_.quantile_fraction < 0) {
    throw UsageError("tune::PbtScheduler: quantile_fraction must be in [0, 0.5], got " +
                     fmt(o_.quantile_fraction));
  }
  if (!(o_.perturbation_interval > 0)) {
    throw UsageError("tune::PbtScheduler: perturbation_interval must be > 0, got " +
                     fmt(o_.perturbation_interval));
  }
  if (o_.perturbation_factors.empty()) {
    throw UsageError("tune::PbtScheduler: perturbation_factors must not be empty");
  }
  metric_ = o_.metric;
  mode_ = o_.mode;
  set_metric_mode("", "", "PbtScheduler");
}

void PbtScheduler::set_search_properties(const std::string& metric, const std::string& mode) {
  set_metric_mode(metric, mode, "PbtScheduler");
}

PbtScheduler::State& PbtScheduler::state(const Trial& trial) {
  for (auto& [id, s] : states_) {
    if (id == trial.id) return s;
  }
  throw InternalError("tune::PbtScheduler: trial " + trial.id + " was never added");
}

void PbtScheduler::fill_config(Config& config, const std::string& key, const Config& space) {
  if (is_domain(space)) {
    config[key] = sample(space, random());
  } else if (space.is_array()) {
    config[key] = space.at(random().index(space.size()));
  } else if (space.is_object()) {
    config[key] = Config::object();
    for (auto it = space.begin(); it != space.end(); ++it)
      fill_config(config[key], it.key(), it.value());
  }
}

void PbtScheduler::on_trial_add(SchedulerContext&, Trial& trial) {
  if (metric_.empty() || metric_op_ == 0) {
    throw UsageError("tune::PbtScheduler: no metric or mode (metric=\"" + metric_ + "\", mode=\"" +
                     mode_ + "\"); set them in PbtOptions or in the Tuner's options");
  }
  State s;
  s.orig_tag = trial.experiment_tag;
  states_.emplace_back(trial.id, std::move(s));
  for (auto it = o_.hyperparam_mutations.begin(); it != o_.hyperparam_mutations.end(); ++it) {
    if (!trial.config.contains(it.key())) fill_config(trial.config, it.key(), it.value());
  }
}

Config PbtScheduler::explore(const Config& config, const Config& mutations) {
  Config out = config;
  for (auto it = mutations.begin(); it != mutations.end(); ++it) {
    const std::string& key = it.key();
    const Config& dist = it.value();
    if (!config.contains(key)) {
      throw UsageError("tune::PbtScheduler: hyperparam_mutations names \"" + key +
                       "\", which the trial's config does not have: " + config.dump());
    }
    const Config& old = config.at(key);
    if (dist.is_object() && !is_domain(dist)) {
      out[key] = explore(old, dist);
    } else if (dist.is_array()) {
      // Ray draws random() first, then tests membership (Python's `or`).
      const bool resample = random().uniform01() < o_.resample_probability;
      auto pos = std::find(dist.begin(), dist.end(), old);
      if (resample || pos == dist.end()) {
        out[key] = dist.at(random().index(dist.size()));
      } else {
        const int shift = random().index(2) == 0 ? -1 : 1;  // random.choice([-1, 1])
        const long old_idx = static_cast<long>(pos - dist.begin());
        const long new_idx = std::clamp(old_idx + shift, 0L, static_cast<long>(dist.size()) - 1);
        out[key] = dist.at(static_cast<std::size_t>(new_idx));
      }
    } else {  // a domain
      double value;
      if (random().uniform01() < o_.resample_probability) {
        const Config s = sample(dist, random());
        value = s.is_boolean() ? (s.get<bool>() ? 1.0 : 0.0) : s.get<double>();
      } else {
        const double factor =
            o_.perturbation_factors.at(random().index(o_.perturbation_factors.size()));
        if (!old.is_number() && !old.is_boolean()) {
          throw UsageError("tune::PbtScheduler: cannot perturb \"" + key + "\" = " + old.dump() +
                           " by a factor; use a list of values for non-numeric parameters");
        }
        const double x = old.is_boolean() ? (old.get<bool>() ? 1.0 : 0.0) : old.get<double>();
        value = x * factor;
      }
      if (old.is_boolean()) {
        out[key] = value != 0.0;
      } else if (old.is_number_integer()) {
        out[key] = static_cast<std::int64_t>(std::nearbyint(value));  // Python round(): half even
      } else {
        out[key] = value;
      }
    }
  }
  return out;
}

void PbtScheduler::quantiles(SchedulerContext& ctx, std::vector<Trial*>& lower,
                             std::vector<Trial*>& upper) {
  lower.clear();
  upper.clear();
  auto all = ctx.trials();
  std::vector<std::pair<Trial*, double>> scored;
  for (auto& [id, s] : states_) {  // insertion order, as Ray's dict
    Trial* t = nullptr;
    for (Trial* x : all) {
      if (x->id == id) t = x;
    }
    if (t == nullptr) continue;
    if (s.has_score && !std::isnan(s.last_score) && !t->is_finished())
      scored.emplace_back(t, s.last_score);
  }
  std::stable_sort(scored.begin(), scored.end(),
                   [](const auto& a, const auto& b) { return a.second < b.second; });
  if (scored.size() <= 1) return;
  const double n = static_cast<double>(scored.size());
  auto k = static_cast<std::size_t>(std::ceil(n * o_.quantile_fraction));
  if (static_cast<double>(k) > n / 2) k = static_cast<std::size_t>(std::floor(n / 2));
  for (std::size_t i = 0; i < k; ++i) lower.push_back(scored[i].first);
  for (std::size_t i = scored.size() - k; i < scored.size(); ++i) upper.push_back(scored[i].first);
}

void PbtScheduler::checkpoint_or_exploit(SchedulerContext& ctx, Trial& trial,
                                         const std::vector<Trial*>& upper,
                                         const std::vector<Trial*>& lower) {
  State& s = state(trial);
  if (std::find(upper.begin(), upper.end(), &trial) != upper.end()) {
    s.last_checkpoint = ctx.save_checkpoint(trial);
    ++num_checkpoints_;
  } else {
    s.last_checkpoint.clear();
  }
  if (std::find(lower.begin(), lower.end(), &trial) != lower.end()) {
    Trial* clone = upper.at(random().index(upper.size()));
    if (clone == &trial) throw InternalError("tune::PbtScheduler: a trial in both quantiles");
    if (state(*clone).last_checkpoint.empty()) return;  // Ray: no checkpoint, skip exploit
    exploit(ctx, trial, *clone);
  }
}

void PbtScheduler::exploit(SchedulerContext& ctx, Trial& trial, Trial& clone) {
  State& ts = state(trial);
  State& cs = state(clone);
  Config new_config = explore(clone.config, o_.hyperparam_mutations);
  // Ray's _make_experiment_tag: the mutated keys' new values as format_vars writes them.
  std::string tag = detail::perturbed_tag(ts.orig_tag, new_config, o_.hyperparam_mutations);
  if (trial.status != TrialStatus::Paused) ctx.pause_trial(trial);
  trial.experiment_tag = tag;
  ctx.restore_trial(trial, new_config, cs.last_checkpoint, clone.id);
  ++num_perturbations_;
  ts.last_perturbation_time = cs.last_perturbation_time;
  ts.last_train_time = cs.last_train_time;
}

Trial* PbtScheduler::choose_trial_to_run(SchedulerContext& ctx) {
  Trial* best = nullptr;
  double best_time = 0;
  for (Trial* t : ctx.trials()) {
    if (t->status != TrialStatus::Pending && t->status != TrialStatus::Paused) continue;
    const double time = state(*t).last_train_time;
    if (best == nullptr || time < best_time) {  // strict: a stable sort keeps the first
      best = t;
      best_time = time;
    }
  }
  return best;
}

Decision PbtScheduler::on_trial_result(SchedulerContext& ctx, Trial& trial, const Result& result) {
  const bool has_time = has_number(result, o_.time_attr);
  const bool has_metric = has_number(result, metric_);
  if (o_.require_attrs && !has_time) {
    throw UsageError("tune::PbtScheduler: time_attr \"" + o_.time_attr + "\" is not in trial " +
                     trial.id + "'s result " + result.dump() +
                     "; report it, or set PbtOptions::require_attrs = false");
  }
  if (o_.require_attrs && !has_metric) {
    throw UsageError("tune::PbtScheduler: metric \"" + metric_ + "\" is not in trial " + trial.id +
                     "'s result " + result.dump() +
                     "; report it, or set PbtOptions::require_attrs = false");
  }
  if (!has_time || !has_metric) return Decision::Continue;
  const double time = result.at(o_.time_attr).get<double>();
  State& s = state(trial);
  if (time < o_.burn_in_period) return Decision::Continue;
  if (time - s.last_perturbation_time < o_.perturbation_interval) return Decision::Continue;
  s.has_score = true;
  s.last_score = metric_op_ * result.at(metric_).get<double>();
  s.last_train_time = time;
  s.last_result = result;
  s.last_perturbation_time = time;
  std::vector<Trial*> lower, upper;
  quantiles(ctx, lower, upper);
  Decision decision = Decision::Continue;
  for (Trial* other : ctx.trials()) {
    if (other->status == TrialStatus::Pending || other->status == TrialStatus::Paused) {
      decision = Decision::Pause;
      break;
    }
  }
  checkpoint_or_exploit(ctx, trial, upper, lower);
  return trial.status == TrialStatus::Paused ? Decision::Noop : decision;
}

}  // namespace dtrain::tune
