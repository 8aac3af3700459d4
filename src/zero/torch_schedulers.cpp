// torch.optim.lr_scheduler's schedulers (see torch_schedulers.h).
#include "zero/torch_schedulers.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace dtrain::zero {

namespace {

// Python's a % b for b > 0 (never negative).
int64_t py_mod(int64_t a, int64_t b) {
  const int64_t r = a % b;
  return r < 0 ? r + b : r;
}

// Python's float division: x / 0.0 raises ZeroDivisionError, and so does torch's scheduler.
double py_div(double x, double y, const std::string& type, int64_t step) {
  if (y == 0.0)
    throw Error("zero scheduler: torch.optim.lr_scheduler." + type +
                " divides by zero at its step " + std::to_string(step) +
                " (torch raises ZeroDivisionError there too): check the scheduler's params");
  return x / y;
}

double anneal(const std::string& strategy, double start, double end, double pct) {
  if (strategy == "cos") {
    const double cos_out = std::cos(M_PI * pct) + 1;
    return end + (start - end) / 2.0 * cos_out;
  }
  return (end - start) * pct + start;
}

}  // namespace

// One call of torch's step(): `initial` is the one its constructor makes (torch's _is_initial).
void LRScheduler::torch_update(bool initial) {
  const auto& p = c_.torch_params;
  const std::string& t = c_.type;
  auto& s = ts_;
  if (t == "CosineAnnealingWarmRestarts") {
    // Its own step(): no _step_count, the rate from base_lr and T_cur / T_i.
    if (s.last_epoch < 0) {
      s.T_i = p.T_0;
      s.T_cur = 0;
      s.last_epoch = 0;
    } else {
      ++s.last_epoch;
      s.T_cur = s.T_cur + 1;
      if (s.T_cur >= s.T_i) {
        s.T_cur = s.T_cur % s.T_i;
        s.T_i = s.T_i * p.T_mult;
      }
    }
    s.lr = p.eta_min +
           (base_lr_ - p.eta_min) *
               (1 + std::cos(M_PI * static_cast<double>(s.T_cur) / static_cast<double>(s.T_i))) / 2;
    last_batch_iteration_ = s.last_epoch - 1;
    return;
  }
  ++s.step_count;
  ++s.last_epoch;
  const int64_t k = s.last_epoch;
  const double kd = static_cast<double>(k);
  double lr = s.lr;
  if (t == "StepLR") {
    if (!(k == 0 || k % p.step_size != 0)) lr = s.lr * p.gamma;
  } else if (t == "MultiStepLR") {
    const auto n = std::count(p.milestones.begin(), p.milestones.end(), k);
    if (n > 0) lr = s.lr * std::pow(p.gamma, static_cast<double>(n));
  } else if (t == "ConstantLR") {
    if (k == 0)
      lr = s.lr * p.factor;
    else if (k == p.total_iters)
      lr = s.lr * py_div(1.0, p.factor, t, k);
  } else if (t == "LinearLR") {
    if (k == 0) {
      lr = s.lr * p.start_factor;
    } else if (!initial && k <= p.total_iters) {
      const double d = p.end_factor - p.start_factor;
      lr = s.lr * (1.0 + py_div(d,
                                static_cast<double>(p.total_iters) * p.start_factor +
                                    static_cast<double>(k - 1) * d,
                                t, k));
    }
  } else if (t == "ExponentialLR") {
    if (!initial) lr = s.lr * p.gamma;
  } else if (t == "PolynomialLR") {
    if (!initial && k <= p.total_iters) {
      const double T = static_cast<double>(p.total_iters);
      const double base = py_div(1.0 - kd / T, 1.0 - static_cast<double>(k - 1) / T, t, k);
      if (base == 0.0 && p.power < 0) py_div(1.0, 0.0, t, k);  // 0.0 ** negative
      lr = s.lr * std::pow(base, p.power);
    }
  } else if (t == "CosineAnnealingLR") {
    const double T = static_cast<double>(p.T_max);
    if (initial) {
      // the rate as it is
    } else if (s.step_count == 1 && k > 0) {
      lr = p.eta_min + (base_lr_ - p.eta_min) * (1 + std::cos(kd * M_PI / T)) / 2;
    } else if (py_mod(k - 1 - p.T_max, 2 * p.T_max) == 0) {
      lr = s.lr + (base_lr_ - p.eta_min) * (1 - std::cos(M_PI / T)) / 2;
    } else {
      lr = py_div(1 + std::cos(M_PI * kd / T), 1 + std::cos(M_PI * (kd - 1) / T), t, k) *
               (s.lr - p.eta_min) +
           p.eta_min;
    }
  } else if (t == "OneCycleLR") {
    if (k > p.total_steps)
      throw Error("zero scheduler: torch.optim.lr_scheduler.OneCycleLR stepped " +
                  std::to_string(k) + " times, past its total_steps " +
                  std::to_string(p.total_steps) +
                  " (torch raises ValueError there too: \"Tried to step " + std::to_string(k) +
                  " times\"): raise total_steps to the number of optimizer steps of the run");
    const double initial_lr = base_lr_, max_lr = p.max_lr, min_lr = initial_lr / p.final_div_factor;
    const double T = static_cast<double>(p.total_steps);
    struct Phase {
      double end;
      double start_lr, end_lr, start_mom, end_mom;
    };
    std::vector<Phase> phases;
    if (p.three_phase) {
      phases = {{p.pct_start * T - 1, initial_lr, max_lr, p.max_momentum, p.base_momentum},
                {2 * p.pct_start * T - 2, max_lr, initial_lr, p.base_momentum, p.max_momentum},
                {T - 1, initial_lr, min_lr, p.max_momentum, p.max_momentum}};
    } else {
      phases = {{p.pct_start * T - 1, initial_lr, max_lr, p.max_momentum, p.base_momentum},
                {T - 1, max_lr, min_lr, p.base_momentum, p.max_momentum}};
    }
    double start = 0.0;
    for (size_t i = 0; i < phases.size(); ++i) {
      const Phase& ph = phases[i];
      if (kd <= ph.end || i + 1 == phases.size()) {
        const double pct = py_div(kd - start, ph.end - start, t, k);
        lr = anneal(p.anneal_strategy, ph.start_lr, ph.end_lr, pct);
        if (p.cycle_momentum) s.momentum = anneal(p.anneal_strategy, ph.start_mom, ph.end_mom, pct);
        break;
      }
      start = ph.end;
    }
  }
  s.lr = lr;
  last_batch_iteration_ = s.last_epoch - 1;
}

