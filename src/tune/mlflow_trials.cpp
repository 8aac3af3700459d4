#include "tune/mlflow_trials.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <regex>

#include "core/params.h"

namespace dtrain::tune::detail {

namespace {

void flatten_into(const Config& c, const std::string& prefix,
                  std::map<std::string, std::string>& out) {
  if (c.is_object() && !c.empty()) {
    for (auto it = c.begin(); it != c.end(); ++it) {
      flatten_into(it.value(), prefix.empty() ? it.key() : prefix + "/" + it.key(), out);
    }
    return;
  }
  out[prefix] = c.is_string() ? c.get<std::string>() : c.dump();
}

}  // namespace

std::optional<double> python_float(const Config& v) {
  if (v.is_boolean()) return v.get<bool>() ? 1.0 : 0.0;
  if (v.is_number()) return v.get<double>();
  if (!v.is_string()) return std::nullopt;  // None, lists: float() raises TypeError
  // float(str): surrounding whitespace, a sign, digits with single underscores between them,
  // a fraction, an exponent; or nan / inf / infinity in any case. Anything else: ValueError.
  static const std::regex kNumber(
      R"(\s*([+-]?)(?:(\d(?:_?\d)*)?(\.(?:\d(?:_?\d)*)?)?([eE][+-]?\d(?:_?\d)*)?)\s*)");
  static const std::regex kSpecial(R"(\s*([+-]?)(nan|inf|infinity)\s*)", std::regex::icase);
  const std::string text = v.get<std::string>();
  std::smatch m;
  if (std::regex_match(text, m, kSpecial)) {
    std::string word = m[2].str();
    std::transform(word.begin(), word.end(), word.begin(), ::tolower);
    const double x = word == "nan" ? std::nan("") : HUGE_VAL;
    return m[1].str() == "-" ? -x : x;
  }
  if (!std::regex_match(text, m, kNumber)) return std::nullopt;
  // A mantissa needs a digit: "", ".", "e5" and "+" are not numbers.
  const std::string whole = m[2].str(), frac = m[3].str();
  if (whole.empty() && frac.size() <= 1) return std::nullopt;
  std::string plain = m[1].str() + whole + frac + m[4].str();
  plain.erase(std::remove(plain.begin(), plain.end(), '_'), plain.end());
  return std::strtod(plain.c_str(), nullptr);
}

std::map<std::string, std::string> flatten_config(const Config& config) {
  std::map<std::string, std::string> out;
  flatten_into(config, "", out);
  return out;
}

MlflowTrials::MlflowTrials(std::string tracking_uri, std::string experiment,
                           const std::string& search_name, const std::string& parent_run_id,
                           const Config& param_space)
    : uri_(tracking_uri.empty() ? param::String{"MLFLOW_TRACKING_URI", ""}.get()
                                : std::move(tracking_uri)),
      experiment_(experiment.empty() ? param::String{"MLFLOW_EXPERIMENT_NAME", "Default"}.get()
                                     : std::move(experiment)) {
  if (uri_.empty()) return;
  // The driver is one process: log whatever RANK it may have inherited.
  parent_ =
      mlflow::Run::start({.tracking_uri = uri_,
                          .experiment = experiment_,
                          .run_name = search_name,
                          .tags = {{"dtrain.role", "tune"}, {"dtrain.tune.search", search_name}},
                          .run_id = parent_run_id,
                          .all_ranks = true});
  if (parent_run_id.empty())
    parent_.set_tag("dtrain.tune.param_space", param_space.dump().substr(0, 5000));
}

std::string MlflowTrials::trial_started(const std::string& trial_id, const std::string& name,
                                        const Config& config, const std::string& run_id,
                                        bool first_start) {
  if (!active()) return "";
  auto it = runs_.find(trial_id);
  if (it == runs_.end()) {
    it = runs_
             .emplace(trial_id, mlflow::Run::start({.tracking_uri = uri_,
                                                    .experiment = experiment_,
                                                    .run_name = name,
                                                    .tags = {{"trial_name", name},
                                                             {"dtrain.role", "tune-trial"},
                                                             {"dtrain.tune.trial_id", trial_id}},
                                                    .parent_run_id = parent_.id(),
                                                    .run_id = run_id,
                                                    .all_ranks = true,
                                                    .flush_timeout = std::chrono::seconds(10)}))
             .first;
  }
  mlflow::Run& run = it->second;
  if (first_start && run_id.empty()) run.log_params(flatten_config(config));
  run.set_tag("dtrain.tune.config", config.dump().substr(0, 5000));
  run.set_tag("dtrain.tune.status", "RUNNING");
  return run.id();
}

void MlflowTrials::trial_result(const std::string& trial_id, const Result& result) {
  auto it = runs_.find(trial_id);
  if (it == runs_.end() || !result.is_object()) return;
  // Ray's MLflowLoggerCallback: step = timesteps_total when the result has a non-zero one,
  // else training_iteration; every value float() takes (numbers, NaN and infinities too,
  // booleans as 0/1, numeric strings) of the flattened result, so also the config's numbers
  // as config/<key> and Ray's numeric fields. MLflow's client sends NaN and +-inf as such.
  std::int64_t step = result.value("training_iteration", std::int64_t{0});
  if (const auto total = result.contains("timesteps_total")
                             ? python_float(result.at("timesteps_total"))
                             : std::nullopt;
      total && *total != 0 && std::isfinite(*total)) {
    step = static_cast<std::int64_t>(*total);
  }
  std::map<std::string, double> metrics;
  for (auto m = result.begin(); m != result.end(); ++m) {
    if (const auto x = python_float(m.value())) metrics[m.key()] = *x;
  }
  it->second.log_metrics(metrics, step);
}

void MlflowTrials::trial_ended(const std::string& trial_id, TrialStatus status,
                               const std::string& error) {
  auto it = runs_.find(trial_id);
  if (it == runs_.end()) return;
  it->second.set_tag("dtrain.tune.status", to_string(status));
  if (!error.empty()) it->second.set_tag("dtrain.tune.error", error.substr(0, 4000));
  it->second.end(status == TrialStatus::Error ? mlflow::RunStatus::Failed
                                              : mlflow::RunStatus::Finished);
  runs_.erase(it);
}

void MlflowTrials::end() {
  for (auto& [id, run] : runs_) {
    run.set_tag("dtrain.tune.status", "PAUSED");
    run.end(mlflow::RunStatus::Killed);
  }
  runs_.clear();
  if (parent_.active()) parent_.end(mlflow::RunStatus::Finished);
  parent_ = mlflow::Run();
}

MlflowTrials::~MlflowTrials() {
  // fit() left by an exception: the runs still open end KILLED.
  for (auto& [id, run] : runs_) run.end(mlflow::RunStatus::Killed);
  runs_.clear();
  if (parent_.active()) parent_.end(mlflow::RunStatus::Killed);
}

}  // namespace dtrain::tune::detail
