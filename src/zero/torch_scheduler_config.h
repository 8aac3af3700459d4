// torch.optim.lr_scheduler's schedulers (and torch.optim's RMSprop) by name, the config side:
// which names DeepSpeed 0.19.8 resolves to torch's classes, and their constructor arguments
// read and checked as torch 2.11's constructors check them. No libtorch: part of dtrain_core,
// which the launcher (`dtrain zero check-config`) links. See torch_schedulers.h for the rest.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "dtrain/zero_config.h"

namespace dtrain::zero::detail {

// Whether DeepSpeed 0.19.8 resolves `name` to torch.optim.lr_scheduler's class: its own
// lr_schedules module is looked up first (so "OneCycle" is DeepSpeed's, "OneCycleLR" torch's).
bool is_torch_scheduler_name(const std::string& name);

// torch.optim.lr_scheduler's names that dtrain does not build, each with the reason (they take
// Python callables, other schedulers or a metric), or "" for a name that is not torch's.
std::string torch_scheduler_refusal(const std::string& name);

// Reads scheduler.params for torch's `sc.type` into sc.torch_params: every argument of torch
// 2.11's constructor, refused (ConfigError naming scheduler.params.KEY) where torch's refuses it
// or where torch would fail at its first steps (a division by zero). OneCycleLR with
// cycle_momentum on an optimizer with neither momentum nor betas (Adagrad) is refused, as torch
// refuses it. `params` null: none given.
void parse_torch_scheduler(const nlohmann::json* params, const OptimizerConfig& o,
                           SchedulerConfig& sc);

// The optimizer the engine builds for `o` under scheduler `sc`: torch's OneCycleLR with
// cycle_momentum sets "momentum" to max_momentum in its constructor (SGD, RMSprop), so their
// momentum state exists from the first step as in torch.
OptimizerConfig optimizer_under_scheduler(const OptimizerConfig& o, const SchedulerConfig& sc);

// Whether the optimizer DeepSpeed builds for `o` has "betas" in its param group (else
// "momentum", or neither for Adagrad).
bool optimizer_has_betas(const OptimizerConfig& o);

}  // namespace dtrain::zero::detail