namespace detail {

c10::impl::GenericDict torch_scheduler_state_dict(const SchedulerConfig& sc, const LRScheduler& s,
                                                  bool use_beta1) {
  const auto& p = sc.torch_params;
  const auto& st = s.torch_state();
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  const std::string& t = sc.type;
  if (t == "StepLR") {
    d.insert("step_size", p.step_size);
    d.insert("gamma", p.gamma);
  } else if (t == "MultiStepLR") {
    c10::Dict<int64_t, int64_t> counts;  // collections.Counter(milestones)
    for (int64_t m : p.milestones) {
      auto it = counts.find(m);
      counts.insert_or_assign(m, it == counts.end() ? 1 : it->value() + 1);
    }
    d.insert("milestones", counts);
    d.insert("gamma", p.gamma);
  } else if (t == "ConstantLR") {
    d.insert("factor", p.factor);
    d.insert("total_iters", p.total_iters);
  } else if (t == "LinearLR") {
    d.insert("start_factor", p.start_factor);
    d.insert("end_factor", p.end_factor);
    d.insert("total_iters", p.total_iters);
  } else if (t == "ExponentialLR") {
    d.insert("gamma", p.gamma);
  } else if (t == "PolynomialLR") {
    d.insert("total_iters", p.total_iters);
    d.insert("power", p.power);
  } else if (t == "CosineAnnealingLR") {
    d.insert("T_max", p.T_max);
    d.insert("eta_min", p.eta_min);
  } else if (t == "CosineAnnealingWarmRestarts") {
    d.insert("T_0", p.T_0);
    d.insert("T_i", st.T_i);
    d.insert("T_mult", p.T_mult);
    d.insert("eta_min", p.eta_min);
    d.insert("T_cur", st.T_cur);
  } else if (t == "OneCycleLR") {
    d.insert("total_steps", p.total_steps);
    c10::impl::GenericList phases(c10::AnyType::get());
    auto phase = [&](c10::IValue end, const char* lr0, const char* lr1, const char* m0,
                     const char* m1) {
      c10::impl::GenericDict ph(c10::StringType::get(), c10::AnyType::get());
      ph.insert("end_step", std::move(end));
      ph.insert("start_lr", std::string(lr0));
      ph.insert("end_lr", std::string(lr1));
      ph.insert("start_momentum", std::string(m0));
      ph.insert("end_momentum", std::string(m1));
      phases.push_back(ph);
    };
    const double T = static_cast<double>(p.total_steps);
    phase(p.pct_start * T - 1, "initial_lr", "max_lr", "max_momentum", "base_momentum");
    if (p.three_phase) {
      phase(2 * p.pct_start * T - 2, "max_lr", "initial_lr", "base_momentum", "max_momentum");
      phase(p.total_steps - 1, "initial_lr", "min_lr", "max_momentum", "max_momentum");
    } else {
      phase(p.total_steps - 1, "max_lr", "min_lr", "base_momentum", "max_momentum");
    }
    d.insert("_schedule_phases", phases);
    d.insert("_anneal_func_type", p.anneal_strategy);
    d.insert("cycle_momentum", p.cycle_momentum);
    // use_beta1 is only set with cycle_momentum; torch reads it only then.
    if (p.cycle_momentum) d.insert("use_beta1", use_beta1);
  }
  d.insert("base_lrs", c10::List<double>({s.base_lr()}));
  d.insert("last_epoch", st.last_epoch);
  d.insert("_step_count", st.step_count);
  d.insert("_is_initial", false);
  d.insert("_get_lr_called_within_step", false);
  d.insert("_last_lr", c10::List<double>({st.lr}));
  return d;
}

void load_torch_scheduler_state(const c10::impl::GenericDict& d, const SchedulerConfig& sc,
                                LRScheduler& s, const std::string& where) {
  auto need = [&](const char* key) -> c10::IValue {
    auto it = d.find(key);
    if (it == d.end())
      throw Error(where + ": lr_scheduler has no \"" + key + "\" (torch.optim.lr_scheduler." +
                  sc.type + "'s state_dict() holds it); the checkpoint was saved with another " +
                  "scheduler: load with load_lr_scheduler_states = false");
    return it->value();
  };
  auto as_double = [](const c10::IValue& v) {
    return v.isInt() ? double(v.toInt()) : v.toDouble();
  };
  LRScheduler::TorchState st;
  st.last_epoch = need("last_epoch").toInt();
  st.step_count = need("_step_count").toInt();
  auto last = need("_last_lr");
  if (!last.isList() || last.toListRef().size() != 1)
    throw Error(where + ": lr_scheduler's _last_lr is not a list of one rate (one param group)");
  st.lr = as_double(last.toListRef()[0]);
  if (sc.type == "CosineAnnealingWarmRestarts") {
    st.T_cur = need("T_cur").toInt();
    st.T_i = need("T_i").toInt();
  }
  st.momentum = s.torch_state().momentum;
  s.set_torch_state(st);
  if (sc.type == "OneCycleLR" && sc.torch_params.cycle_momentum) {
    // The momentum the group held: the one get_lr() set at last_epoch (recomputed).
    LRScheduler replay(sc, 0, 0, 0);  // OneCycleLR's rates come from max_lr alone
    for (int64_t k = 0; k < st.last_epoch; ++k) replay.step();
    st.momentum = replay.torch_state().momentum;
    s.set_torch_state(st);
  }
}

std::vector<std::pair<std::string, double>> torch_scheduler_group_values(const SchedulerConfig& sc,
                                                                         const LRScheduler& s) {
  std::vector<std::pair<std::string, double>> v = {{"initial_lr", s.base_lr()}};
  if (sc.type == "OneCycleLR") {
    const auto& p = sc.torch_params;
    v.emplace_back("max_lr", p.max_lr);
    v.emplace_back("min_lr", s.base_lr() / p.final_div_factor);
    if (p.cycle_momentum) {
      v.emplace_back("max_momentum", p.max_momentum);
      v.emplace_back("base_momentum", p.base_momentum);
    }
  }
  return v;
}

}  // namespace detail
}  // namespace dtrain::zero
