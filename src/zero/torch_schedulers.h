// torch.optim.lr_scheduler's schedulers as DeepSpeed 0.19.8 builds them by name
// (`"scheduler": {"type": "StepLR", "params": {...}}` calls
// torch.optim.lr_scheduler.StepLR(optimizer, **params)), torch 2.11's formulas:
//   StepLR, MultiStepLR, ConstantLR, LinearLR, ExponentialLR, PolynomialLR, CosineAnnealingLR
//       torch's recursive get_lr() on the group's current rate (what scheduler.step() applies;
//       not the closed forms), so the rates are bitwise torch's in double precision;
//   CosineAnnealingWarmRestarts   its own step(): T_cur, T_i, the rate from base_lr;
//   OneCycleLR   its phases (two, or three with three_phase), cos or linear annealing, and the
//       momentum it cycles: "momentum" (SGD, RMSprop) or beta1 of "betas" (the others).
// The arithmetic lives in LRScheduler (torch_schedulers.cpp: torch_update); this header is the
// checkpoint side (torch's state_dict()), torch_scheduler_config.h the config side.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <nlohmann/json.hpp>

#include <string>
#include <utility>
#include <vector>

#include "dtrain/zero.h"
#include "dtrain/zero_config.h"
#include "zero/torch_scheduler_config.h"

namespace dtrain::zero::detail {

// torch's lr_scheduler.state_dict() for the scheduler (the keys torch 2.11 saves, which
// DeepSpeed keeps as the model file's "lr_scheduler"; MultiStepLR's milestones Counter as a
// plain dict of counts). `use_beta1`: the optimizer's group has "betas" (OneCycleLR's key).
c10::impl::GenericDict torch_scheduler_state_dict(const SchedulerConfig& sc, const LRScheduler& s,
                                                  bool use_beta1);
// Resumes `s` from such a dict (torch's or dtrain's): last_epoch, _step_count, _last_lr and
// CosineAnnealingWarmRestarts' T_cur, T_i; OneCycleLR's momentum follows from last_epoch.
// Throws dtrain::Error naming `where` when a key is missing.
void load_torch_scheduler_state(const c10::impl::GenericDict& d, const SchedulerConfig& sc,
                                LRScheduler& s, const std::string& where);

// The keys torch's scheduler adds to the optimizer's param group (initial_lr; OneCycleLR's
// max_lr, min_lr, max_momentum, base_momentum), which its get_lr() reads after a checkpoint's
// group replaces the optimizer's.
std::vector<std::pair<std::string, double>> torch_scheduler_group_values(const SchedulerConfig& sc,
                                                                         const LRScheduler& s);

}  // namespace dtrain::zero::detail
