// The lists in DeepSpeed's progress line (engine.get_lr() and get_mom(), DeepSpeed 0.19.8's
// runtime/engine.py) as Python prints them, from the config as given, the scheduler's position
// and the client optimizer:
//
//     lr_list_text(config, scheduler, 0.001)              == "[0.001]"
//     mom_list_text(config, scheduler, nullptr)           == "[(0.9, 0.999)]"   (Adam)
//
// Python keeps a value's type, so an integer the config wrote stays one wherever DeepSpeed puts
// the written value itself in the param group (and becomes a float wherever it computes one):
//   lr    no scheduler: the optimizer's "lr" as written (a client optimizer's is a float).
//         WarmupLR, WarmupDecayLR: warmup_min_lr as written before the first scheduler step,
//         computed after. OneCycle: cycle_min_lr as written before the first step, and after
//         the cycle when it does not decay (decay_step_size or decay_lr_rate 0). LRRangeTest:
//         lr_range_test_min_lr as written before the first step; after it an integer only
//         with lr_range_test_staircase and an integer min lr and step rate. WarmupCosineLR:
//         always computed.
//   mom   get_mom() reads "momentum" for SGD and RMSprop (torch's default is the integer 0)
//         and "betas" for any other optimizer (0.0 where the group has none: Adagrad, by
//         name or as a client, LBFGS). Betas the config gives are its list, [b1, b2]; not given,
//         the optimizer's default tuple. OneCycle with cycle_momentum sets the tuple (momentum,
//         0.99) on an optimizer with betas: cycle_min_mom as written before the first step,
//         cycle_max_mom as written after a cycle without decay, computed otherwise.
// A client optimizer (InitOptions::optimizer) is read by its C++ type, the Python class of the
// same name: its momentum of 0 prints as torch's default 0, its betas as a tuple.
// Pure functions; thread-safe.
#pragma once

#include <torch/torch.h>

#include <string>

#include "dtrain/zero.h"
#include "dtrain/zero_config.h"

namespace dtrain::zero::detail {

// "[lr]": `lr` is the rate the next update uses (scheduler.lr(), or the optimizer's own).
std::string lr_list_text(const Config& config, const LRScheduler& scheduler, double lr,
                         bool client_optimizer);
// "[momentum]" or "[betas]" for the config's optimizer (`client` null) or a client optimizer.
std::string mom_list_text(const Config& config, const LRScheduler& scheduler,
                          const torch::optim::Optimizer* client);

// Whether OneCycle's cycled momentum applies to the client optimizer (DeepSpeed cycles it only
// for an optimizer with betas: torch's Adam and AdamW here).
bool cycles_client_betas(const Config& config, const torch::optim::Optimizer& client);

}  // namespace dtrain::zero::detail
