// torch.optim.lr_scheduler's schedulers by name, the config side (see
// torch_scheduler_config.h); no libtorch here: the launcher reads configs too.
#include "zero/torch_scheduler_config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <sstream>
#include <vector>

#include "core/python_repr.h"

namespace dtrain::zero {

bool SchedulerConfig::is_torch() const { return detail::is_torch_scheduler_name(type); }

namespace detail {

using nlohmann::json;

bool is_torch_scheduler_name(const std::string& name) {
  static const std::vector<std::string> names = {
      "StepLR",        "MultiStepLR",  "ConstantLR",        "LinearLR",
      "ExponentialLR", "PolynomialLR", "CosineAnnealingLR", "CosineAnnealingWarmRestarts",
      "OneCycleLR"};
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::string torch_scheduler_refusal(const std::string& name) {
  static const std::map<std::string, std::string> m = {
      {"LambdaLR", "it takes lr_lambda, a Python function, which a JSON config cannot hold"},
      {"MultiplicativeLR",
       "it takes lr_lambda, a Python function, which a JSON config cannot hold"},
      {"SequentialLR", "it takes other scheduler objects, which a JSON config cannot hold"},
      {"ChainedScheduler", "it takes other scheduler objects, which a JSON config cannot hold"},
      {"ReduceLROnPlateau",
       "its step() takes the metric, and DeepSpeed's engine calls step() without one (DeepSpeed "
       "0.19.8 fails at its first step)"},
      {"LRScheduler", "it is the base class, with no schedule of its own"},
      {"CyclicLR", "not implemented by dtrain yet"}};
  auto it = m.find(name);
  return it == m.end() ? std::string() : it->second;
}

OptimizerConfig optimizer_under_scheduler(const OptimizerConfig& o, const SchedulerConfig& sc) {
  OptimizerConfig out = o;
  if (sc.type == "OneCycleLR" && sc.torch_params.cycle_momentum && !optimizer_has_betas(o))
    out.momentum = sc.torch_params.max_momentum;
  return out;
}

bool optimizer_has_betas(const OptimizerConfig& o) {
  return o.type != "SGD" && o.type != "RMSprop" && o.type != "Adagrad";
}

namespace {

// scheduler.params for one torch class: every read records the key; finish() refuses the rest,
// as the constructor refuses an unexpected keyword argument.
class Params {
 public:
  Params(const json* j, std::string cls) : cls_(std::move(cls)) {
    if (j && !j->is_null() && !j->is_object())
      throw ConfigError("scheduler.params: must be an object, got " + std::string(j->type_name()));
    if (j && j->is_object()) j_ = *j;
  }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw ConfigError("scheduler.params" + (key.empty() ? std::string() : "." + key) + ": " + what);
  }
  const json* get(const std::string& key) {
    known_.push_back(key);
    auto it = j_.find(key);
    if (it == j_.end()) return nullptr;
    if (it->is_string() && it->get<std::string>() == "auto")
      fail(key,
           "\"auto\" is filled in by Hugging Face's Trainer / accelerate from the training "
           "arguments, which dtrain does not have; give a value");
    return &*it;
  }
  bool has(const std::string& key) const { return j_.contains(key); }
  void require(const std::string& key) const {
    if (!j_.contains(key))
      fail("", "missing " + key + ", which " + cls_ +
                   " requires (DeepSpeed 0.19.8 fails without it too: the constructor has no "
                   "default)");
  }
  // A Python float or int (torch reads either); bool refused.
  bool number(const std::string& key, double& out) {
    if (auto v = get(key)) {
      if (!v->is_number()) fail(key, "expected a number, got " + v->dump());
      out = v->get<double>();
      return true;
    }
    return false;
  }
  bool integer(const std::string& key, int64_t& out, int64_t lo, const std::string& why = "") {
    if (auto v = get(key)) {
      if (!v->is_number_integer())
        fail(key, "expected an integer, got " + v->dump() +
                      (v->is_number_float() ? " (write it without a fraction or exponent)" : ""));
      if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX))
        fail(key, "out of range: " + v->dump());
      out = v->get<int64_t>();
      if (out < lo)
        fail(key, "out of range: " + v->dump() + " (allowed: " + std::to_string(lo) + " or more" +
                      (why.empty() ? std::string() : "; " + why) + ")");
      return true;
    }
    return false;
  }
  void boolean(const std::string& key, bool& out) {
    if (auto v = get(key)) {
      if (!v->is_boolean()) fail(key, "expected true or false, got " + v->dump());
      out = v->get<bool>();
    }
  }
  void finish() const {
    for (auto it = j_.begin(); it != j_.end(); ++it)
      if (std::find(known_.begin(), known_.end(), it.key()) == known_.end())
        fail(it.key(), "unknown key (DeepSpeed 0.19.8 refuses it too: it passes the key to " +
                           cls_ + "'s constructor, which has no such argument)");
  }

