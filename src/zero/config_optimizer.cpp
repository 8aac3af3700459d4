// A DeepSpeed config's optimizer and scheduler sections, and what DeepSpeed's engine decides
// about the ones it builds by name (config_sections.h).
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "zero/torch_scheduler_config.h"

#include "zero/config_sections.h"

namespace dtrain::zero::config_parse {
namespace {

// The optimizer types DeepSpeed 0.19.8 has that dtrain does not run, and what to use. DeepSpeed
// matches these (its own optimizers) in any case: it lowercases the name.
const std::map<std::string, std::string>& other_optimizers() {
  static const std::map<std::string, std::string> m = {
      {"muadam", "muP's optimizers need the mup package; use Adam"},
      {"muadamw", "muP's optimizers need the mup package; use AdamW"},
      {"musgd", "muP's optimizers need the mup package; use SGD"},
      {"muon", "use Adam, AdamW, SGD or Lamb"}};
  return m;
}

// Every other type DeepSpeed 0.19.8 looks up in torch.optim by its exact name (RMSprop, which
// libtorch has, is run; these libtorch has not, or LBFGS, whose step needs a closure).
const std::vector<std::string>& torch_optimizers() {
  static const std::vector<std::string> v = {"Adadelta",   "Adafactor", "Adamax", "ASGD",
                                             "LBFGS",      "NAdam",     "RAdam",  "Rprop",
                                             "SparseAdam", "Muon"};
  return v;
}

// An optimizer param given as "auto": the optimizer's default, with a note.
bool auto_default(Section& ps, const std::string& key, const std::string& value) {
  if (!Section::is_auto(ps.get(key))) return false;
  ps.note(key, "\"auto\": " + value +
                   " (the optimizer's default; Hugging Face's integration "
                   "would fill in its training argument)");
  return true;
}

// The optimizer's type as DeepSpeed 0.19.8 resolves it: its own optimizers (Adam, AdamW, Lamb,
// Adagrad, ...) in any case, torch.optim's (SGD, ...) by their exact name.
std::string optimizer_type(Section& s) {
  auto t = s.get("type");
  if (!t)
    s.fail("type",
           "missing (one of Adam, AdamW, SGD, Lamb, Adagrad, Lion); DeepSpeed 0.19.8 would "
           "silently "
           "ignore an "
           "optimizer section without a type, and dtrain refuses it so that a typo cannot go "
           "unnoticed");
  if (!t->is_string()) s.fail("type", "expected a string, got " + t->dump());
  const std::string name = t->get<std::string>();
  const std::string low = lower(name);
  if (low == "adam") return "Adam";
  if (low == "adamw") return "AdamW";
  if (low == "lamb") return "Lamb";
  if (low == "adagrad") return "Adagrad";
  if (low == "lion") return "Lion";
  if (name == "SGD") return "SGD";
  if (name == "RMSprop") return "RMSprop";  // torch.optim's, by its exact name
  if (auto it = other_optimizers().find(low); it != other_optimizers().end())
    s.fail("type",
           "DeepSpeed's " + name + " optimizer is not implemented by dtrain: " + it->second);
  const auto& torch_names = torch_optimizers();
  if (std::find(torch_names.begin(), torch_names.end(), name) != torch_names.end())
    s.fail("type",
           "torch.optim." + name +
               " (DeepSpeed 0.19.8 builds it by name) is not implemented by dtrain's "
               "config: pass a torch::optim::" +
               name +
               " as InitOptions::optimizer, or use Adam, AdamW, SGD, Lamb, Adagrad, Lion or "
               "RMSprop");
  if (low == "onebitadam" || low == "zerooneadam" || low == "onebitlamb")
    s.fail("type", "DeepSpeed 0.19.8 has no " + name +
                       " optimizer any more (its compressed-communication optimizers were "
                       "removed; it refuses the name too): use " +
                       (low == "onebitlamb" ? "Lamb" : "Adam") +
                       " (the same update, uncompressed)");
  std::string near =
      closest_key(name, {"Adam", "AdamW", "SGD", "Lamb", "Adagrad", "Lion", "RMSprop"});
  s.fail("type", "unknown value \"" + name +
                     "\" (allowed: Adam, AdamW, SGD, Lamb, Adagrad, Lion, RMSprop; DeepSpeed "
                     "0.19.8 refuses it too: it matches Adam, AdamW, Lamb, Adagrad and Lion in any "
                     "case, SGD, RMSprop and torch.optim's other names only exactly)" +
                     (near.empty() ? "" : "; did you mean " + near + "?"));
}

// A scheduler param that Hugging Face fills in from its training arguments: "auto" cannot be
// resolved standalone.
void no_auto(Section& ps, const std::string& key, const std::string& what) {
  if (Section::is_auto(ps.get(key)))
    ps.fail(key,
            "\"auto\" is filled in by Hugging Face's Trainer / accelerate from the training "
            "arguments, which dtrain does not have; give " +
                what);
}

}  // namespace

void parse_optimizer(Section& root, Config& c) {
  auto v = root.get("optimizer");
  if (!v) {
    if (root.has("optimizer"))
      root.fail("optimizer",
                "null (DeepSpeed 0.19.8 fails on it too): give an object or leave the key out");
    return;
  }
  Section s(*v, "optimizer", root.notes());
  s.ignores_unknown_keys_like(root);
  auto& o = c.optimizer;
  o.given = true;
  o.type = optimizer_type(s);
  const bool adagrad = o.type == "Adagrad";
  if (adagrad) {  // torch.optim.Adagrad's defaults, and DeepSpeedCPUAdagrad's
    o.lr = 1e-2;
    o.eps = 1e-10;
  }
  const bool rmsprop = o.type == "RMSprop";
  if (rmsprop) o.lr = 1e-2;  // torch.optim.RMSprop's default
  if (auto p = s.get("params")) {
    Section ps(*p, "optimizer.params", root.notes());
    if (ps.has("max_grad_norm"))
      ps.fail("max_grad_norm",
              "not an optimizer parameter (DeepSpeed refuses it too); use the top-level "
              "\"gradient_clipping\"");
    const bool adam = o.type == "Adam" || o.type == "AdamW";
    bool torch_adam = false;
    if (adam) ps.boolean("torch_adam", torch_adam);
    o.torch_adam = torch_adam;
    // The constructor DeepSpeed 0.19.8 passes the params to (with offload_optimizer: its CPU
    // Adam, whose arguments are FusedAdam's but set_grad_none; checked in parse_config).
    ps.refused_by(adam              ? (torch_adam ? (o.type == "AdamW" ? "torch.optim.AdamW"
                                                                       : "torch.optim.AdamW (or Adam)")
                                                  : "FusedAdam")
                  : o.type == "SGD" ? "torch.optim.SGD"
                  : rmsprop         ? "torch.optim.RMSprop"
                  : adagrad ? "torch.optim.Adagrad (with offload_optimizer its DeepSpeedCPUAdagrad)"
                  : o.type == "Lion" ? "FusedLion (with offload_optimizer its DeepSpeedCPULion)"
                                     : "FusedLamb");
    // torch.optim.AdamW's default weight decay is 0.01 (DeepSpeed's optimizers' is 0); with
    // torch_adam DeepSpeed 0.19.8 builds AdamW for "AdamW", and for "Adam" unless adam_w_mode is
    // false.
    bool w_mode = true;
    if (o.type == "Adam") {
      if (auto m = ps.get("adam_w_mode"); m && m->is_boolean()) w_mode = m->get<bool>();
    }
    if (adam && torch_adam && w_mode) {
      o.weight_decay = 0.01;
      if (!ps.has("weight_decay"))
        ps.note("weight_decay",
                "not given: 0.01, torch.optim.AdamW's default (torch_adam; DeepSpeed 0.19.8 "
                "builds torch.optim.AdamW)");
    }
    const std::string wd_default = json(o.weight_decay).dump();
    if (!auto_default(ps, "lr", adagrad || rmsprop ? "1e-2" : "1e-3")) ps.number("lr", o.lr, 0);
    if (!auto_default(ps, "weight_decay", wd_default)) ps.number("weight_decay", o.weight_decay, 0);
    auto betas = [&] {
      if (auto_default(ps, "betas", "[0.9, 0.999]")) return;
      if (auto b = ps.get("betas")) {
        if (!b->is_array() || b->size() != 2 || !(*b)[0].is_number() || !(*b)[1].is_number())
          ps.fail("betas", "expected [beta1, beta2], got " + b->dump());
        o.beta1 = (*b)[0].get<double>();
        o.beta2 = (*b)[1].get<double>();
        if (o.beta1 < 0 || o.beta1 >= 1 || o.beta2 < 0 || o.beta2 >= 1)
          ps.fail("betas", "each beta must be in [0, 1), got " + b->dump());
      }
    };
    if (rmsprop) {
      // torch.optim.RMSprop(lr, alpha, eps, weight_decay, momentum, centered, capturable,
      // foreach, maximize, differentiable); its constructor refuses negative values.
      if (!auto_default(ps, "eps", "1e-8")) ps.number("eps", o.eps, 0);
      ps.number("alpha", o.alpha, 0);
      ps.number("momentum", o.momentum, 0);
      ps.boolean("centered", o.centered);
      for (const char* k : {"capturable", "foreach", "differentiable"}) ps.accept(k);
      if (auto m = ps.get("maximize"); m && m->is_boolean() && m->get<bool>())
        ps.fail("maximize", "not supported by dtrain; negate the loss instead");
    } else if (o.type == "Lion") {
      // DeepSpeedCPULion(lr, betas, weight_decay, fp32_optimizer_states): decoupled decay,
      // fp32 momentum (it steps the fp32 master, so its states are fp32 either way).
      betas();
      ps.accept_bool("fp32_optimizer_states");
      // FusedLion(lr, betas, weight_decay, set_grad_none) without offload_optimizer (the same
      // update); check_engine_rules refuses the key the one built for this config does not take.
      ps.accept_bool("set_grad_none");
    } else if (adagrad) {
      // The union of torch.optim.Adagrad's arguments and DeepSpeedCPUAdagrad's; parse_config
      // refuses those the one built for this config (offload_optimizer or not) does not take.
      if (!auto_default(ps, "eps", "1e-10")) ps.number("eps", o.eps, 0);
      ps.number("lr_decay", o.lr_decay, 0);
      ps.number("initial_accumulator_value", o.initial_accumulator_value, 0);
      // torch's implementation choices: the same formula.
      for (const char* k : {"foreach", "fused", "differentiable"}) ps.accept(k);
      if (auto m = ps.get("maximize"); m && m->is_boolean() && m->get<bool>())
        ps.fail("maximize", "not supported by dtrain; negate the loss instead");
      // DeepSpeedCPUAdagrad keeps amsgrad in its group and never reads it; its states are fp32
      // by default, and with offload it steps the fp32 master, so they are fp32 either way.
      bool amsgrad = false;
      ps.boolean("amsgrad", amsgrad);
      if (amsgrad)
        ps.note(
            "amsgrad",
            "DeepSpeed 0.19.8's CPU Adagrad takes it and never reads it; no effect here either");
      ps.accept_bool("fp32_optimizer_states");
    } else if (o.type != "SGD") {
      if (!auto_default(ps, "eps", "1e-8")) ps.number("eps", o.eps, 0);
      betas();
      // torch.optim's Adam has no bias_correction: it always corrects.
      if (!torch_adam) ps.boolean("bias_correction", o.bias_correction);
      if (adam) {
        // DeepSpeed: "AdamW" is decoupled whatever adam_w_mode says; "Adam" too unless false.
        ps.boolean("adam_w_mode", o.adam_w_mode);
        if (o.type == "AdamW") o.adam_w_mode = true;
        if (auto a = ps.get("amsgrad"); a && a->is_boolean() && a->get<bool>())
          ps.fail("amsgrad",
                  "not supported by dtrain (DeepSpeed's FusedAdam refuses it too; torch_adam's "
                  "runs it); remove it");
        ps.accept_bool("fp32_optimizer_states");  // DeepSpeed's CPU Adam: fp32 moments, as here
        if (torch_adam) {
          // torch.optim.Adam(W)'s implementation choices: the same formula.
          for (const char* k : {"foreach", "fused", "capturable", "differentiable"}) ps.accept(k);
          if (auto m = ps.get("maximize"); m && m->is_boolean() && m->get<bool>())
            ps.fail("maximize", "not supported by dtrain; negate the loss instead");
        } else {
          ps.accept_bool("set_grad_none");  // FusedAdam's: how it zeroes gradients
        }
      }
      if (o.type == "Lamb") {
        ps.number("max_coeff", o.max_coeff, 0);
        ps.number("min_coeff", o.min_coeff, 0);
        if (auto a = ps.get("amsgrad"); a && a->is_boolean() && a->get<bool>())
          ps.fail("amsgrad", "not supported by dtrain; remove it");
        if (auto e = ps.get("eps_inside_sqrt"); e && e->is_boolean() && e->get<bool>())
          ps.fail("eps_inside_sqrt", "not supported by dtrain (eps is added outside the sqrt)");
      }
    } else {
      ps.number("momentum", o.momentum, 0);
      ps.number("dampening", o.dampening);
      ps.boolean("nesterov", o.nesterov);
      for (const char* k : {"foreach", "differentiable", "fused"}) ps.accept(k);
      if (auto m = ps.get("maximize"); m && m->is_boolean() && m->get<bool>())
        ps.fail("maximize", "not supported by dtrain; negate the loss instead");
      if (o.nesterov && (o.momentum <= 0 || o.dampening != 0))
        ps.fail("nesterov",
                "Nesterov momentum needs a momentum > 0 and dampening 0 (torch.optim.SGD, which "
                "DeepSpeed 0.19.8 builds, refuses it too); momentum is " +
                    json(o.momentum).dump() + ", dampening " + json(o.dampening).dump());
    }
    ps.finish();
  }
  s.ignore("legacy_fusion", "DeepSpeed's legacy fused fp16 optimizer path; no effect in dtrain");
  s.finish();
}

void parse_scheduler(Section& root, Config& c) {
  auto v = root.get("scheduler");
  if (!v) {
    if (root.has("scheduler"))
      root.fail("scheduler",
                "null (DeepSpeed 0.19.8 fails on it too): give an object or leave the key out");
    return;
  }
  Section s(*v, "scheduler", root.notes());
  s.ignores_unknown_keys_like(root);
  auto& sc = c.scheduler;
  if (!s.get("type"))
    s.fail("type",
           "missing (one of WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest); "
           "DeepSpeed 0.19.8 would silently ignore a scheduler section without a type, and dtrain "
           "refuses it so that a typo cannot go unnoticed");
  // DeepSpeed 0.19.8 looks the type up by its exact name in its lr_schedules (DeepSpeed's
  // OneCycle, ...), then in torch.optim.lr_scheduler (torch's OneCycleLR, StepLR, ...).
  if (auto t = s.get("type"); t->is_string()) {
    const std::string name = t->get<std::string>();
    if (const std::string why = detail::torch_scheduler_refusal(name); !why.empty())
      s.fail("type",
             "torch.optim.lr_scheduler." + name +
                 " (DeepSpeed 0.19.8 builds it by name) is not supported by dtrain: " + why +
                 "; use StepLR, MultiStepLR, ExponentialLR, CosineAnnealingLR, LinearLR, "
                 "ConstantLR, PolynomialLR, CosineAnnealingWarmRestarts, OneCycleLR or "
                 "DeepSpeed's WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, "
                 "LRRangeTest");
    if (detail::is_torch_scheduler_name(name)) {
      sc.type = name;
      if (!s.has("params") || s.get("params") == nullptr || s.get("params")->is_null())
        s.fail("params", "missing (DeepSpeed 0.19.8 fails without it too: it calls " + name +
                             "(optimizer, **params))");
      detail::parse_torch_scheduler(s.get("params"), c.optimizer, sc);
      s.finish();
      return;
    }
  }
  s.string("type", sc.type,
           {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest"},
           " (DeepSpeed 0.19.8 refuses it too: it looks the scheduler up by its exact name)");
  const auto& t = sc.type;
  if (!s.has("params") || s.get("params") == nullptr)
    s.fail("params", "missing (DeepSpeed 0.19.8 fails without it too: it calls " + t +
                         "(optimizer, **params)); give \"params\": {} for " + t + "'s defaults");
  // DeepSpeed's warm-up: log or linear; another value (or another case) makes it warn and warm
  // up by log.
  const std::string warmup_other =
      "; DeepSpeed 0.19.8 would warn and warm up by log instead, and dtrain refuses it so that "
      "a typo cannot go unnoticed";
  if (auto p = s.get("params")) {
    Section ps(*p, "scheduler.params", root.notes());
    ps.refused_by(t + "'s constructor");
    if (auto l = ps.get("last_batch_iteration"); l && !(l->is_number_integer() && *l == -1))
      ps.fail("last_batch_iteration",
              "a start other than -1 (the beginning) is not supported by dtrain; a resumed run "
              "takes the scheduler's position from its checkpoint");
    if (t == "WarmupLR" || t == "WarmupDecayLR") {
      if (Section::is_auto(ps.get("warmup_min_lr"))) {
        ps.note("warmup_min_lr", "\"auto\": 0 (DeepSpeed's default)");
      } else {
        ps.number("warmup_min_lr", sc.warmup_min_lr, 0);
      }
      // "auto": the optimizer's lr, as Hugging Face's integration fills it in.
      if (auto m = ps.get("warmup_max_lr"); Section::is_auto(m)) {
        sc.warmup_max_lr = c.optimizer.lr;
        ps.note("warmup_max_lr", "\"auto\": the optimizer's lr");
      } else if (m) {
        double val = 0;
        ps.number("warmup_max_lr", val, 0);
        sc.warmup_max_lr = val;
      }
      no_auto(ps, "warmup_num_steps", "the number of warm-up steps");
      ps.integer("warmup_num_steps", sc.warmup_num_steps, 1, INT64_MAX, false, true, true);
      ps.string("warmup_type", sc.warmup_type, {"log", "linear"}, warmup_other);
      if (t == "WarmupDecayLR") {
        no_auto(ps, "total_num_steps", "the number of optimizer steps of the whole run");
        ps.integer("total_num_steps", sc.total_num_steps, 1);
      }
    } else if (t == "WarmupCosineLR") {
      no_auto(ps, "total_num_steps", "the number of optimizer steps of the whole run");
      ps.integer("total_num_steps", sc.total_num_steps, 1);
      ps.number("warmup_min_ratio", sc.warmup_min_ratio, 0, 1);
      no_auto(ps, "warmup_num_steps", "the number of warm-up steps");
      ps.integer("warmup_num_steps", sc.warmup_num_steps, 1, INT64_MAX, false, true, true);
      ps.number("cos_min_ratio", sc.cos_min_ratio, 0, 1);
      ps.string("warmup_type", sc.warmup_type, {"log", "linear"}, warmup_other);
    } else if (t == "OneCycle") {
      ps.number("cycle_min_lr", sc.cycle_min_lr, 0);
      ps.number("cycle_max_lr", sc.cycle_max_lr, 0);
      ps.number("decay_lr_rate", sc.decay_lr_rate, 0);
      ps.integer("cycle_first_step_size", sc.cycle_first_step_size, 1);
      ps.integer("cycle_second_step_size", sc.cycle_second_step_size, 0);
      ps.integer("cycle_first_stair_count", sc.cycle_first_stair_count, 0);
      ps.integer("cycle_second_stair_count", sc.cycle_second_stair_count, 0);
      ps.integer("decay_step_size", sc.decay_step_size, 0);
      ps.boolean("cycle_momentum", sc.cycle_momentum);
      ps.number("cycle_min_mom", sc.cycle_min_mom, 0, 1);
      ps.number("cycle_max_mom", sc.cycle_max_mom, 0, 1);
      ps.number("decay_mom_rate", sc.decay_mom_rate, 0);
    } else {
      ps.number("lr_range_test_min_lr", sc.lr_range_test_min_lr, 0);
      ps.integer("lr_range_test_step_size", sc.lr_range_test_step_size, 1, INT64_MAX, false, true,
                 true);
      ps.number("lr_range_test_step_rate", sc.lr_range_test_step_rate, 0);
      ps.boolean("lr_range_test_staircase", sc.lr_range_test_staircase);
    }
    ps.finish();
  }
  if ((t == "WarmupDecayLR" || t == "WarmupCosineLR") && sc.total_num_steps <= 0)
    s.fail("params.total_num_steps", "required by " + t + " (a positive integer)");
  if (t == "OneCycle" && (!v->contains("params") || !(*v)["params"].contains("cycle_min_lr") ||
                          !(*v)["params"].contains("cycle_max_lr")))
    s.fail("params", "OneCycle needs cycle_min_lr and cycle_max_lr (DeepSpeed has no default)");
  s.finish();
}

void check_by_name_rules(Section& root, Config& c) {
  const json& raw = c.raw;
  bool untested_ok = false;
  if (auto u = raw.find("zero_allow_untested_optimizer"); u != raw.end() && u->is_boolean())
    untested_ok = u->get<bool>();
  if (c.optimizer.given && c.optimizer.type == "RMSprop" && c.zero.stage > 0 && !untested_ok)
    root.note("optimizer",
              "RMSprop under ZeRO: dtrain runs it; DeepSpeed 0.19.8 would refuse it (an untested "
              "ZeRO optimizer) without \"zero_allow_untested_optimizer\": true");
  // Its engine hands the scheduler the optimizer it wraps for ZeRO, fp16 or bf16 (not a
  // torch.optim.Optimizer), which torch 2.11's schedulers reject in their constructor.
  if (c.scheduler.is_torch() && (c.zero.stage > 0 || c.fp16.enabled || c.bf16)) {
    const std::string wrapper = c.zero.stage > 0 ? "ZeRO stage " + std::to_string(c.zero.stage)
                                : c.fp16.enabled ? std::string("fp16")
                                                 : std::string("bf16");
    root.note("scheduler", "torch.optim.lr_scheduler." + c.scheduler.type + " with " + wrapper +
                               ": dtrain runs it; DeepSpeed 0.19.8 would refuse it (it passes "
                               "its " +
                               wrapper +
                               " optimizer wrapper, which torch's scheduler rejects: "
                               "TypeError \"... is not an Optimizer\")");
  }
}

}  // namespace dtrain::zero::config_parse
