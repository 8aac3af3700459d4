#include "zero/progress_text.h"

#include <cmath>
#include <cstdio>
#include <tuple>

#include "core/python_repr.h"

namespace dtrain::zero::detail {
namespace {

using nlohmann::json;

// The value `section.params.key` of the config as given, or null.
const json* written(const Config& c, const char* section, const char* key) {
  auto s = c.raw.find(section);
  if (s == c.raw.end() || !s->is_object()) return nullptr;
  auto p = s->find("params");
  if (p == s->end() || !p->is_object()) return nullptr;
  auto it = p->find(key);
  return it == p->end() ? nullptr : &*it;
}

bool is_int(const json* v) { return v && v->is_number_integer(); }

// "[item]" ("(a, b)" and "[a, b]" for pairs); appended piecewise (GCC 12 warns on
// operator+ chains with a temporary here).
std::string list_of(const std::string& item) {
  std::string s;
  s += '[';
  s += item;
  s += ']';
  return s;
}
std::string pair_of(const std::string& a, const std::string& b, bool list) {
  std::string s;
  s += list ? '[' : '(';
  s += a;
  s += ", ";
  s += b;
  s += list ? ']' : ')';
  return s;
}

// Python's print of `v`: an int where DeepSpeed's value is the integer the config wrote
// (`as_int`), else a float.
std::string py(double v, bool as_int) {
  if (as_int && std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9.0e15) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f", v);
    return buf;
  }
  return dtrain::detail::python_float_repr(v);
}

// OneCycle's iteration count past its cycle (total = the two step sizes).
bool past_cycle(const Config& c, const LRScheduler& s) {
  const auto& sc = c.scheduler;
  const int64_t second =  // -1: as long as the first
      sc.cycle_second_step_size < 0 ? sc.cycle_first_step_size : sc.cycle_second_step_size;
  return s.last_batch_iteration() >= sc.cycle_first_step_size + second;
}

// Whether the rate in the param group is an int: the config's integer, put there unchanged.
bool lr_is_int(const Config& c, const LRScheduler& s, bool client) {
  const auto& sc = c.scheduler;
  const bool started = s.last_batch_iteration() >= 0;
  if (sc.type.empty()) return !client && is_int(written(c, "optimizer", "lr"));
  if (sc.type == "WarmupLR" || sc.type == "WarmupDecayLR")
    return !started && is_int(written(c, "scheduler", "warmup_min_lr"));
  if (sc.type == "OneCycle")
    return (!started || (past_cycle(c, s) && (sc.decay_step_size == 0 || sc.decay_lr_rate == 0))) &&
           is_int(written(c, "scheduler", "cycle_min_lr"));
  if (sc.type == "LRRangeTest") {
    // min_lr * (1 + step_rate * floor(...)): all ints only in staircase mode.
    const bool min_int = is_int(written(c, "scheduler", "lr_range_test_min_lr"));
    if (!started) return min_int;
    return min_int && sc.lr_range_test_staircase &&
           is_int(written(c, "scheduler", "lr_range_test_step_rate"));
  }
  return false;  // WarmupCosineLR: org_lr * a float ratio
}

// OneCycle's (momentum, 0.99), as DeepSpeed sets it on an optimizer with betas.
std::string cycled_betas(const Config& c, const LRScheduler& s) {
  const auto& sc = c.scheduler;
  bool as_int = false;
  if (s.last_batch_iteration() < 0)
    as_int = is_int(written(c, "scheduler", "cycle_min_mom"));
  else if (past_cycle(c, s) && (sc.decay_step_size == 0 || sc.decay_mom_rate == 0))
    as_int = is_int(written(c, "scheduler", "cycle_max_mom"));
  return list_of(pair_of(py(s.betas().first, as_int), py(s.betas().second, false), false));
}

bool one_cycle_momentum(const Config& c) {
  return c.scheduler.type == "OneCycle" && c.scheduler.cycle_momentum;
}

}  // namespace

std::string lr_list_text(const Config& config, const LRScheduler& scheduler, double lr,
                         bool client_optimizer) {
  return list_of(py(lr, lr_is_int(config, scheduler, client_optimizer)));
}

bool cycles_client_betas(const Config& config, const torch::optim::Optimizer& client) {
  const bool torch_cycle =
      config.scheduler.type == "OneCycleLR" && config.scheduler.torch_params.cycle_momentum;
  return (one_cycle_momentum(config) || torch_cycle) &&
         (dynamic_cast<const torch::optim::Adam*>(&client) ||
          dynamic_cast<const torch::optim::AdamW*>(&client));
}

std::string mom_list_text(const Config& config, const LRScheduler& scheduler,
                          const torch::optim::Optimizer* client) {
  // torch's OneCycleLR: group["momentum"] (SGD, RMSprop) or group["betas"], a tuple, it set.
  if (config.scheduler.type == "OneCycleLR" && scheduler.cycles_momentum()) {
    const bool momentum =
        client ? dynamic_cast<const torch::optim::SGD*>(client) ||
                     dynamic_cast<const torch::optim::RMSprop*>(client)
               : config.optimizer.type == "SGD" || config.optimizer.type == "RMSprop";
    if (momentum) return list_of(py(scheduler.momentum(), false));
    if (!client && config.optimizer.type == "Adagrad") return "[0.0]";
    return list_of(
        pair_of(py(scheduler.betas().first, false), py(scheduler.betas().second, false), false));
  }
  if (client) {
    // get_mom(): "momentum" for the classes named SGD and RMSprop, "betas" for any other.
    const auto& options = client->param_groups().at(0).options();
    if (dynamic_cast<const torch::optim::SGD*>(client)) {
      const double m = static_cast<const torch::optim::SGDOptions&>(options).momentum();
      return list_of(py(m, m == 0));
    }
    if (dynamic_cast<const torch::optim::RMSprop*>(client)) {
      const double m = static_cast<const torch::optim::RMSpropOptions&>(options).momentum();
      return list_of(py(m, m == 0));
    }
    if (cycles_client_betas(config, *client)) return cycled_betas(config, scheduler);
    std::tuple<double, double> b;
    if (dynamic_cast<const torch::optim::Adam*>(client))
      b = static_cast<const torch::optim::AdamOptions&>(options).betas();
    else if (dynamic_cast<const torch::optim::AdamW*>(client))
      b = static_cast<const torch::optim::AdamWOptions&>(options).betas();
    else
      return "[0.0]";  // no "betas" in its group (Adagrad, LBFGS, an optimizer of your own)
    return list_of(pair_of(py(std::get<0>(b), false), py(std::get<1>(b), false), false));
  }
  const auto& o = config.optimizer;
  if (o.type == "SGD" || o.type == "RMSprop") {  // "momentum" (DeepSpeed's OneCycle: not cycled)
    const json* m = written(config, "optimizer", "momentum");
    return list_of(m ? py(o.momentum, is_int(m)) : std::string("0"));
  }
  // torch.optim.Adagrad and DeepSpeedCPUAdagrad keep no betas (OneCycle does not cycle them).
  if (o.type == "Adagrad") return "[0.0]";
  if (one_cycle_momentum(config)) return cycled_betas(config, scheduler);
  const auto [b1, b2] = scheduler.betas();
  const json* b = written(config, "optimizer", "betas");
  if (b && b->is_array() && b->size() == 2)  // the config's list, as written
    return list_of(pair_of(py(b1, is_int(&(*b)[0])), py(b2, is_int(&(*b)[1])), true));
  return list_of(pair_of(py(b1, false), py(b2, false), false));
}

}  // namespace dtrain::zero::detail