 private:
  json j_ = json::object();
  std::string cls_;
  std::vector<std::string> known_;
};

std::string num(double v) { return dtrain::detail::python_float_repr(v); }

}  // namespace

void parse_torch_scheduler(const json* params, const OptimizerConfig& o, SchedulerConfig& sc) {
  const std::string& t = sc.type;
  auto& p = sc.torch_params;
  Params ps(params, "torch.optim.lr_scheduler." + t);
  if (auto l = ps.get("last_epoch"); l && !(l->is_number_integer() && *l == -1))
    ps.fail("last_epoch",
            "a start other than -1 (the beginning) is not supported by dtrain (torch needs the "
            "optimizer's initial_lr for it); a resumed run takes the scheduler's position from "
            "its checkpoint");
  const std::string div0 = "torch's scheduler would divide by zero (ZeroDivisionError)";
  if (t == "StepLR") {
    ps.require("step_size");
    ps.integer("step_size", p.step_size, 1, div0 + " at its first step");
    ps.number("gamma", p.gamma);
  } else if (t == "MultiStepLR") {
    ps.require("milestones");
    const json* m = ps.get("milestones");
    if (!m->is_array()) ps.fail("milestones", "expected a list of integers, got " + m->dump());
    for (const auto& e : *m) {
      if (!e.is_number_integer())
        ps.fail("milestones", "expected a list of integers, got " + m->dump());
      p.milestones.push_back(e.get<int64_t>());
    }
    ps.number("gamma", p.gamma);
  } else if (t == "ConstantLR") {
    ps.number("factor", p.factor);
    if (p.factor > 1.0 || p.factor < 0)
      ps.fail("factor", "out of range: " + num(p.factor) +
                            " (torch's ConstantLR refuses it too: \"Constant multiplicative "
                            "factor expected to be between 0 and 1.\")");
    ps.integer("total_iters", p.total_iters, INT64_MIN);
    if (p.factor == 0 && p.total_iters > 0)
      ps.fail("factor", "0: " + div0 + " at step total_iters (it divides by the factor there)");
  } else if (t == "LinearLR") {
    ps.number("start_factor", p.start_factor);
    if (p.start_factor > 1.0 || p.start_factor <= 0)
      ps.fail("start_factor", "out of range: " + num(p.start_factor) +
                                  " (torch's LinearLR refuses it too: \"Starting multiplicative "
                                  "factor expected to be greater than 0 and less or equal to "
                                  "1.\")");
    ps.number("end_factor", p.end_factor);
    if (p.end_factor > 1.0 || p.end_factor < 0)
      ps.fail("end_factor", "out of range: " + num(p.end_factor) +
                                " (torch's LinearLR refuses it too: \"Ending multiplicative "
                                "factor expected to be between 0 and 1.\")");
    ps.integer("total_iters", p.total_iters, INT64_MIN);
  } else if (t == "ExponentialLR") {
    ps.require("gamma");
    ps.number("gamma", p.gamma);
  } else if (t == "PolynomialLR") {
    ps.integer("total_iters", p.total_iters, INT64_MIN);
    ps.number("power", p.power);
    if (p.power < 0 && p.total_iters > 0)
      ps.fail("power", "negative: " + div0 + " at step total_iters (0.0 to a negative power)");
  } else if (t == "CosineAnnealingLR") {
    ps.require("T_max");
    ps.integer("T_max", p.T_max, 1, div0 + " at its first step");
    ps.number("eta_min", p.eta_min);
  } else if (t == "CosineAnnealingWarmRestarts") {
    ps.require("T_0");
    const std::string refuses = "torch's CosineAnnealingWarmRestarts refuses it too";
    if (auto v = ps.get("T_0"); !v->is_number_integer() || v->get<int64_t>() <= 0)
      ps.fail("T_0", "expected a positive integer, got " + v->dump() + " (" + refuses +
                         ": \"Expected positive integer T_0\")");
    p.T_0 = ps.get("T_0")->get<int64_t>();
    if (auto v = ps.get("T_mult"); v && (!v->is_number_integer() || v->get<int64_t>() < 1))
      ps.fail("T_mult", "expected an integer >= 1, got " + v->dump() + " (" + refuses +
                            ": \"Expected integer T_mult >= 1\")");
    if (auto v = ps.get("T_mult")) p.T_mult = v->get<int64_t>();
    if (auto v = ps.get("eta_min"); v && !v->is_number())
      ps.fail("eta_min", "expected a number, got " + v->dump() + " (" + refuses + ")");
    ps.number("eta_min", p.eta_min);
  } else if (t == "OneCycleLR") {
    ps.require("max_lr");
    if (auto v = ps.get("max_lr"); v->is_array())
      ps.fail("max_lr",
              "a list gives one rate per param group; dtrain's optimizer has one group: give a "
              "number");
    ps.number("max_lr", p.max_lr);
    int64_t epochs = 0, steps_per_epoch = 0;
    const bool total = ps.has("total_steps") && !ps.get("total_steps")->is_null();
    if (total) {
      const json* v = ps.get("total_steps");
      if (!v->is_number_integer() || v->get<int64_t>() <= 0)
        ps.fail("total_steps", "expected a positive integer, got " + v->dump() +
                                   " (torch's OneCycleLR refuses it too)");
      p.total_steps = v->get<int64_t>();
    }
    for (const char* k : {"epochs", "steps_per_epoch"})
      if (auto v = ps.get(k); v && !v->is_null() && !total) {
        if (!v->is_number_integer() || v->get<int64_t>() <= 0)
          ps.fail(k, "expected a positive integer, got " + v->dump() +
                         " (torch's OneCycleLR refuses it too)");
        (std::string(k) == "epochs" ? epochs : steps_per_epoch) = v->get<int64_t>();
      }
    if (!total) {
      if (epochs == 0 || steps_per_epoch == 0)
        ps.fail("",
                "OneCycleLR needs total_steps, or epochs and steps_per_epoch (torch refuses "
                "it too: \"You must define either total_steps OR (epochs AND "
                "steps_per_epoch)\")");
      p.total_steps = epochs * steps_per_epoch;
    }
    if (auto v = ps.get("pct_start")) {
      if (!v->is_number_float() || v->get<double>() < 0 || v->get<double>() > 1)
        ps.fail("pct_start", "expected a float between 0 and 1, got " + v->dump() +
                                 " (torch's OneCycleLR refuses it too; it takes a float only: "
                                 "write 1 as 1.0)");
      p.pct_start = v->get<double>();
    }
    if (auto v = ps.get("anneal_strategy")) {
      if (!v->is_string() || (*v != "cos" && *v != "linear"))
        ps.fail("anneal_strategy", "expected \"cos\" or \"linear\", got " + v->dump() +
                                       " (torch's OneCycleLR refuses it too)");
      p.anneal_strategy = v->get<std::string>();
    }
    ps.boolean("cycle_momentum", p.cycle_momentum);
    for (const char* k : {"base_momentum", "max_momentum"})
      if (auto v = ps.get(k); v && v->is_array())
        ps.fail(k,
                "a list gives one value per param group; dtrain's optimizer has one group: give "
                "a number");
    ps.number("base_momentum", p.base_momentum);
    ps.number("max_momentum", p.max_momentum);
    ps.number("div_factor", p.div_factor);
    ps.number("final_div_factor", p.final_div_factor);
    ps.boolean("three_phase", p.three_phase);
    if (p.div_factor == 0 || p.final_div_factor == 0)
      ps.fail(p.div_factor == 0 ? "div_factor" : "final_div_factor",
              "0: torch's OneCycleLR divides by it in its constructor (ZeroDivisionError)");
    if (p.cycle_momentum) {
      if (o.type == "Adagrad")
        ps.fail("cycle_momentum",
                "true, but Adagrad has neither momentum nor betas (torch's OneCycleLR refuses it "
                "too: \"optimizer must support momentum or beta1 with `cycle_momentum` option "
                "enabled\"): set cycle_momentum to false");
    }
  }
  ps.finish();
  // torch's constructor takes the first step (step 0): a OneCycleLR whose first phase has
  // length 0 there divides by zero (0 / 0), and torch refuses it with ZeroDivisionError.
  if (t == "OneCycleLR") {
    const double T = static_cast<double>(p.total_steps);
    const double end1 = p.pct_start * T - 1;
    // Step 0 falls in the first phase when 0 <= its end; in the last phase (from end1, or
    // from the second phase's end in the three-phase form) otherwise.
    double lo = 0.0, hi = end1;
    if (!(0.0 <= end1)) {
      lo = end1;
      hi = p.three_phase ? 2 * p.pct_start * T - 2 : T - 1;
      if (p.three_phase && !(0.0 <= hi)) lo = hi, hi = T - 1;
    }
    if (hi - lo == 0.0)
      ps.fail("pct_start",
              "torch.optim.lr_scheduler.OneCycleLR divides by zero at its step 0 (a "
              "phase of length 0: pct_start * total_steps is " +
                  num(p.pct_start * T) +
                  "), in its constructor: DeepSpeed 0.19.8 fails there too; change "
                  "pct_start or total_steps");
  }
}

}  // namespace detail
}  // namespace dtrain::zero
