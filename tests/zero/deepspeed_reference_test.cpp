// dtrain's LR schedulers and optimizers against DeepSpeed 0.19.8's own classes (the venv's,
// on CPU), driven over the same steps: the learning rate and betas each update sees, and the
// parameters after each update. The peer (deepspeed_reference_peer.py) builds optimizer and
// scheduler with DeepSpeed's engine code from the same config; one Python process runs every
// case. dtrain's side runs the real engine (one rank) with a loss whose gradient is the given
// one. Lamb is not here: DeepSpeed 0.19.8's FusedLamb has no CPU kernel (its CPU accelerator
// maps it to NotImplementedBuilder).
// And configs (check_configs): each accepted or refused, and resolved, as DeepSpeed's
// DeepSpeedConfig and deepspeed.initialize (one rank, in the peer) do at each world size named.
#include <gtest/gtest.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "dtrain/zero.h"
#include "support/paths.h"
#include "support/peer_cache.h"
#include "support/thread_group.h"
#include "zero/config_text.h"
#include "zero/data_types.h"
#include "zero/torch_schedulers.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json adam(double lr, json extra = json::object()) {
  json p = {{"lr", lr}};
  p.merge_patch(extra);
  return {{"type", "Adam"}, {"params", p}};
}

json scheduler_case(const std::string& name, json optimizer, json scheduler, int steps = 16) {
  json config = {{"optimizer", optimizer}};
  if (!scheduler.is_null()) config["scheduler"] = scheduler;
  return {{"name", name}, {"kind", "scheduler"}, {"config", config}, {"steps", steps}};
}

// 37 elements (not a multiple of a SIMD width), 12 updates, gradients of mixed sign and size.
json optimizer_case(const std::string& name, json optimizer, json scheduler = nullptr) {
  const int n = 37, steps = 12;
  json init = json::array(), grads = json::array();
  for (int i = 0; i < n; ++i) init.push_back(std::sin(0.37 * i + 0.1) * (1 + i % 3));
  for (int s = 0; s < steps; ++s) {
    json g = json::array();
    for (int i = 0; i < n; ++i)
      g.push_back(std::cos(0.91 * i * (s + 1) + s) * (0.05 + 0.3 * (i % 5)));
    grads.push_back(g);
  }
  json config = {{"optimizer", optimizer}};
  if (!scheduler.is_null()) config["scheduler"] = scheduler;
  return {
      {"name", name}, {"kind", "optimizer"}, {"config", config}, {"init", init}, {"grads", grads}};
}

// fp16's dynamic loss scaler over `steps` updates whose overflow flags come from a fixed
// pseudo-random sequence (`seed`) with overflows at `rate`, then `burst` overflows in a row.
// At `stage` 0 DeepSpeed's FP16_Optimizer scales (no hysteresis, no stop at the minimum), at
// 1-3 its ZeRO optimizers' DynamicLossScaler.
json loss_scaler_case(const std::string& name, json fp16, uint32_t seed, double rate,
                      int steps = 60, int burst = 0, int stage = 1) {
  json flags = json::array();
  uint32_t x = seed;
  for (int k = 0; k < steps; ++k) {
    x = x * 1664525u + 1013904223u;
    flags.push_back((x >> 8) % 1000 < rate * 1000);
  }
  for (int k = 0; k < burst; ++k) flags.push_back(true);
  fp16["enabled"] = true;
  return {{"name", name},
          {"kind", "loss_scaler"},
          {"config", {{"fp16", fp16}, {"zero_optimization", {{"stage", stage}}}}},
          {"overflows", flags}};
}

json sched(const std::string& type, json params = json::object()) {
  return {{"type", type}, {"params", params}};
}

// A Linear-BatchNorm-Linear model under a 16-bit config's data_types: every buffer's dtype after
// the engine is built, and the losses of 3 training steps of the config's micro-batches each (or
// the error that stops the first).
// At stage 0 DeepSpeed's 16-bit optimizer first steps once on zero gradients (its state's step
// count runs one ahead; weight decay and dampened momentum see that step): the cases with
// AdamW's decay and SGD's dampening show dtrain does the same.
json buffers_case(const std::string& name, json config) {
  if (!config.contains("optimizer")) config["optimizer"] = adam(0.01);
  return {{"name", name}, {"kind", "buffers"}, {"config", config}};
}

// torch.optim.lr_scheduler's schedulers by name: (case name, [optimizer, scheduler]).
std::vector<std::pair<std::string, json>> torch_scheduler_cases() {
  const json sgd = {{"type", "SGD"}, {"params", {{"lr", 0.05}, {"momentum", 0.9}}}};
  const json rms = {{"type", "RMSprop"}, {"params", {{"lr", 0.02}}}};
  const json adagrad = {{"type", "Adagrad"}, {"params", {{"lr", 0.1}}}};
  std::vector<std::pair<std::string, json>> v = {
      {"StepLR step_size 3, gamma 0.5",
       {adam(0.01), sched("StepLR", {{"step_size", 3}, {"gamma", 0.5}})}},
      {"StepLR step_size 7 on SGD", {sgd, sched("StepLR", {{"step_size", 7}})}},
      {"MultiStepLR, a milestone twice",
       {adam(0.01), sched("MultiStepLR", {{"milestones", {5, 10, 10, 30}}, {"gamma", 0.3}})}},
      {"MultiStepLR unsorted on RMSprop", {rms, sched("MultiStepLR", {{"milestones", {20, 1}}})}},
      {"ExponentialLR gamma 0.95", {adam(0.01), sched("ExponentialLR", {{"gamma", 0.95}})}},
      {"ExponentialLR gamma 1.02 on SGD", {sgd, sched("ExponentialLR", {{"gamma", 1.02}})}},
      {"CosineAnnealingLR T_max 10, eta_min, past T_max",
       {adam(0.01), sched("CosineAnnealingLR", {{"T_max", 10}, {"eta_min", 1e-4}})}},
      {"CosineAnnealingLR T_max 49", {sgd, sched("CosineAnnealingLR", {{"T_max", 49}})}},
      {"CosineAnnealingLR T_max 1", {adam(0.003), sched("CosineAnnealingLR", {{"T_max", 1}})}},
      {"LinearLR defaults", {adam(0.01), sched("LinearLR")}},
      {"LinearLR 0.1 to 0.9 over 20",
       {sgd, sched("LinearLR", {{"start_factor", 0.1}, {"end_factor", 0.9}, {"total_iters", 20}})}},
      {"LinearLR 1 to 0 over 30",
       {rms, sched("LinearLR", {{"start_factor", 1.0}, {"end_factor", 0.0}, {"total_iters", 30}})}},
      {"ConstantLR defaults", {adam(0.01), sched("ConstantLR")}},
      {"ConstantLR factor 0.5 over 10",
       {sgd, sched("ConstantLR", {{"factor", 0.5}, {"total_iters", 10}})}},
      {"PolynomialLR defaults", {adam(0.01), sched("PolynomialLR")}},
      {"PolynomialLR power 2 over 40",
       {sgd, sched("PolynomialLR", {{"total_iters", 40}, {"power", 2.0}})}},
      {"PolynomialLR power 0.5 over 45",
       {rms, sched("PolynomialLR", {{"total_iters", 45}, {"power", 0.5}})}},
      {"CosineAnnealingWarmRestarts T_0 5 (restarts every 5)",
       {adam(0.01), sched("CosineAnnealingWarmRestarts", {{"T_0", 5}})}},
      {"CosineAnnealingWarmRestarts T_0 3, T_mult 2, eta_min",
       {sgd, sched("CosineAnnealingWarmRestarts", {{"T_0", 3}, {"T_mult", 2}, {"eta_min", 1e-3}})}},
      {"OneCycleLR on Adam (beta1 cycled)",
       {adam(0.01), sched("OneCycleLR", {{"max_lr", 0.1}, {"total_steps", 50}})}},
      {"OneCycleLR three_phase, linear, on SGD (momentum cycled)",
       {sgd, sched("OneCycleLR", {{"max_lr", 0.2},
                                  {"total_steps", 60},
                                  {"pct_start", 0.25},
                                  {"anneal_strategy", "linear"},
                                  {"three_phase", true}})}},
      {"OneCycleLR three_phase, cos, on Adam",
       {adam(0.01), sched("OneCycleLR", {{"max_lr", 0.05},
                                         {"total_steps", 50},
                                         {"three_phase", true},
                                         {"div_factor", 10.0},
                                         {"final_div_factor", 100.0},
                                         {"base_momentum", 0.8},
                                         {"max_momentum", 0.9}})}},
      {"OneCycleLR epochs, steps_per_epoch, on RMSprop",
       {rms, sched("OneCycleLR", {{"max_lr", 0.1}, {"epochs", 5}, {"steps_per_epoch", 11}})}},
      {"OneCycleLR without momentum on Adagrad",
       {adagrad,
        sched("OneCycleLR", {{"max_lr", 0.1}, {"total_steps", 55}, {"cycle_momentum", false}})}}};
  return v;
}

json build_cases() {
  const json sgd = {{"type", "SGD"}, {"params", {{"lr", 0.05}}}};
  json c = json::array();
  c.push_back(
      scheduler_case("WarmupLR log, max = optimizer lr", adam(0.01),
                     sched("WarmupLR", {{"warmup_min_lr", 1e-4}, {"warmup_num_steps", 10}})));
  c.push_back(scheduler_case("WarmupLR linear", adam(0.01),
                             sched("WarmupLR", {{"warmup_min_lr", 0},
                                                {"warmup_max_lr", 0.02},
                                                {"warmup_num_steps", 5},
                                                {"warmup_type", "linear"}})));
  c.push_back(scheduler_case("WarmupLR defaults", adam(0.003), sched("WarmupLR")));
  c.push_back(scheduler_case("WarmupLR one warm-up step", adam(0.01),
                             sched("WarmupLR", {{"warmup_num_steps", 1}})));
  c.push_back(scheduler_case(
      "WarmupDecayLR, max = its default 0.001", adam(0.01),
      sched("WarmupDecayLR",
            {{"total_num_steps", 12}, {"warmup_min_lr", 1e-4}, {"warmup_num_steps", 4}})));
  c.push_back(scheduler_case("WarmupDecayLR linear", adam(0.01),
                             sched("WarmupDecayLR", {{"total_num_steps", 10},
                                                     {"warmup_max_lr", 0.05},
                                                     {"warmup_num_steps", 3},
                                                     {"warmup_type", "linear"}})));
  c.push_back(
      scheduler_case("WarmupCosineLR past total_num_steps", adam(0.01),
                     sched("WarmupCosineLR", {{"total_num_steps", 12}, {"warmup_num_steps", 4}})));
  c.push_back(scheduler_case("WarmupCosineLR ratios, linear", adam(0.02),
                             sched("WarmupCosineLR", {{"total_num_steps", 10},
                                                      {"warmup_num_steps", 3},
                                                      {"warmup_min_ratio", 0.1},
                                                      {"cos_min_ratio", 0.01},
                                                      {"warmup_type", "linear"}})));
  c.push_back(scheduler_case(
      "OneCycle", adam(0.01),
      sched("OneCycle",
            {{"cycle_min_lr", 0.001}, {"cycle_max_lr", 0.01}, {"cycle_first_step_size", 3}})));
  c.push_back(scheduler_case("OneCycle asymmetric with decay", adam(0.01),
                             sched("OneCycle", {{"cycle_min_lr", 0.001},
                                                {"cycle_max_lr", 0.01},
                                                {"cycle_first_step_size", 3},
                                                {"cycle_second_step_size", 5},
                                                {"decay_step_size", 2},
                                                {"decay_lr_rate", 0.5},
                                                {"decay_mom_rate", 0.1},
                                                {"cycle_min_mom", 0.85},
                                                {"cycle_max_mom", 0.95}}),
                             20));
  c.push_back(scheduler_case("OneCycle stairs", adam(0.01),
                             sched("OneCycle", {{"cycle_min_lr", 0.001},
                                                {"cycle_max_lr", 0.01},
                                                {"cycle_first_step_size", 4},
                                                {"cycle_second_step_size", 6},
                                                {"cycle_first_stair_count", 2},
                                                {"cycle_second_stair_count", 3}}),
                             24));
  c.push_back(scheduler_case("OneCycle without momentum", adam(0.01),
                             sched("OneCycle", {{"cycle_min_lr", 0.001},
                                                {"cycle_max_lr", 0.01},
                                                {"cycle_first_step_size", 3},
                                                {"cycle_momentum", false}})));
  c.push_back(scheduler_case(
      "OneCycle on SGD", sgd,
      sched("OneCycle",
            {{"cycle_min_lr", 0.01}, {"cycle_max_lr", 0.1}, {"cycle_first_step_size", 5}})));
  c.push_back(scheduler_case("LRRangeTest defaults", adam(0.01), sched("LRRangeTest")));
  c.push_back(scheduler_case("LRRangeTest staircase", adam(0.01),
                             sched("LRRangeTest", {{"lr_range_test_min_lr", 0.002},
                                                   {"lr_range_test_step_size", 3},
                                                   {"lr_range_test_step_rate", 2.0},
                                                   {"lr_range_test_staircase", true}})));
  c.push_back(scheduler_case("WarmupLR on SGD", sgd, sched("WarmupLR", {{"warmup_num_steps", 6}})));
  // torch.optim.lr_scheduler's, which DeepSpeed builds by name: 50 updates each, compared
  // bitwise (torch's recursive formulas in double precision).
  for (const auto& [name, s] : torch_scheduler_cases()) {
    c.push_back(scheduler_case(name, s.at(0), s.at(1), 50));
    // Their state_dict() after 17 updates (a checkpoint's "lr_scheduler").
    json st = scheduler_case("state: " + name, s.at(0), s.at(1), 17);
    st["kind"] = "scheduler_state";
    c.push_back(st);
  }

  c.push_back(optimizer_case("Adam", adam(0.01)));
  c.push_back(optimizer_case("Adam + weight_decay: decoupled by default",
                             adam(0.01, {{"weight_decay", 0.1}})));
  c.push_back(optimizer_case("Adam + weight_decay, adam_w_mode false: L2",
                             adam(0.01, {{"weight_decay", 0.1}, {"adam_w_mode", false}})));
  c.push_back(
      optimizer_case("AdamW, adam_w_mode false: still decoupled",
                     {{"type", "AdamW"},
                      {"params", {{"lr", 0.01}, {"weight_decay", 0.1}, {"adam_w_mode", false}}}}));
  c.push_back(optimizer_case("Adam without bias correction",
                             adam(0.01, {{"bias_correction", false}, {"weight_decay", 0.01}})));
  c.push_back(
      optimizer_case("Adam betas, eps", adam(0.02, {{"betas", {0.8, 0.99}}, {"eps", 1e-6}})));
  c.push_back(optimizer_case("SGD", {{"type", "SGD"}, {"params", {{"lr", 0.1}}}}));
  c.push_back(optimizer_case(
      "SGD momentum, nesterov, weight decay",
      {{"type", "SGD"},
       {"params", {{"lr", 0.1}, {"momentum", 0.9}, {"nesterov", true}, {"weight_decay", 0.01}}}}));
  c.push_back(optimizer_case(
      "SGD momentum, dampening",
      {{"type", "SGD"}, {"params", {{"lr", 0.1}, {"momentum", 0.8}, {"dampening", 0.1}}}}));
  c.push_back(optimizer_case(
      "Adam + OneCycle (betas cycled, beta2 0.99)", adam(0.01),
      sched("OneCycle",
            {{"cycle_min_lr", 0.001}, {"cycle_max_lr", 0.02}, {"cycle_first_step_size", 4}})));
  c.push_back(
      optimizer_case("AdamW + WarmupCosineLR (the first update at lr 0)",
                     {{"type", "AdamW"}, {"params", {{"lr", 0.02}, {"weight_decay", 0.05}}}},
                     sched("WarmupCosineLR", {{"total_num_steps", 8}, {"warmup_num_steps", 3}})));
  c.push_back(
      optimizer_case("Adam + WarmupDecayLR", adam(0.01),
                     sched("WarmupDecayLR", {{"total_num_steps", 10}, {"warmup_num_steps", 4}})));
  // RMSprop by name: torch.optim.RMSprop (its single-tensor CPU step), and the optimizers under
  // torch's schedulers (OneCycleLR cycles "momentum" or beta1).
  c.push_back(optimizer_case("RMSprop defaults (lr 0.01)", {{"type", "RMSprop"}}));
  c.push_back(
      optimizer_case("RMSprop alpha, eps, momentum, weight_decay", {{"type", "RMSprop"},
                                                                    {"params",
                                                                     {{"lr", 0.01},
                                                                      {"alpha", 0.9},
                                                                      {"eps", 1e-6},
                                                                      {"momentum", 0.8},
                                                                      {"weight_decay", 0.01}}}}));
  c.push_back(optimizer_case(
      "RMSprop centered, momentum",
      {{"type", "RMSprop"},
       {"params", {{"lr", 0.005}, {"centered", true}, {"momentum", 0.5}, {"foreach", false}}}}));
  c.push_back(optimizer_case(
      "RMSprop centered", {{"type", "RMSprop"}, {"params", {{"lr", 0.005}, {"centered", true}}}}));
  c.push_back(optimizer_case(
      "RMSprop + OneCycleLR (momentum cycled from 0)", {{"type", "RMSprop"}},
      sched("OneCycleLR", {{"max_lr", 0.02}, {"total_steps", 12}, {"pct_start", 0.25}})));
  c.push_back(optimizer_case(
      "SGD + OneCycleLR three_phase (momentum cycled)",
      {{"type", "SGD"}, {"params", {{"lr", 0.1}, {"momentum", 0.5}}}},
      sched("OneCycleLR", {{"max_lr", 0.2}, {"total_steps", 12}, {"three_phase", true}})));
  c.push_back(optimizer_case("Adam + OneCycleLR (beta1 cycled, beta2 kept)",
                             adam(0.01, {{"betas", {0.9, 0.98}}}),
                             sched("OneCycleLR", {{"max_lr", 0.02}, {"total_steps", 12}})));
  c.push_back(optimizer_case("RMSprop + StepLR",
                             {{"type", "RMSprop"}, {"params", {{"lr", 0.01}, {"momentum", 0.9}}}},
                             sched("StepLR", {{"step_size", 4}, {"gamma", 0.5}})));
  c.push_back(
      optimizer_case("AdamW + CosineAnnealingWarmRestarts",
                     {{"type", "AdamW"}, {"params", {{"lr", 0.02}, {"weight_decay", 0.05}}}},
                     sched("CosineAnnealingWarmRestarts", {{"T_0", 4}})));
  // Adagrad by name: torch.optim.Adagrad, and with offload_optimizer DeepSpeedCPUAdagrad (the
  // peer builds the optimizer DeepSpeed's engine builds for the config).
  c.push_back(optimizer_case("adagrad in lower case, defaults (lr 0.01, eps 1e-10)",
                             {{"type", "adagrad"}}));
  c.push_back(optimizer_case("Adagrad lr_decay, weight_decay, initial_accumulator_value, eps",
                             {{"type", "Adagrad"},
                              {"params",
                               {{"lr", 0.1},
                                {"lr_decay", 0.05},
                                {"weight_decay", 0.1},
                                {"initial_accumulator_value", 0.5},
                                {"eps", 1e-6}}}}));
  c.push_back(
      optimizer_case("Adagrad + WarmupLR", {{"type", "Adagrad"}, {"params", {{"lr", 0.2}}}},
                     sched("WarmupLR", {{"warmup_min_lr", 0.01}, {"warmup_num_steps", 4}})));
  auto offloaded = [](json optimizer, int stage) {
    json o = {{"optimizer", std::move(optimizer)}};
    o["zero_optimization"] = {{"stage", stage}, {"offload_optimizer", {{"device", "cpu"}}}};
    return o;
  };
  // optimizer_case keeps "optimizer" and "scheduler" only: the offload section goes in after.
  for (auto [name, optimizer, stage] :
       {std::tuple<const char*, json, int>{"Adagrad, offload: DeepSpeedCPUAdagrad",
                                           {{"type", "Adagrad"}, {"params", {{"lr", 0.1}}}},
                                           1},
        {"Adagrad, offload, weight_decay, eps: DeepSpeedCPUAdagrad",
         {{"type", "Adagrad"}, {"params", {{"lr", 0.1}, {"weight_decay", 0.1}, {"eps", 1e-6}}}},
         2}}) {
    json cs = optimizer_case(name, optimizer);
    cs["config"] = offloaded(optimizer, stage);
    c.push_back(cs);
  }
  // Lion by name with offload_optimizer: DeepSpeedCPULion (a zero of the momentum's mix steps
  // down, as its sign mask makes it); OneCycle cycles its betas.
  const json lion = {{"type", "Lion"},
                     {"params", {{"lr", 0.01}, {"betas", {0.9, 0.99}}, {"weight_decay", 0.1}}}};
  for (auto [name, optimizer, scheduler] :
       {std::tuple<const char*, json, json>{
            "lion, offload: DeepSpeedCPULion, defaults", {{"type", "lion"}}, nullptr},
        {"Lion, offload, betas, weight_decay", lion, nullptr},
        {"Lion, offload + OneCycle (betas cycled)", lion,
         sched("OneCycle",
               {{"cycle_min_lr", 0.001}, {"cycle_max_lr", 0.02}, {"cycle_first_step_size", 4}})}}) {
    json cs = optimizer_case(name, optimizer, scheduler);
    cs["config"].update(offloaded(optimizer, 2));
    c.push_back(cs);
  }
  auto with_fp16 = [](json base, const json& changes) {
    base.update(changes);
    return base;
  };
  const json small = {{"initial_scale_power", 6},
                      {"loss_scale_window", 3},
                      {"hysteresis", 2},
                      {"min_loss_scale", 2}};
  c.push_back(loss_scaler_case("loss scale: window 3, hysteresis 2", small, 1, 0.25));
  c.push_back(loss_scaler_case("loss scale: consecutive hysteresis",
                               with_fp16(small, {{"consecutive_hysteresis", true}}), 2, 0.3));
  c.push_back(loss_scaler_case("loss scale: hysteresis 1, window 1",
                               with_fp16(small, {{"hysteresis", 1}, {"loss_scale_window", 1}}), 3,
                               0.4));
  c.push_back(loss_scaler_case("loss scale: hysteresis 0 never lowers",
                               with_fp16(small, {{"hysteresis", 0}}), 4, 0.5, 30, 10));
  c.push_back(
      loss_scaler_case("loss scale: overflows to the minimum, then stops", small, 5, 0.2, 20, 12));
  c.push_back(loss_scaler_case(
      "loss scale: minimum 1 from scale 2",
      with_fp16(small, {{"min_loss_scale", 1}, {"initial_scale_power", 1}}), 6, 0.35, 40, 8));
  c.push_back(loss_scaler_case(
      "loss scale: initial scale below the minimum",
      with_fp16(small, {{"initial_scale_power", 0}, {"min_loss_scale", 4}}), 7, 0.3, 30, 6));
  c.push_back(loss_scaler_case("loss scale: DeepSpeed's defaults", json::object(), 8, 0.01, 1200));
  c.push_back(loss_scaler_case("loss scale: static", {{"loss_scale", 128}}, 9, 0.5, 20, 5));
  // Stage 0 (the engine itself, overflows injected): DeepSpeed's FP16_Optimizer.
  c.push_back(
      loss_scaler_case("loss scale: stage 0, hysteresis 2 not used", small, 1, 0.25, 60, 0, 0));
  c.push_back(loss_scaler_case("loss scale: stage 0, consecutive hysteresis not used",
                               with_fp16(small, {{"consecutive_hysteresis", true}}), 2, 0.3, 60, 0,
                               0));
  c.push_back(
      loss_scaler_case("loss scale: stage 0, at the minimum it goes on", small, 5, 0.2, 20, 12, 0));
  c.push_back(
      loss_scaler_case("loss scale: stage 0, static", {{"loss_scale", 128}}, 9, 0.5, 20, 5, 0));
  c.push_back(loss_scaler_case(
      "loss scale: stage 0, initial scale below the minimum",
      with_fp16(small, {{"initial_scale_power", 0}, {"min_loss_scale", 4}}), 7, 0.3, 30, 6, 0));
  const json bf16 = {{"enabled", true}};
  auto zero = [](int stage) { return json{{"stage", stage}}; };
  c.push_back(buffers_case("buffers: bf16, stage 1, buffers as given",
                           {{"bf16", bf16}, {"zero_optimization", zero(1)}}));
  c.push_back(buffers_case("buffers: bf16, stage 1, buffer_dtype bf16",
                           {{"bf16", bf16},
                            {"zero_optimization", zero(1)},
                            {"data_types", {{"buffer_dtype", "bf16"}}}}));
  c.push_back(buffers_case("buffers: bf16, stage 0, buffer_dtype bf16",
                           {{"bf16", bf16}, {"data_types", {{"buffer_dtype", "bf16"}}}}));
  const json bf16_buffers = {{"buffer_dtype", "bf16"}};
  // Adagrad under bf16 at stage 1 (at stage 0 DeepSpeed fails to build it: check_configs), and
  // Lion through its CPU kernel on the fp32 master.
  c.push_back(
      buffers_case("buffers: bf16, stage 1, Adagrad lr_decay, weight_decay",
                   {{"bf16", bf16},
                    {"data_types", bf16_buffers},
                    {"zero_optimization", {{"stage", 1}}},
                    {"optimizer",
                     {{"type", "Adagrad"},
                      {"params", {{"lr", 0.05}, {"lr_decay", 0.5}, {"weight_decay", 0.1}}}}}}));
  c.push_back(buffers_case(
      "buffers: bf16, stage 2, Lion, offload",
      {{"bf16", bf16},
       {"data_types", bf16_buffers},
       {"zero_optimization", {{"stage", 2}, {"offload_optimizer", {{"device", "cpu"}}}}},
       {"optimizer", {{"type", "Lion"}, {"params", {{"lr", 0.01}, {"weight_decay", 0.1}}}}}}));
  c.push_back(buffers_case(
      "buffers: bf16, stage 0, AdamW weight_decay 0.1",
      {{"bf16", bf16},
       {"data_types", bf16_buffers},
       {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}, {"weight_decay", 0.1}}}}}}));
  c.push_back(buffers_case(
      "buffers: bf16, stage 0, SGD momentum, dampening",
      {{"bf16", bf16},
       {"data_types", bf16_buffers},
       {"optimizer",
        {{"type", "SGD"}, {"params", {{"lr", 0.1}, {"momentum", 0.9}, {"dampening", 0.5}}}}}}));
  c.push_back(buffers_case("buffers: bf16, stage 3, buffer_dtype bf16",
                           {{"bf16", bf16},
                            {"zero_optimization", zero(3)},
                            {"data_types", {{"buffer_dtype", "bf16"}}}}));
  c.push_back(buffers_case(
      "buffers: bf16, stage 2, bfloat16 but running_v* kept fp32",
      {{"bf16", bf16},
       {"zero_optimization", zero(2)},
       {"data_types", {{"buffer_dtype", "bfloat16"}, {"keep_in_fp32_modules", {"running_v*"}}}}}));
  // Micro-batches: with grad_accum_dtype fp32 DeepSpeed trains stage 1 by its BF16_Optimizer
  // (each micro-batch's bf16 gradient added into fp32); otherwise by its ZeRO optimizer.
  for (int stage : {1, 2, 3}) {
    for (const bool fp32_accum : {false, true}) {
      json types = bf16_buffers;
      if (fp32_accum) types["grad_accum_dtype"] = "fp32";
      c.push_back(buffers_case("buffers: bf16, stage " + std::to_string(stage) +
                                   ", 4 micro-batches" +
                                   (fp32_accum ? ", grad_accum_dtype fp32" : ""),
                               {{"bf16", bf16},
                                {"zero_optimization", zero(stage)},
                                {"gradient_accumulation_steps", 4},
                                {"gradient_clipping", 1e6},  // the norm, never a clip
                                {"data_types", types}}));
    }
  }
  // DeepSpeed reduces in communication_data_type (the model's bf16 unless set): even on one
  // rank the fp32 sum of the micro-batches is rounded to bf16 there, unless it says fp32.
  for (int stage : {1, 3}) {
    c.push_back(
        buffers_case("buffers: bf16, stage " + std::to_string(stage) +
                         ", 4 micro-batches, grad_accum_dtype and communication fp32",
                     {{"bf16", bf16},
                      {"zero_optimization", zero(stage)},
                      {"gradient_accumulation_steps", 4},
                      {"gradient_clipping", 1e6},
                      {"communication_data_type", "fp32"},
                      {"data_types", {{"buffer_dtype", "bf16"}, {"grad_accum_dtype", "fp32"}}}}));
  }
  c.push_back(buffers_case(
      "buffers: bf16, stage 2, offload, 4 micro-batches",
      {{"bf16", bf16},
       {"zero_optimization", {{"stage", 2}, {"offload_optimizer", {{"device", "cpu"}}}}},
       {"gradient_accumulation_steps", 4},
       {"gradient_clipping", 1e6},
       {"data_types", bf16_buffers}}));
  c.push_back(
      buffers_case("buffers: fp32, stage 1, buffer_dtype bf16 (not read)",
                   {{"zero_optimization", zero(1)}, {"data_types", {{"buffer_dtype", "bf16"}}}}));
  // An input of inf at the second step: where DeepSpeed skips the step (and the scheduler) and
  // where it applies the NaN update (fp32 at stage 0; stages 1-2 with the check turned off).
  const json warmup = {{"type", "WarmupLR"},
                       {"params", {{"warmup_min_lr", 0.001}, {"warmup_num_steps", 4}}}};
  auto nonfinite = [&](const std::string& name, json config) {
    config["scheduler"] = warmup;
    json cs = buffers_case("inf input: " + name, config);
    cs["bad_step"] = 1;
    return cs;
  };
  for (int stage : {0, 1, 2, 3}) {
    c.push_back(
        nonfinite("fp32, stage " + std::to_string(stage), {{"zero_optimization", zero(stage)}}));
    c.push_back(nonfinite(
        "bf16, stage " + std::to_string(stage),
        {{"bf16", bf16}, {"zero_optimization", zero(stage)}, {"data_types", bf16_buffers}}));
  }
  c.push_back(nonfinite("bf16, stage 2, check_grad_overflow false",
                        {{"bf16", {{"enabled", true}, {"check_grad_overflow", false}}},
                         {"zero_optimization", zero(2)},
                         {"data_types", bf16_buffers}}));
  c.push_back(nonfinite("bf16, stage 3, check_grad_overflow false",
                        {{"bf16", {{"enabled", true}, {"check_grad_overflow", false}}},
                         {"zero_optimization", zero(3)},
                         {"data_types", bf16_buffers}}));
  c.push_back(
      nonfinite("bf16, stage 1, grad_accum_dtype fp32, check_grad_overflow false",
                {{"bf16", {{"enabled", true}, {"check_grad_overflow", false}}},
                 {"zero_optimization", zero(1)},
                 {"data_types", {{"buffer_dtype", "bf16"}, {"grad_accum_dtype", "fp32"}}}}));
  c.push_back(nonfinite("fp32, stage 2, compute_grad_norm false",
                        {{"zero_optimization", {{"stage", 2}, {"compute_grad_norm", false}}},
                         {"gradient_clipping", 0}}));
  return c;
}

// The config corpus: DeepSpeed's own templates as pip installs them (the venv's
// deepspeed/autotuning/config_templates), this directory's configs/ (each written for one rule:
// Hugging Face-style "auto", deprecated aliases, documented sections, a duplicate key, a removed
// section, an unknown top-level key), and every *.json under $DTRAIN_DS_CONFIG_CORPUS when set
// (a folder of real configs from DeepSpeed's tests, DeepSpeedExamples and accelerate's
// templates, not kept in this repository).
std::vector<fs::path> corpus() {
  std::vector<fs::path> files;
  auto add_dir = [&](const fs::path& dir) {
    std::vector<fs::path> found;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".json") found.push_back(e.path());
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  };
  const fs::path venv_lib = fs::path(DTRAIN_VENV_PYTHON).parent_path().parent_path() / "lib";
  for (const auto& e : fs::directory_iterator(venv_lib)) {
    const auto templates =
        e.path() / "site-packages" / "deepspeed" / "autotuning" / "config_templates";
    if (fs::is_directory(templates)) add_dir(templates);
  }
  add_dir(fs::path(DTRAIN_SOURCE_DIR) / "tests" / "zero" / "configs");
  if (const char* extra = std::getenv("DTRAIN_DS_CONFIG_CORPUS")) add_dir(extra);
  return files;
}

// Configs written for one rule each (the batch triangle at several world sizes, fp16's values,
// bf16 and its old name, ZeRO's keys, the optimizer's and scheduler's types and params), each
// parsed by both at the world sizes given. Whether DeepSpeed accepts one, and what it resolves,
// comes from DeepSpeed itself in the peer; none is written down here.
json config_cases() {
  const json adam = {{"type", "Adam"}, {"params", {{"lr", 0.01}}}};
  const json batch = {{"train_batch_size", 8}};
  json c = json::array();
  auto add = [&](const std::string& name, json config, json worlds = {2}) {
    c.push_back({{"name", "config: " + name}, {"config", config}, {"worlds", worlds}});
  };
  auto with = [&](json base, const json& extra) {
    base.update(extra);
    return base;
  };
  // The batch triangle.
  const json worlds = {1, 2, 3, 4, 8};
  add("tbs + micro", {{"train_batch_size", 48}, {"train_micro_batch_size_per_gpu", 2}}, worlds);
  add("tbs + gas", {{"train_batch_size", 48}, {"gradient_accumulation_steps", 2}}, worlds);
  add("micro + gas", {{"train_micro_batch_size_per_gpu", 3}, {"gradient_accumulation_steps", 5}},
      worlds);
  add("tbs alone", {{"train_batch_size", 24}}, worlds);
  add("micro alone", {{"train_micro_batch_size_per_gpu", 4}}, worlds);
  add("all three",
      {{"train_batch_size", 32},
       {"train_micro_batch_size_per_gpu", 2},
       {"gradient_accumulation_steps", 4}},
      worlds);
  add("tbs smaller than the world", {{"train_batch_size", 2}}, worlds);
  add("gas alone", {{"gradient_accumulation_steps", 4}}, {1, 2});
  add("tbs written 32.0", {{"train_batch_size", 32.0}, {"train_micro_batch_size_per_gpu", 4}},
      {1, 4});
  add("micro 0", {{"train_micro_batch_size_per_gpu", 0}}, {1});
  add("tbs null", {{"train_batch_size", nullptr}, {"train_micro_batch_size_per_gpu", 2}}, {2});
  // timers (the throughput line): DeepSpeed reads timers.throughput through pydantic.
  auto timers = [&](const json& t) { return with(batch, {{"timers", t}}); };
  add("timers throughput off", timers({{"throughput", {{"enabled", false}}}}), {1});
  add("timers throughput enabled \"no\", synchronized 0",
      timers({{"throughput", {{"enabled", "no"}, {"synchronized", 0}}}}), {1});
  add("timers throughput unknown key", timers({{"throughput", {{"enable", false}}}}), {1});
  add("timers throughput enabled null", timers({{"throughput", {{"enabled", nullptr}}}}), {1});
  add("timers throughput null", timers({{"throughput", nullptr}}), {1});
  add("timers null", timers(nullptr), {1});
  add("timers other key", timers({{"wall", 1}}), {1});
  // fp16 and bf16.
  auto fp16 = [&](const json& f) { return with(batch, {{"fp16", f}}); };
  add("fp16 values", fp16({{"enabled", true},
                           {"loss_scale", 0},
                           {"initial_scale_power", 12},
                           {"loss_scale_window", 500},
                           {"hysteresis", 3},
                           {"consecutive_hysteresis", true},
                           {"min_loss_scale", 2}}));
  add("fp16 static scale", fp16({{"enabled", true}, {"loss_scale", 128}}));
  add("fp16 dynamic, min_loss_scale 0", fp16({{"enabled", true}, {"min_loss_scale", 0}}));
  add("fp16 min_loss_scale 0.5", fp16({{"enabled", true}, {"min_loss_scale", 0.5}}));
  add("fp16 off, loss_scale_window 0", fp16({{"enabled", false}, {"loss_scale_window", 0}}));
  add("fp16 static, loss_scale_window 0",
      fp16({{"enabled", true}, {"loss_scale", 64}, {"loss_scale_window", 0}}));
  add("fp16 initial_scale_power 70", fp16({{"enabled", true}, {"initial_scale_power", 70}}));
  add("fp16 hysteresis 0", fp16({{"enabled", true}, {"hysteresis", 0}}));
  add("fp16 loss_scale -1", fp16({{"enabled", true}, {"loss_scale", -1}}));
  add("fp16 as strings",
      fp16({{"enabled", "true"}, {"loss_scale", "128"}, {"initial_scale_power", "12"}}));
  add("fp16 enabled 1", fp16({{"enabled", 1}}));
  add("fp16 enabled \"sometimes\"", fp16({{"enabled", "sometimes"}}));
  add("fp16 enabled null", fp16({{"enabled", nullptr}}));
  add("fp16 auto values",
      fp16({{"enabled", true}, {"loss_scale", "auto"}, {"hysteresis", "auto"}}));
  add("fp16 null", fp16(nullptr));
  add("bf16 beside bfloat16",
      with(batch, {{"bf16", {{"enabled", false}}}, {"bfloat16", {{"enabled", true}}}}));
  add("bfloat16 alone", with(batch, {{"bfloat16", {{"enabled", true}}}}));
  add("fp16 and bf16", with(batch, {{"fp16", {{"enabled", true}}}, {"bf16", {{"enabled", true}}}}));
  add("bf16 optimizer states without master weights",
      with(batch, {{"bf16", {{"enabled", true}, {"bf16_optimizer_states", true}}},
                   {"zero_optimization", {{"stage", 2}}}}));
  add("fp16 master weights at stage 0",
      fp16({{"enabled", true}, {"fp16_master_weights_and_grads", true}}));
  // Gradient clipping.
  add("gradient_clipping 0", with(batch, {{"gradient_clipping", 0}}));
  add("gradient_clipping -1", with(batch, {{"gradient_clipping", -1}}));
  add("gradient_clipping absent", batch);
  // Unknown keys where DeepSpeed ignores them: accepted with a note, a near-miss refused as a typo.
  add("unknown top-level key cuda_visible_devices", with(batch, {{"cuda_visible_devices", 0}}));
  add("unknown key timers.wall", with(batch, {{"timers", {{"wall", {{"enabled", true}}}}}}));
  add("unknown key data_types.note", with(batch, {{"data_types", {{"note", "mine"}}}}));
  add("typo gradient_clipp1ng", with(batch, {{"gradient_clipp1ng", 1.0}}));
  add("unknown key in zero_optimization", with(batch, {{"zero_optimization", {{"cuda", 0}}}}));
  // ZeRO.
  auto zero = [&](const json& z) {
    return with(batch, {{"optimizer", adam}, {"zero_optimization", z}});
  };
  add("stage \"2\"", zero({{"stage", "2"}}));
  add("stage 2.0", zero({{"stage", 2.0}}));
  add("stage true", zero({{"stage", true}}));
  add("stage 4", zero({{"stage", 4}}));
  add("zero_optimization true", with(batch, {{"optimizer", adam}, {"zero_optimization", true}}));
  add("zero_optimization null", with(batch, {{"zero_optimization", nullptr}}));
  add("offload devices none", zero({{"stage", 3},
                                    {"offload_optimizer", {{"device", "none"}}},
                                    {"offload_param", {{"device", "none"}}}}));
  add("offload device CPU", zero({{"stage", 2}, {"offload_optimizer", {{"device", "CPU"}}}}));
  add("offload both, stage 3",
      zero({{"stage", 3},
            {"offload_optimizer", {{"device", "cpu"}, {"pin_memory", true}}},
            {"offload_param", {{"device", "cpu"}}}}));
  add("offload_param at stage 2",
      zero({{"stage", 2}, {"offload_param", {{"device", "cpu"}, {"pin_memory", "yes"}}}}));
  add("offload_optimizer at stage 0",
      zero({{"stage", 0}, {"offload_optimizer", {{"device", "cpu"}}}}));
  add("offload ratio 0.5 at stage 2",
      zero({{"stage", 2}, {"offload_optimizer", {{"device", "cpu"}, {"ratio", 0.5}}}}));
  add("cpu_offload false beside offload_optimizer",
      zero({{"stage", 2}, {"cpu_offload", false}, {"offload_optimizer", {{"device", "cpu"}}}}));
  add("cpu_offload_param", zero({{"stage", 3}, {"cpu_offload_param", true}}));
  add("cpu_offload, cpu_offload_use_pin_memory false",
      zero({{"stage", 2}, {"cpu_offload", true}, {"cpu_offload_use_pin_memory", false}}));
  add("offload pin_memory false",
      zero({{"stage", 3},
            {"offload_optimizer", {{"device", "cpu"}, {"pin_memory", false}}},
            {"offload_param", {{"device", "cpu"}, {"pin_memory", false}}}}));
  add("both names of a stage3 key", zero({{"stage", 3},
                                          {"model_persistence_threshold", 5},
                                          {"stage3_model_persistence_threshold", 6}}));
  add("compute_grad_norm false, stage 3", zero({{"stage", 3}, {"compute_grad_norm", false}}));
  add("compute_grad_norm false, clipping on", zero({{"stage", 2}, {"compute_grad_norm", false}}));
  add("compute_grad_norm false, no clipping",
      with(zero({{"stage", 2}, {"compute_grad_norm", false}}), {{"gradient_clipping", 0}}));
  add("zero_hpz_partition_size -1", zero({{"stage", 3}, {"zero_hpz_partition_size", -1}}));
  add("round_robin_gradients \"maybe\"", zero({{"stage", 2}, {"round_robin_gradients", "maybe"}}));
  add("reduce_bucket_size 5e8, overlap_comm \"auto\"",
      zero({{"stage", 2}, {"reduce_bucket_size", 5e8}, {"overlap_comm", "auto"}}));
  add("stage3 key null", zero({{"stage", 3}, {"stage3_max_live_parameters", nullptr}}));
  // data_types: each key where DeepSpeed's engine reads it (param_dtype always, buffer_dtype
  // and keep_in_fp32_modules under fp16/bf16, grad_accum_dtype when it builds an optimizer).
  auto types = [&](json extra, const json& data_types) {
    extra["data_types"] = data_types;
    return with(batch, extra);
  };
  const json bf16_on = {{"bf16", {{"enabled", true}}}};
  const json with_adam = {{"optimizer", adam}};
  auto with_stage = [&](json extra, int stage) {
    extra["zero_optimization"] = {{"stage", stage}};
    return extra;
  };
  add("data_types buffer bf16", types(bf16_on, {{"buffer_dtype", "bf16"}}));
  add("data_types buffer bf16 in fp32 training", types(json::object(), {{"buffer_dtype", "bf16"}}));
  add("data_types buffer xyz in fp32 training", types(json::object(), {{"buffer_dtype", "xyz"}}));
  add("data_types buffer xyz", types(bf16_on, {{"buffer_dtype", "xyz"}}));
  add("data_types buffer int8", types(bf16_on, {{"buffer_dtype", "int8"}}));
  add("data_types buffer 5", types(bf16_on, {{"buffer_dtype", 5}}));
  add("data_types buffer null", types(bf16_on, {{"buffer_dtype", nullptr}}));
  add("data_types param fp16 under bf16", types(bf16_on, {{"param_dtype", "fp16"}}));
  add("data_types param torch.bfloat16", types(bf16_on, {{"param_dtype", "torch.bfloat16"}}));
  add("data_types param xyz", types(json::object(), {{"param_dtype", "xyz"}}));
  add("data_types param float", types(json::object(), {{"param_dtype", "float"}}));
  add("data_types grad bf16, fp32 model, stage 0",
      types(json::object(), {{"grad_accum_dtype", "bf16"}}));
  add("data_types grad bf16, fp32 model, stage 0, Adam",
      types(with_adam, {{"grad_accum_dtype", "bf16"}}));
  add("data_types grad fp32, bf16 model, stage 0, Adam",
      types(with(bf16_on, with_adam), {{"grad_accum_dtype", "fp32"}}));
  for (int stage : {1, 2, 3})
    add("data_types grad fp32, bf16 model, stage " + std::to_string(stage),
        types(with_stage(with(bf16_on, with_adam), stage), {{"grad_accum_dtype", "fp32"}}));
  add("data_types grad fp32, bf16, stage 1, no grad norm",
      with(types(with(bf16_on, with_adam), {{"grad_accum_dtype", "fp32"}}),
           {{"gradient_clipping", 0},
            {"zero_optimization", {{"stage", 1}, {"compute_grad_norm", false}}}}));
  add("data_types grad xyz, Adam", types(with_adam, {{"grad_accum_dtype", "xyz"}}));
  add("data_types keep a string", types(bf16_on, {{"keep_in_fp32_modules", "running"}}));
  add("data_types keep a list", types(bf16_on, {{"keep_in_fp32_modules", {"running*"}}}));
  add("data_types keep auto", types(bf16_on, {{"keep_in_fp32_modules", "auto"}}));
  add("data_types keep a number in the list",
      types(json::object(), {{"keep_in_fp32_modules", {1}}}));
  add("data_types keep null", types(bf16_on, {{"keep_in_fp32_modules", nullptr}}));
  add("data_types keep an unbalanced pattern", types(bf16_on, {{"keep_in_fp32_modules", {"a("}}}));
  add("data_types unknown key", types(json::object(), {{"bufer_dtype", "bf16"}}));
  // communication_data_type: DeepSpeed's three names in any case, null its default.
  for (const json& v : {json("fp32"), json("BF16"), json("fp16"), json(nullptr), json("float32"),
                        json("auto"), json(16)})
    add("communication_data_type " + v.dump(), with(batch, {{"communication_data_type", v}}));
  add("data_types null", types(json::object(), nullptr));
  add("data_types a list", types(json::object(), json::array()));
  // Optimizers.
  auto opt = [&](const json& o) { return with(batch, {{"optimizer", o}}); };
  add("Adam, all params", opt({{"type", "Adam"},
                               {"params",
                                {{"lr", 3e-4},
                                 {"betas", {0.8, 0.95}},
                                 {"eps", 1e-6},
                                 {"weight_decay", 0.1},
                                 {"bias_correction", false}}}}));
  add("Adam, adam_w_mode false", opt({{"type", "Adam"}, {"params", {{"adam_w_mode", false}}}}));
  add("ADAMW in capitals", opt({{"type", "ADAMW"}, {"params", {{"weight_decay", 0.01}}}}));
  add("Adam without params", opt({{"type", "Adam"}}));
  add("Adam set_grad_none", opt({{"type", "Adam"}, {"params", {{"set_grad_none", true}}}}));
  add("Adam set_grad_none, offload",
      with(opt({{"type", "Adam"}, {"params", {{"set_grad_none", true}}}}),
           {{"zero_optimization", {{"stage", 2}, {"offload_optimizer", {{"device", "cpu"}}}}}}));
  add("Adam foreach", opt({{"type", "Adam"}, {"params", {{"foreach", true}}}}));
  add("Adam torch_adam foreach",
      opt({{"type", "AdamW"}, {"params", {{"torch_adam", true}, {"foreach", false}}}}));
  add("Adam torch_adam bias_correction",
      opt({{"type", "Adam"}, {"params", {{"torch_adam", true}, {"bias_correction", false}}}}));
  add("Adam torch_adam, adam_w_mode false",
      opt({{"type", "Adam"},
           {"params", {{"torch_adam", true}, {"adam_w_mode", false}, {"weight_decay", 0.1}}}}));
  add("Adam unknown param", opt({{"type", "Adam"}, {"params", {{"lr", 0.1}, {"foo", 1}}}}));
  add("Adam max_grad_norm", opt({{"type", "Adam"}, {"params", {{"max_grad_norm", 1.0}}}}));
  add("sgd in lower case", opt({{"type", "sgd"}, {"params", {{"lr", 0.1}}}}));
  add("SGD eps", opt({{"type", "SGD"}, {"params", {{"lr", 0.1}, {"eps", 1e-8}}}}));
  add("SGD momentum, nesterov",
      opt({{"type", "SGD"}, {"params", {{"lr", 0.1}, {"momentum", 0.9}, {"nesterov", true}}}}));
  add("SGD nesterov without momentum",
      opt({{"type", "SGD"}, {"params", {{"lr", 0.1}, {"nesterov", true}}}}));
  add("SGD under ZeRO", with(opt({{"type", "SGD"}, {"params", {{"lr", 0.1}}}}),
                             {{"zero_optimization", {{"stage", 2}}}}));
  add("SGD under ZeRO, untested allowed",
      with(opt({{"type", "SGD"}, {"params", {{"lr", 0.1}}}}),
           {{"zero_optimization", {{"stage", 2}}}, {"zero_allow_untested_optimizer", true}}));
  add("RMSprop", opt({{"type", "RMSprop"}, {"params", {{"lr", 0.1}}}}));
  add("RMSprop, all params", opt({{"type", "RMSprop"},
                                  {"params",
                                   {{"lr", 0.01},
                                    {"alpha", 0.9},
                                    {"eps", 1e-6},
                                    {"weight_decay", 0.01},
                                    {"momentum", 0.5},
                                    {"centered", true},
                                    {"foreach", false},
                                    {"capturable", false},
                                    {"differentiable", false}}}}));
  add("RMSprop without params", opt({{"type", "RMSprop"}}));
  add("rmsprop in lower case", opt({{"type", "rmsprop"}}));
  add("RMSprop negative alpha", opt({{"type", "RMSprop"}, {"params", {{"alpha", -0.5}}}}));
  add("RMSprop negative momentum", opt({{"type", "RMSprop"}, {"params", {{"momentum", -0.1}}}}));
  add("RMSprop betas", opt({{"type", "RMSprop"}, {"params", {{"betas", {0.9, 0.99}}}}}));
  add("RMSprop under ZeRO", with(opt({{"type", "RMSprop"}, {"params", {{"lr", 0.01}}}}),
                                 {{"zero_optimization", {{"stage", 2}}}}));
  add("RMSprop under ZeRO, untested allowed",
      with(opt({{"type", "RMSprop"}, {"params", {{"lr", 0.01}}}}),
           {{"zero_optimization", {{"stage", 2}}}, {"zero_allow_untested_optimizer", true}}));
  add("Adamax (libtorch has none)", opt({{"type", "Adamax"}, {"params", {{"lr", 0.01}}}}));
  // Adagrad: torch.optim.Adagrad, or DeepSpeedCPUAdagrad with offload_optimizer (a ZeRO-tested
  // optimizer: no zero_allow_untested_optimizer needed).
  const json offload_cpu = {{"device", "cpu"}};
  add("Adagrad",
      opt({{"type", "Adagrad"},
           {"params", {{"lr", 0.1}, {"lr_decay", 0.01}, {"initial_accumulator_value", 1}}}}));
  add("ADAGRAD in capitals, defaults", opt({{"type", "ADAGRAD"}}));
  add("Adagrad under ZeRO", with(opt({{"type", "Adagrad"}, {"params", {{"lr", 0.1}}}}),
                                 {{"zero_optimization", {{"stage", 3}}}}));
  add("Adagrad, offload",
      with(opt({{"type", "Adagrad"}, {"params", {{"lr", 0.1}, {"eps", 1e-8}, {"amsgrad", true}}}}),
           {{"zero_optimization", {{"stage", 2}, {"offload_optimizer", offload_cpu}}}}));
  add("Adagrad lr_decay, offload",
      with(opt({{"type", "Adagrad"}, {"params", {{"lr_decay", 0.1}}}}),
           {{"zero_optimization", {{"stage", 1}, {"offload_optimizer", offload_cpu}}}}));
  add("Adagrad initial_accumulator_value, offload",
      with(opt({{"type", "Adagrad"}, {"params", {{"initial_accumulator_value", 0.1}}}}),
           {{"zero_optimization", {{"stage", 3}, {"offload_optimizer", offload_cpu}}}}));
  add("Adagrad amsgrad without offload",
      opt({{"type", "Adagrad"}, {"params", {{"amsgrad", false}}}}));
  add("Adagrad offload at stage 0",
      with(opt({{"type", "Adagrad"}}),
           {{"zero_optimization", {{"stage", 0}, {"offload_optimizer", offload_cpu}}}}));
  add("Adagrad betas", opt({{"type", "Adagrad"}, {"params", {{"betas", {0.9, 0.99}}}}}));
  add("Adagrad lr auto", opt({{"type", "Adagrad"}, {"params", {{"lr", "auto"}}}}));
  add("Adagrad bf16 at stage 0", with(opt({{"type", "Adagrad"}}), {{"bf16", {{"enabled", true}}}}));
  add("Adagrad bf16 at stage 1",
      with(opt({{"type", "Adagrad"}}),
           {{"bf16", {{"enabled", true}}}, {"zero_optimization", {{"stage", 1}}}}));
  // Lion: DeepSpeedCPULion with offload_optimizer; FusedLion without it (a CUDA kernel in
  // DeepSpeed, whose build here has none: "platform"; dtrain runs its update as tensor ops).
  add("Lion, offload",
      with(opt({{"type", "lion"}, {"params", {{"lr", 1e-4}, {"betas", {0.95, 0.98}}}}}),
           {{"zero_optimization", {{"stage", 3}, {"offload_optimizer", offload_cpu}}}}));
  add("Lion without offload",
      with(opt({{"type", "Lion"}}), {{"zero_optimization", {{"stage", 2}}}}));
  add("Lion eps, offload",
      with(opt({{"type", "Lion"}, {"params", {{"eps", 1e-8}}}}),
           {{"zero_optimization", {{"stage", 1}, {"offload_optimizer", offload_cpu}}}}));
  add("OneBitAdam", opt({{"type", "OneBitAdam"}, {"params", {{"lr", 0.1}}}}));
  add("optimizer without type", opt({{"params", {{"lr", 0.1}}}}));
  // Schedulers.
  auto sch = [&](const std::string& type, const json& params) {
    json s = {{"type", type}};
    if (!params.is_null()) s["params"] = params;
    return with(batch, {{"optimizer", adam}, {"scheduler", s}});
  };
  add("WarmupLR defaults", sch("WarmupLR", json::object()));
  add("WarmupLR without params", sch("WarmupLR", nullptr));
  add("warmuplr in lower case", sch("warmuplr", json::object()));
  add("WarmupLR warmup_type Linear", sch("WarmupLR", {{"warmup_type", "Linear"}}));
  add("WarmupLR warmup_num_steps 1e3", sch("WarmupLR", {{"warmup_num_steps", 1e3}}));
  add("WarmupLR warmup_num_steps 1",
      sch("WarmupLR", {{"warmup_num_steps", 1}, {"warmup_max_lr", 0.05}}));
  add("WarmupLR total_num_steps", sch("WarmupLR", {{"total_num_steps", 100}}));
  add("WarmupDecayLR defaults", sch("WarmupDecayLR", {{"total_num_steps", 20}}));
  add("WarmupDecayLR total_num_steps 1e4",
      sch("WarmupDecayLR", {{"total_num_steps", 1e4}, {"warmup_num_steps", 3}}));
  add("WarmupCosineLR", sch("WarmupCosineLR", {{"total_num_steps", 10},
                                               {"warmup_num_steps", 2},
                                               {"warmup_min_ratio", 0.1},
                                               {"warmup_type", "linear"}}));
  add("WarmupCosineLR warmup_max_lr",
      sch("WarmupCosineLR", {{"total_num_steps", 10}, {"warmup_max_lr", 0.1}}));
  add("OneCycle", sch("OneCycle", {{"cycle_min_lr", 0.001},
                                   {"cycle_max_lr", 0.01},
                                   {"cycle_first_step_size", 2},
                                   {"cycle_second_step_size", 3}}));
  add("OneCycle without cycle_max_lr", sch("OneCycle", {{"cycle_min_lr", 0.001}}));
  add("LRRangeTest", sch("LRRangeTest", {{"lr_range_test_step_size", 2},
                                         {"lr_range_test_step_rate", 0.5},
                                         {"lr_range_test_staircase", true}}));
  add("LRRangeTest step size 2e3", sch("LRRangeTest", {{"lr_range_test_step_size", 2e3}}));
  add("StepLR", sch("StepLR", {{"step_size", 2}}));
  // torch.optim.lr_scheduler's by name: DeepSpeed looks its own lr_schedules up first, then
  // torch's; torch's constructor refuses what it refuses.
  add("StepLR gamma", sch("StepLR", {{"step_size", 1}, {"gamma", 0.5}}));
  add("StepLR without step_size", sch("StepLR", json::object()));
  add("StepLR unknown param", sch("StepLR", {{"step_size", 2}, {"step", 2}}));
  add("StepLR last_epoch 3", sch("StepLR", {{"step_size", 2}, {"last_epoch", 3}}));
  add("StepLR without params", sch("StepLR", nullptr));
  add("StepLR under ZeRO",
      with(sch("StepLR", {{"step_size", 2}}), {{"zero_optimization", {{"stage", 2}}}}));
  add("ExponentialLR under bf16",
      with(sch("ExponentialLR", {{"gamma", 0.9}}), {{"bf16", {{"enabled", true}}}}));
  add("MultiStepLR", sch("MultiStepLR", {{"milestones", {1, 3, 3}}, {"gamma", 0.5}}));
  add("ExponentialLR", sch("ExponentialLR", {{"gamma", 0.9}}));
  add("ExponentialLR without gamma", sch("ExponentialLR", json::object()));
  add("CosineAnnealingLR", sch("CosineAnnealingLR", {{"T_max", 3}, {"eta_min", 1e-5}}));
  add("LinearLR defaults", sch("LinearLR", json::object()));
  add("LinearLR start_factor 0", sch("LinearLR", {{"start_factor", 0}}));
  add("LinearLR end_factor 1.5", sch("LinearLR", {{"end_factor", 1.5}}));
  add("ConstantLR factor 0.5", sch("ConstantLR", {{"factor", 0.5}, {"total_iters", 2}}));
  add("ConstantLR factor 2", sch("ConstantLR", {{"factor", 2}}));
  add("PolynomialLR", sch("PolynomialLR", {{"total_iters", 4}, {"power", 2.0}}));
  add("CosineAnnealingWarmRestarts",
      sch("CosineAnnealingWarmRestarts", {{"T_0", 2}, {"T_mult", 2}}));
  add("CosineAnnealingWarmRestarts T_0 0", sch("CosineAnnealingWarmRestarts", {{"T_0", 0}}));
  add("CosineAnnealingWarmRestarts T_0 2.0", sch("CosineAnnealingWarmRestarts", {{"T_0", 2.0}}));
  add("CosineAnnealingWarmRestarts T_mult 0",
      sch("CosineAnnealingWarmRestarts", {{"T_0", 2}, {"T_mult", 0}}));
  add("OneCycleLR", sch("OneCycleLR", {{"max_lr", 0.01}, {"total_steps", 100}}));
  add("OneCycleLR epochs",
      sch("OneCycleLR", {{"max_lr", 0.01}, {"epochs", 2}, {"steps_per_epoch", 5}}));
  add("OneCycleLR without total_steps", sch("OneCycleLR", {{"max_lr", 0.01}}));
  add("OneCycleLR pct_start 1 (an int)",
      sch("OneCycleLR", {{"max_lr", 0.01}, {"total_steps", 10}, {"pct_start", 1}}));
  add("OneCycleLR anneal_strategy exp",
      sch("OneCycleLR", {{"max_lr", 0.01}, {"total_steps", 10}, {"anneal_strategy", "exp"}}));
  add("OneCycleLR on Adagrad", with(sch("OneCycleLR", {{"max_lr", 0.01}, {"total_steps", 10}}),
                                    {{"optimizer", {{"type", "Adagrad"}}}}));
  add("OneCycleLR on Adagrad without momentum",
      with(sch("OneCycleLR", {{"max_lr", 0.01}, {"total_steps", 10}, {"cycle_momentum", false}}),
           {{"optimizer", {{"type", "Adagrad"}}}}));
  add("OneCycleLR a phase of length 0 at step 0",
      sch("OneCycleLR", {{"max_lr", 0.01}, {"total_steps", 10}, {"pct_start", 0.1}}));
  add("LambdaLR", sch("LambdaLR", json::object()));
  add("ReduceLROnPlateau", sch("ReduceLROnPlateau", json::object()));
  add("CyclicLR", sch("CyclicLR", {{"base_lr", 0.001}, {"max_lr", 0.01}}));
  add("scheduler without type",
      with(batch, {{"optimizer", adam}, {"scheduler", {{"params", {{"warmup_num_steps", 5}}}}}}));
  add("scheduler without optimizer",
      with(batch, {{"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 4}}}}}}));
  return c;
}

const json& scaler_cases();

// Config text as DeepSpeed reads a config file (hjson 3.1's decoder): numbers written with a
// fraction or exponent become ints only when integral and below 1e10 in magnitude; a comma after a
// value before a closing bracket is dropped, one with no value before it ("[,]") refused.
json hjson_cases() {
  const std::vector<std::string> texts = {
      R"({"a": 1e3, "b": 100.0, "c": -0.0, "d": 1.5, "e": 1e-3})",
      R"({"a": 9999999999.0, "b": -9999999999e0, "c": 1e10, "d": -1e10, "e": 2.5e12})",
      R"({"a": 1e18, "b": 12345678901234, "c": 1E2, "d": 5e8})",
      R"({"a": [1,], "b": {"c": 1,},})",
      "{\"a\": [1, // a comment\n], /* a block */ \"b\": {\"c\": [], # another\n},\n}",
      R"({"a": [,]})",
      R"({"a": {,}})",
      R"({"a": [1,,]})",
      R"({,"a": 1})",
      R"({"a": [ /* nothing */ , ]})",
      "{\"a\": [\n,\n]}",
      R"({"a": 1, "a": 2})"};
  json c = json::array();
  for (size_t i = 0; i < texts.size(); ++i)
    c.push_back({{"name", "hjson " + std::to_string(i)}, {"kind", "hjson"}, {"text", texts[i]}});
  return c;
}

// Whether a config's optimizer is one of `types` (lower case) by name, in any case.
bool by_name(const json& config, const std::vector<std::string>& types) {
  if (!config.contains("optimizer")) return false;
  std::string type = config.at("optimizer").value("type", "");
  for (auto& ch : type) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return std::find(types.begin(), types.end(), type) != types.end();
}

// The progress line (steps_per_print, log_level) and the throughput line after it:
// deepspeed.initialize on one rank trains a few steps and the peer keeps the lines DeepSpeed's
// logger emits; dtrain's engine trains the same steps and its stdout is kept. A case with
// "client" passes that optimizer in code (torch.optim.<type> there, torch::optim's here)
// instead of the config's.
json progress_cases() {
  const json adam = {{"type", "Adam"}, {"params", {{"lr", 0.001}}}};
  json c = json::array();
  auto add = [&](const std::string& name, json config, int steps, json bad_steps = json::array(),
                 json client = nullptr) {
    if (!config.contains("optimizer") && client.is_null()) config["optimizer"] = adam;
    if (!config.contains("train_batch_size")) config["train_batch_size"] = 2;
    json cs = {{"name", "progress: " + name},
               {"kind", "progress"},
               {"config", config},
               {"steps", steps},
               {"bad_steps", bad_steps}};
    if (!client.is_null()) cs["client"] = client;
    c.push_back(cs);
  };
  const json every2 = {{"steps_per_print", 2}, {"log_level", "info"}};
  const json every1 = {{"steps_per_print", 1}, {"log_level", "info"}};
  auto with = [](json base, const json& extra) {
    base.update(extra);
    return base;
  };
  // Client optimizers: get_mom() reads the param group's momentum or betas.
  add("client Adam, every 2", every2, 6, json::array(), {{"type", "Adam"}, {"lr", 0.5}});
  add("client AdamW betas (0.8, 0.99)", every2, 4, json::array(),
      {{"type", "AdamW"}, {"lr", 0.5}, {"betas", {0.8, 0.99}}});
  add("client SGD", every2, 4, json::array(), {{"type", "SGD"}, {"lr", 0.5}});
  add("client SGD momentum 0.9", every2, 4, json::array(),
      {{"type", "SGD"}, {"lr", 0.5}, {"momentum", 0.9}});
  add("client RMSprop", every2, 4, json::array(), {{"type", "RMSprop"}, {"lr", 0.01}});
  // Adagrad makes its state in its constructor (dtrain makes it again for the partition).
  add("client Adagrad", every2, 4, json::array(), {{"type", "Adagrad"}, {"lr", 0.01}});
  add("client Adagrad, stage 2", with(every1, {{"zero_optimization", {{"stage", 2}}}}), 3,
      json::array(), {{"type", "Adagrad"}, {"lr", 0.01}});
  add("client Adam, stage 2, WarmupLR warmup_min_lr 0",
      with(every1,
           {{"zero_optimization", {{"stage", 2}}},
            {"scheduler",
             {{"type", "WarmupLR"}, {"params", {{"warmup_min_lr", 0}, {"warmup_num_steps", 3}}}}}}),
      4, json::array(), {{"type", "Adam"}, {"lr", 0.5}});
  add("client Adam, OneCycle's momentum",
      with(every2,
           {{"scheduler",
             {{"type", "OneCycle"},
              {"params",
               {{"cycle_min_lr", 0.001}, {"cycle_max_lr", 0.01}, {"cycle_first_step_size", 2}}}}}}),
      6, json::array(), {{"type", "Adam"}, {"lr", 0.5}});
  // torch.optim.lr_scheduler's by name (stage 0, fp32: where DeepSpeed builds them): the rate
  // it sets, and OneCycleLR's momentum in "momentum" (SGD, RMSprop) or "betas" (a tuple).
  const json one_cycle_lr = {{"type", "OneCycleLR"},
                             {"params", {{"max_lr", 0.1}, {"total_steps", 10}}}};
  add("RMSprop by name", with(every1, {{"optimizer", {{"type", "RMSprop"}}}}), 3);
  add("RMSprop by name + OneCycleLR",
      with(every1, {{"optimizer", {{"type", "RMSprop"}}}, {"scheduler", one_cycle_lr}}), 4);
  add("Adam + StepLR",
      with(every1, {{"scheduler", {{"type", "StepLR"}, {"params", {{"step_size", 2}}}}}}), 4);
  add("Adam + OneCycleLR", with(every2, {{"scheduler", one_cycle_lr}}), 6);
  add("client SGD momentum 0.9 + OneCycleLR", with(every1, {{"scheduler", one_cycle_lr}}), 4,
      json::array(), {{"type", "SGD"}, {"lr", 0.5}, {"momentum", 0.9}});
  add("client AdamW + OneCycleLR (beta2 kept)", with(every1, {{"scheduler", one_cycle_lr}}), 4,
      json::array(), {{"type", "AdamW"}, {"lr", 0.5}, {"betas", {0.8, 0.99}}});
  add("client SGD, OneCycle (no betas: not cycled)",
      with(every2,
           {{"scheduler",
             {{"type", "OneCycle"},
              {"params",
               {{"cycle_min_lr", 0.001}, {"cycle_max_lr", 0.01}, {"cycle_first_step_size", 2}}}}}}),
      4, json::array(), {{"type", "SGD"}, {"lr", 0.5}, {"momentum", 0.9}});
  // Adagrad by name at every stage, with and without offload_optimizer (DeepSpeedCPUAdagrad,
  // stages 1-3; at stage 0 dtrain refuses the offload, check_configs).
  const json adagrad = {{"type", "Adagrad"},
                        {"params",
                         {{"lr", 0.05},
                          {"lr_decay", 0.1},
                          {"weight_decay", 0.01},
                          {"initial_accumulator_value", 0.1}}}};
  const json cpu_adagrad = {{"type", "Adagrad"},
                            {"params", {{"lr", 0.05}, {"weight_decay", 0.01}, {"eps", 1e-8}}}};
  for (int stage = 0; stage <= 3; ++stage) {
    add("Adagrad by name, stage " + std::to_string(stage),
        with(every2, {{"optimizer", adagrad}, {"zero_optimization", {{"stage", stage}}}}), 5);
    if (stage > 0)
      add("Adagrad by name, offload, stage " + std::to_string(stage),
          with(every2, {{"optimizer", cpu_adagrad},
                        {"zero_optimization",
                         {{"stage", stage}, {"offload_optimizer", {{"device", "cpu"}}}}}}),
          5);
  }
  // Without clipping (whose scaling rounds apart from DeepSpeed's by an ulp in some steps) the
  // parameters are DeepSpeed's bit for bit.
  for (int stage = 0; stage <= 3; ++stage) {
    json zero = {{"stage", stage}};
    add("Adagrad by name, stage " + std::to_string(stage) + ", no clipping (bitwise)",
        with(every2,
             {{"optimizer", adagrad}, {"gradient_clipping", 0}, {"zero_optimization", zero}}),
        5);
    if (stage == 0) continue;
    zero["offload_optimizer"] = {{"device", "cpu"}};
    add("Adagrad by name, offload, stage " + std::to_string(stage) + ", no clipping (bitwise)",
        with(every2,
             {{"optimizer", cpu_adagrad}, {"gradient_clipping", 0}, {"zero_optimization", zero}}),
        5);
  }
  // Lion by name (DeepSpeedCPULion: offload_optimizer only) at stages 1-3.
  const json lion = {{"type", "Lion"},
                     {"params", {{"lr", 0.01}, {"betas", {0.9, 0.99}}, {"weight_decay", 0.1}}}};
  for (int stage = 1; stage <= 3; ++stage) {
    const json zero = {{"stage", stage}, {"offload_optimizer", {{"device", "cpu"}}}};
    add("Lion by name, offload, stage " + std::to_string(stage),
        with(every2, {{"optimizer", lion}, {"zero_optimization", zero}}), 5);
    add("Lion by name, offload, stage " + std::to_string(stage) + ", no clipping (bitwise)",
        with(every2, {{"optimizer", lion}, {"gradient_clipping", 0}, {"zero_optimization", zero}}),
        5);
  }
  add("lion by name, defaults, OneCycle (betas cycled)",
      with(every1,
           {{"optimizer", {{"type", "lion"}}},
            {"zero_optimization", {{"stage", 2}, {"offload_optimizer", {{"device", "cpu"}}}}},
            {"scheduler",
             {{"type", "OneCycle"},
              {"params",
               {{"cycle_min_lr", 0.001}, {"cycle_max_lr", 0.01}, {"cycle_first_step_size", 2}}}}}}),
      4);
  add("adagrad by name, defaults, OneCycle (no betas to cycle)",
      with(every1,
           {{"optimizer", {{"type", "adagrad"}}},
            {"zero_optimization", {{"stage", 1}}},
            {"scheduler",
             {{"type", "OneCycle"},
              {"params",
               {{"cycle_min_lr", 0.001}, {"cycle_max_lr", 0.01}, {"cycle_first_step_size", 2}}}}}}),
      4);
  // The client and Adagrad cases compare the parameters after the steps too (weights both sides
  // set).
  for (auto& cs : c) {
    if (cs.contains("client") || by_name(cs.at("config"), {"adagrad", "lion"})) cs["final"] = true;
    if (cs.at("name").get<std::string>().find("(bitwise)") != std::string::npos) cs["exact"] = true;
  }
  // Integers the config writes, kept by DeepSpeed where it puts them into the param group as
  // they are, at every step.
  add("WarmupLR warmup_min_lr 0 (an int), every step",
      with(every1,
           {{"scheduler",
             {{"type", "WarmupLR"}, {"params", {{"warmup_min_lr", 0}, {"warmup_num_steps", 3}}}}}}),
      5);
  add("WarmupDecayLR warmup_min_lr 0, linear, every step",
      with(every1, {{"scheduler",
                     {{"type", "WarmupDecayLR"},
                      {"params",
                       {{"warmup_min_lr", 0},
                        {"warmup_max_lr", 1},
                        {"warmup_num_steps", 2},
                        {"total_num_steps", 4},
                        {"warmup_type", "linear"}}}}}}),
      6);
  add("WarmupLR warmup_min_lr 0, the first step skipped, stage 1",
      with(every1,
           {{"zero_optimization", {{"stage", 1}}},
            {"scheduler",
             {{"type", "WarmupLR"}, {"params", {{"warmup_min_lr", 0}, {"warmup_num_steps", 3}}}}}}),
      3, {0});
  add("LRRangeTest, staircase, integers",
      with(every1, {{"scheduler",
                     {{"type", "LRRangeTest"},
                      {"params",
                       {{"lr_range_test_min_lr", 1},
                        {"lr_range_test_step_size", 2},
                        {"lr_range_test_step_rate", 1},
                        {"lr_range_test_staircase", true}}}}}}),
      5);
  add("LRRangeTest, integers, not staircase",
      with(every1, {{"scheduler",
                     {{"type", "LRRangeTest"},
                      {"params",
                       {{"lr_range_test_min_lr", 1},
                        {"lr_range_test_step_size", 2},
                        {"lr_range_test_step_rate", 1}}}}}}),
      3);
  add("OneCycle, integers, past the cycle",
      with(every1, {{"scheduler",
                     {{"type", "OneCycle"},
                      {"params",
                       {{"cycle_min_lr", 0},
                        {"cycle_max_lr", 1},
                        {"cycle_first_step_size", 1},
                        {"cycle_min_mom", 0},
                        {"cycle_max_mom", 1}}}}}}),
      5);
  add("OneCycle, integers, decaying",
      with(every1, {{"scheduler",
                     {{"type", "OneCycle"},
                      {"params",
                       {{"cycle_min_lr", 1},
                        {"cycle_max_lr", 2},
                        {"cycle_first_step_size", 1},
                        {"decay_step_size", 1},
                        {"decay_lr_rate", 1},
                        {"decay_mom_rate", 1},
                        {"cycle_min_mom", 0},
                        {"cycle_max_mom", 1}}}}}}),
      4);
  // The throughput line's cadence.
  add("timers throughput off, every step",
      with(every1, {{"timers", {{"throughput", {{"enabled", false}}}}}}), 4);
  add("timers throughput not synchronized, every 3",
      {{"steps_per_print", 3},
       {"log_level", "info"},
       {"timers", {{"throughput", {{"synchronized", false}}}}}},
      7);
  add("Adam, every 2 steps, info", {{"steps_per_print", 2}, {"log_level", "info"}}, 5);
  add("AdamW betas given, WarmupLR, every 3, INFO",
      {{"steps_per_print", 3},
       {"log_level", "INFO"},
       {"optimizer",
        {{"type", "AdamW"}, {"params", {{"lr", 0.01}, {"betas", {0.8, 0.99}}, {"eps", 1e-6}}}}},
       {"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 4}}}}}},
      7);
  add("SGD lr 1 (an int), momentum 0.9, every step, debug",
      {{"steps_per_print", 1},
       {"log_level", "debug"},
       {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 1}, {"momentum", 0.9}}}}}},
      3);
  add("SGD without momentum, every 2",
      {{"steps_per_print", 2},
       {"log_level", "info"},
       {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.1}}}}}},
      4);
  add("OneCycle's momentum, every 2",
      {{"steps_per_print", 2},
       {"log_level", "info"},
       {"scheduler",
        {{"type", "OneCycle"},
         {"params",
          {{"cycle_min_lr", 0.001}, {"cycle_max_lr", 0.01}, {"cycle_first_step_size", 2}}}}}},
      6);
  add("every 3, log_level not given", {{"steps_per_print", 3}}, 6);
  add("every 3, log_level warning", {{"steps_per_print", 3}, {"log_level", "warning"}}, 6);
  add("steps_per_print not given, info", {{"log_level", "info"}}, 4);
  add("steps_per_print null, info", {{"steps_per_print", nullptr}, {"log_level", "info"}}, 4);
  add("steps_per_print -2", {{"steps_per_print", -2}, {"log_level", "info"}}, 5);
  add("steps_per_print 2.5", {{"steps_per_print", 2.5}, {"log_level", "info"}}, 6);
  add("steps_per_print true", {{"steps_per_print", true}, {"log_level", "info"}}, 2);
  add("steps_per_print 0", {{"steps_per_print", 0}, {"log_level", "info"}}, 2);
  add("steps_per_print false", {{"steps_per_print", false}}, 2);
  add("steps_per_print \"2\"", {{"steps_per_print", "2"}, {"log_level", "info"}}, 2);
  add("steps_per_print [2]", {{"steps_per_print", json::array({2})}}, 2);
  add("log_level verbose", {{"log_level", "verbose"}}, 1);
  add("log_level 20", {{"log_level", 20}}, 1);
  add("accumulation 2, every 2",
      {{"steps_per_print", 2},
       {"log_level", "info"},
       {"train_batch_size", 4},
       {"gradient_accumulation_steps", 2}},
      8);
  add("stage 2, every 2",
      {{"steps_per_print", 2}, {"log_level", "info"}, {"zero_optimization", {{"stage", 2}}}}, 4);
  add("stage 3 (units fetched per child), every 2",
      {{"steps_per_print", 2}, {"log_level", "info"}, {"zero_optimization", {{"stage", 3}}}}, 6);
  add("stage 1, a skipped step, every step",
      {{"steps_per_print", 1}, {"log_level", "info"}, {"zero_optimization", {{"stage", 1}}}}, 4,
      {1});
  return c;
}

// load_checkpoint(load_module_strict, load_module_only) of a 4-3-2 chain's checkpoint into a
// chain of other widths: one layer more (its own values stay), one fewer (the saved one is
// left), the same; at stages 0-2 fp32, stage 1 bf16; and the refusals (strict with other keys,
// not module-only with other keys, stage 3).
json module_strict_cases() {
  json c = json::array();
  auto add = [&](const std::string& what, int stage, json widths, bool strict, bool module_only,
                 bool bf16 = false) {
    json config = {{"optimizer", {{"type", "Adam"}, {"params", {{"lr", 0.01}}}}},
                   {"zero_optimization", {{"stage", stage}}}};
    if (bf16) config["bf16"] = {{"enabled", true}};
    c.push_back({{"name", "module_strict: " + what + ", stage " + std::to_string(stage) +
                              (bf16 ? ", bf16" : "") + (strict ? ", strict" : ", not strict") +
                              (module_only ? ", module only" : "")},
                 {"kind", "module_strict"},
                 {"config", config},
                 {"widths", widths},
                 {"strict", strict},
                 {"module_only", module_only}});
  };
  const json extra = {4, 3, 2, 2}, fewer = {4, 3}, same = {4, 3, 2};
  for (int stage = 0; stage <= 2; ++stage) {
    add("a layer more", stage, extra, false, true);
    add("a layer fewer", stage, fewer, false, true);
  }
  add("a layer more", 1, extra, false, true, true);
  add("the same layers", 1, same, false, false);
  add("a layer more", 1, extra, true, true);
  add("a layer fewer", 0, fewer, true, false);
  add("a layer more", 1, extra, false, false);
  add("a layer more", 3, extra, false, true);
  add("a layer fewer", 3, fewer, false, true);
  return c;
}

json all_cases() {
  json c = build_cases();
  for (const auto& cs : module_strict_cases()) c.push_back(cs);
  for (const auto& cs : hjson_cases()) c.push_back(cs);
  for (const auto& cs : progress_cases()) c.push_back(cs);
  for (const auto& cs : scaler_cases()) c.push_back(cs);
  for (const auto& cs : config_cases())
    c.push_back({{"name", cs.at("name")},
                 {"kind", "config"},
                 {"config", cs.at("config")},
                 {"world_sizes", cs.at("worlds")}});
  for (const auto& f : corpus())
    c.push_back({{"name", f.string()},
                 {"kind", "config"},
                 {"path", f.string()},
                 {"world_sizes", {1, 2, 3, 4, 8}}});
  return c;
}

// CASES through one DeepSpeed process (importing DeepSpeed is the slow part), their results by
// name into OUT, or OUT["failure"]. With `keep`, the cases' results depend on them and the
// peer's script only, so the run is kept for the suite's second build (support/peer_cache.h).
void run_peer(const json& cases, const std::string& tag, bool keep, json* out) {
  const fs::path dir =
      fs::temp_directory_path() / ("dtrain-ds-ref-" + tag + "-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  { std::ofstream(dir / "cases.json") << cases.dump(); }
  const std::string script =
      std::string(DTRAIN_SOURCE_DIR) + "/tests/zero/deepspeed_reference_peer.py";
  const std::string cmd = std::string(DTRAIN_VENV_PYTHON) + " " + script + " " +
                          (dir / "cases.json").string() + " " + (dir / "ds.json").string() + " 2>" +
                          (dir / "peer.err").string();
  int rc = 0;
  const auto run = [&] {
    rc = std::system(cmd.c_str());
    if (rc != 0) fs::remove(dir / "ds.json");  // never kept
  };
  if (keep)
    dtrain::test::cached_peer_run(cases.dump() + dtrain::test::file_text(script), dir, {"ds.json"},
                                  run);
  else
    run();
  if (rc != 0) {
    std::ifstream e(dir / "peer.err");
    (*out)["failure"] = "the DeepSpeed peer failed: " + cmd + "\n" +
                        std::string(std::istreambuf_iterator<char>(e), {}) +
                        "(is deepspeed installed in the venv? scripts/requirements.txt)";
  } else {
    std::ifstream in(dir / "ds.json");
    const json ds = json::parse(in);
    for (size_t i = 0; i < cases.size() && i < ds.size(); ++i)
      (*out)[cases[i].at("name").get<std::string>()] = ds[i];
  }
  fs::remove_all(dir);
}

// Every case's DeepSpeed result by name. The scaler objects are read from files dtrain wrote (its
// results depend on this build): a second process, never kept.
const json& peer_results() {
  static const json results = [] {
    json fixed = json::array(), reads_dtrain = json::array();
    for (const auto& c : all_cases())
      (c.at("kind") == "scaler_object" ? reads_dtrain : fixed).push_back(c);
    json out = json::object();
    run_peer(fixed, "fixed", /*keep=*/true, &out);
    if (!out.contains("failure")) run_peer(reads_dtrain, "dtrain", /*keep=*/false, &out);
    return out;
  }();
  return results;
}

dtrain::zero::Config parse(const json& config) {
  json c = config;
  c["train_micro_batch_size_per_gpu"] = 1;
  // The peer steps DeepSpeed's optimizer itself, without the engine's clipping (1.0 by default).
  c["gradient_clipping"] = 0.0;
  return dtrain::zero::parse_config(c, 1);
}

struct OneParam : torch::nn::Module {
  explicit OneParam(const torch::Tensor& init) { w = register_parameter("w", init.clone()); }
  torch::Tensor w;
};

// Stage 0: the engine's own scaler (one rank), an overflow injected where the flags say.
json run_stage0_loss_scaler(const json& cs) {
  json with_optimizer = cs.at("config");
  with_optimizer["optimizer"] = adam(0.01);
  const auto config = parse(with_optimizer);
  json out = json::array();
  dtrain::test::run_ranks(1, [&](std::shared_ptr<dtrain::ProcessGroup> pg) {
    auto model = std::make_shared<OneParam>(torch::linspace(-1, 1, 7));
    dtrain::zero::Engine<std::shared_ptr<OneParam>> engine(model, config, {pg});
    for (const auto& overflow : cs.at("overflows")) {
      if (overflow.get<bool>()) engine.core().inject_overflow();
      engine.backward((model->w * model->w).sum());
      try {
        engine.step();
      } catch (const dtrain::Error&) {
        out.push_back("raise");
        break;
      }
      out.push_back(engine.loss_scale());
    }
  });
  return out;
}

json run_loss_scaler(const json& cs) {
  if (cs.at("config").at("zero_optimization").at("stage") == 0) return run_stage0_loss_scaler(cs);
  dtrain::zero::LossScaler scaler(parse(cs.at("config")).fp16);
  json out = json::array();
  for (const auto& overflow : cs.at("overflows")) {
    try {
      scaler.update(overflow.get<bool>());
    } catch (const dtrain::Error&) {
      out.push_back("raise");
      break;
    }
    out.push_back(scaler.scale());
  }
  return out;
}

// The momentum in the optimizer's group ("momentum": SGD, RMSprop; 0 for the others).
double group_momentum(const dtrain::zero::Config& c, const dtrain::zero::LRScheduler& s) {
  if (dtrain::zero::detail::optimizer_has_betas(c.optimizer) || c.optimizer.type == "Adagrad")
    return 0.0;
  if (c.scheduler.type == "OneCycleLR" && s.cycles_momentum()) return s.momentum();
  return c.optimizer.momentum;
}

bool same_types(const json& a, const json& b);

json run_scheduler(const json& cs) {
  auto c = parse(cs.at("config"));
  const bool has_betas = dtrain::zero::detail::optimizer_has_betas(c.optimizer);
  dtrain::zero::LRScheduler s(c.scheduler, c.optimizer.lr, c.optimizer.beta1, c.optimizer.beta2);
  json out = json::array();
  for (int k = 0; k < cs.at("steps").get<int>(); ++k) {
    auto [b1, b2] = s.betas();
    out.push_back({s.lr(), has_betas ? b1 : 0.0, has_betas ? b2 : 0.0, group_momentum(c, s)});
    s.step();
  }
  return out;
}

// An IValue of a scheduler's state_dict() as the peer writes it in JSON (dict keys as str).
json to_json(const c10::IValue& v) {
  if (v.isInt()) return v.toInt();
  if (v.isDouble()) return v.toDouble();
  if (v.isBool()) return v.toBool();
  if (v.isString()) return v.toStringRef();
  if (v.isList()) {
    json out = json::array();
    for (const auto& e : v.toListRef()) out.push_back(to_json(e));
    return out;
  }
  if (v.isGenericDict()) {
    json out = json::object();
    for (const auto& e : v.toGenericDict())
      out[e.key().isString() ? e.key().toStringRef() : std::to_string(e.key().toInt())] =
          to_json(e.value());
    return out;
  }
  return nullptr;
}

// dtrain's state_dict() of the case's scheduler after its steps, the group keys torch's
// scheduler keeps, and the rates of a scheduler resumed from that state against those of the
// uninterrupted one (which must be equal).
json run_scheduler_state(const json& cs) {
  auto c = parse(cs.at("config"));
  dtrain::zero::LRScheduler s(c.scheduler, c.optimizer.lr, c.optimizer.beta1, c.optimizer.beta2);
  for (int k = 0; k < cs.at("steps").get<int>(); ++k) s.step();
  const bool betas = dtrain::zero::detail::optimizer_has_betas(c.optimizer);
  json out = {
      {"state", to_json(dtrain::zero::detail::torch_scheduler_state_dict(c.scheduler, s, betas))}};
  json group = {{"lr", s.lr()}};
  for (const auto& [key, value] :
       dtrain::zero::detail::torch_scheduler_group_values(c.scheduler, s))
    group[key] = value;
  if (c.scheduler.type == "OneCycleLR" && s.cycles_momentum()) {
    if (betas)
      group["betas"] = {s.betas().first, s.betas().second};
    else
      group["momentum"] = s.momentum();
  }
  out["group"] = group;
  // A fresh scheduler (its constructor's step taken) resumed from the state: the next 10 rates.
  dtrain::zero::LRScheduler resumed(c.scheduler, c.optimizer.lr, c.optimizer.beta1,
                                    c.optimizer.beta2);
  dtrain::zero::detail::load_torch_scheduler_state(
      dtrain::zero::detail::torch_scheduler_state_dict(c.scheduler, s, betas), c.scheduler, resumed,
      "state");
  json a = json::array(), b = json::array();
  for (int k = 0; k < 10; ++k) {
    a.push_back({s.lr(), s.momentum()});
    b.push_back({resumed.lr(), resumed.momentum()});
    if (c.scheduler.type == "OneCycleLR" &&
        s.last_batch_iteration() + 1 >= c.scheduler.torch_params.total_steps)
      break;
    s.step();
    resumed.step();
  }
  out["uninterrupted"] = a;
  out["resumed"] = b;
  return out;
}

json run_optimizer(const json& cs) {
  json out = json::array();
  dtrain::test::run_ranks(1, [&](std::shared_ptr<dtrain::ProcessGroup> pg) {
    auto init = torch::tensor(cs.at("init").get<std::vector<float>>());
    auto model = std::make_shared<OneParam>(init);
    auto engine =
        dtrain::zero::Engine<std::shared_ptr<OneParam>>(model, parse(cs.at("config")), {pg});
    for (const auto& g : cs.at("grads")) {
      auto grad = torch::tensor(g.get<std::vector<float>>());
      engine.backward((model->w * grad).sum());  // d/dw = grad
      engine.step();
      auto w = model->w.detach().contiguous();
      out.push_back(std::vector<float>(w.data_ptr<float>(), w.data_ptr<float>() + w.numel()));
    }
  });
  return out;
}

std::string dtype_name(torch::ScalarType t) {  // as the peer writes torch's dtypes
  switch (t) {
    case torch::kBFloat16:
      return "bfloat16";
    case torch::kHalf:
      return "float16";
    case torch::kFloat:
      return "float32";
    case torch::kDouble:
      return "float64";
    case torch::kLong:
      return "int64";
    default:
      return c10::toString(t);
  }
}

json run_buffers(const json& cs) {
  json out;
  dtrain::test::run_ranks(1, [&](std::shared_ptr<dtrain::ProcessGroup> pg) {
    torch::nn::Sequential model(torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3),
                                torch::nn::Linear(3, 2));
    {
      torch::NoGradGuard no_grad;  // the peer's values (libtorch's Linear initialises differently)
      int k = 0;
      for (auto& p : model->parameters())
        p.copy_((torch::sin(torch::arange(p.numel(), torch::kFloat32) * 0.37 + k++) * 0.5)
                    .view(p.sizes()));
    }
    json config = cs.at("config");
    config["train_micro_batch_size_per_gpu"] = 8;
    const int micro = config.value("gradient_accumulation_steps", 1);
    config["gradient_accumulation_steps"] = micro;
    dtrain::zero::Engine<torch::nn::Sequential> engine(model, dtrain::zero::parse_config(config, 1),
                                                       {pg});
    torch::manual_seed(0);
    json buffers = json::object();
    for (const auto& b : model->named_buffers(true))
      buffers[b.key()] = dtype_name(b.value().scalar_type());
    std::set<std::string> params;
    for (const auto& p : model->parameters()) params.insert(dtype_name(p.scalar_type()));
    out["buffers"] = buffers;
    out["parameters"] = params;
    json losses = json::array(), norms = json::array(), applied = json::array();
    try {
      for (int step = 0; step < 3 * micro; ++step) {
        auto x = torch::randn({8, 4}).to(model->parameters()[0].scalar_type());
        if (step == cs.value("bad_step", -1)) x.index_put_({0, 0}, INFINITY);
        auto loss = engine.forward(x).to(torch::kFloat).pow(2).mean();
        engine.backward(loss);
        engine.step();
        applied.push_back(engine.was_step_applied());
        const double l = loss.item<double>();
        losses.push_back(std::isfinite(l) ? json(l) : json(nullptr));
        if ((step + 1) % micro == 0) {  // get_global_grad_norm() after each optimizer step
          const auto norm = engine.get_global_grad_norm();
          // As the peer writes them: null for None, "inf" and "nan" as Python's str().
          norms.push_back(!norm                  ? json(nullptr)
                          : std::isfinite(*norm) ? json(*norm)
                                                 : json(std::isnan(*norm) ? "nan" : "inf"));
        }
      }
      out["step"] = "ok";
    } catch (const std::exception& e) {
      const std::string what = e.what();
      out["step"] = what.substr(0, what.find('\n'));
    }
    out["losses"] = losses;
    out["norms"] = norms;
    out["applied"] = applied;
    if (cs.contains("bad_step")) {
      out["skipped"] = engine.core().skipped_steps();
      out["lr"] = engine.core().lr();
    }
  });
  return out;
}

// SaveCheckpointOptions::deepspeed_loss_scaler: dtrain's engine (one rank, stage 1) saves after
// a few steps (one of them an overflow) with DeepSpeed's loss scaler object; the peer loads the
// file with torch.load and compares the object with the one DeepSpeed's CreateLossScaler makes
// for the same fp16 section, then updates it as DeepSpeed's optimizer does.
const fs::path& scaler_dir() {
  static const fs::path dir =
      fs::temp_directory_path() / ("dtrain-ds-scaler-" + std::to_string(::getpid()));
  return dir;
}

const json& scaler_cases() {
  static const json cases = [] {
    json out = json::array();
    auto add = [&](const std::string& name, const json& fp16, bool overflow) {
      json config = {{"train_micro_batch_size_per_gpu", 1},
                     {"optimizer", adam(0.01)},
                     {"zero_optimization", {{"stage", 1}}}};
      if (!fp16.is_null()) config["fp16"] = fp16;
      const fs::path dir = scaler_dir() / std::to_string(out.size());
      // The updates the engine's scaler goes through, on dtrain's own LossScaler class.
      const auto parsed = dtrain::zero::parse_config(config, 1);
      dtrain::zero::LossScaler replica(parsed.fp16);
      for (int step = 0; step < 4; ++step) replica.update(overflow && step == 2);
      const std::vector<double> state = replica.state();
      dtrain::test::run_ranks(1, [&](std::shared_ptr<dtrain::ProcessGroup> pg) {
        auto model = std::make_shared<OneParam>(torch::linspace(-1, 1, 7));
        dtrain::zero::Engine<std::shared_ptr<OneParam>> engine(model, parsed, {pg});
        for (int step = 0; step < 4; ++step) {
          if (overflow && step == 2) engine.core().inject_overflow();
          engine.backward((model->w * model->w).sum());
          engine.step();
        }
        if (parsed.fp16.enabled) {
          EXPECT_EQ(engine.loss_scale(), replica.scale());
        }
        engine.save_checkpoint(dir.string(), "t", {.deepspeed_loss_scaler = true});
      });
      out.push_back({{"name", "scaler object: " + name},
                     {"kind", "scaler_object"},
                     {"config", config},
                     {"path", (dir / "t" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").string()},
                     {"state", state}});
    };
    add("fp16 dynamic, after an overflow",
        {{"enabled", true},
         {"initial_scale_power", 8},
         {"hysteresis", 2},
         {"loss_scale_window", 4},
         {"min_loss_scale", 2},
         {"consecutive_hysteresis", true}},
        true);
    add("fp16 static 128", {{"enabled", true}, {"loss_scale", 128}}, false);
    add("fp32", nullptr, false);
    return out;
  }();
  return cases;
}

void check_scaler_objects(const json& peer) {
  for (const auto& cs : scaler_cases()) {
    const std::string name = cs.at("name");
    SCOPED_TRACE(name);
    ASSERT_TRUE(peer.contains(name));
    const json& ds = peer.at(name);
    ASSERT_FALSE(ds.contains("error")) << ds.at("error");
    EXPECT_EQ(ds.at("type"), ds.at("fresh_type"));
    EXPECT_EQ(ds.at("keys"), ds.at("fresh_keys"));
    // What the run changed is dtrain's scaler state; everything else is the config's, as
    // DeepSpeed makes it.
    const std::vector<double> state = cs.at("state");
    const json& v = ds.at("values");
    const bool dynamic = ds.at("type").get<std::string>().find("Dynamic") != std::string::npos;
    for (auto it = v.begin(); it != v.end(); ++it) {
      const std::string key = it.key();
      if (key == "cur_scale" && (dynamic || cs.at("config").contains("fp16")))
        EXPECT_EQ(it->get<double>(), state[0]);
      else if (key == "cur_iter" && dynamic)
        EXPECT_EQ(it->get<double>(), state[1]);
      else if (key == "last_overflow_iter" && dynamic)
        EXPECT_EQ(it->get<double>(), state[2]);
      else if (key == "cur_hysteresis" && dynamic)
        EXPECT_EQ(it->get<double>(), state[3]);
      else
        EXPECT_EQ(*it, ds.at("fresh_values").at(key)) << key;
    }
    EXPECT_EQ(ds.at("update"), "ok") << "DeepSpeed's update_scale on dtrain's object";
    std::printf("  %-50s %s, as DeepSpeed's CreateLossScaler makes it\n", name.c_str(),
                ds.at("type").get<std::string>().c_str());
  }
  fs::remove_all(scaler_dir());
}

void check_steps(const json& peer) {
  const json cases = build_cases();
  int schedulers = 0, optimizers = 0, scalers = 0, buffer_cases = 0, torch_schedulers = 0,
      states = 0;
  for (const auto& cs : cases) {
    const std::string name = cs.at("name");
    SCOPED_TRACE(name);
    ASSERT_TRUE(peer.contains(name));
    const json& ds = peer.at(name);
    if (cs.at("kind") == "buffers") {
      const json ours = run_buffers(cs);
      EXPECT_EQ(ours.at("buffers"), ds.at("buffers")) << "dtypes after the engine is built";
      EXPECT_EQ(ours.at("parameters"), ds.at("parameters"));
      const std::string theirs = ds.at("step");
      if (theirs == "ok") {
        EXPECT_EQ(ours.at("step"), "ok");
      } else {  // the same libtorch refusal, "RuntimeError: " in Python
        EXPECT_NE(theirs.find(ours.at("step").get<std::string>()), std::string::npos)
            << "dtrain: " << ours.at("step") << "\nDeepSpeed: " << theirs;
      }
      ASSERT_EQ(ours.at("losses").size(), ds.at("losses").size());
      double worst = 0;
      for (size_t k = 0; k < ours.at("losses").size(); ++k) {
        // inf or NaN (null): the same on both sides.
        if (ours.at("losses")[k].is_null() || ds.at("losses")[k].is_null()) {
          EXPECT_EQ(ours.at("losses")[k].is_null(), ds.at("losses")[k].is_null())
              << "step " << k + 1 << ": ours " << ours.at("losses").dump() << "\nDeepSpeed "
              << ds.at("losses").dump();
          continue;
        }
        const double a = ours.at("losses")[k], b = ds.at("losses")[k];
        worst = std::max(worst, std::fabs(a - b));
        // The same operations in the same order: equal (bf16 too) against the peer's torch 2.x,
        // up to a few ulps. libtorch 1.13's bf16 kernels round some steps differently (2e-4 of
        // the loss at step 3 measured): there the bound is that of bf16's 8-bit mantissa.
        const double tolerance = TORCH_VERSION_MAJOR >= 2 ? 1e-6 : 1e-2;
        EXPECT_NEAR(a, b, tolerance * std::fabs(b)) << "step " << k + 1;
      }
      // The accumulated gradient itself (fp32 or bf16 sums of the micro-batches'), which the
      // bf16 losses and Adam's first steps hardly show: equal up to the order of the sums.
      // get_global_grad_norm() after every optimizer step: None (null) where DeepSpeed's
      // optimizer keeps no norm, "inf" after an overflow, else the same norm.
      ASSERT_EQ(ours.at("norms").size(), ds.at("norms").size());
      double worst_norm = 0;
      for (size_t k = 0; k < ours.at("norms").size(); ++k) {
        const json &x = ours.at("norms")[k], &y = ds.at("norms")[k];
        if (!x.is_number() || !y.is_number()) {
          EXPECT_EQ(x.dump(), y.dump()) << "gradient norm of step " << k + 1;
          continue;
        }
        const double a = x, b = y;
        worst_norm = std::max(worst_norm, std::fabs(a - b) / std::fabs(b));
        EXPECT_NEAR(a, b, (TORCH_VERSION_MAJOR >= 2 ? 1e-5 : 1e-2) * std::fabs(b))
            << "gradient norm of step " << k + 1;
      }
      // was_step_applied() after every micro-step: false between boundaries and when skipped.
      EXPECT_EQ(ours.at("applied"), ds.at("applied")) << "was_step_applied()";
      if (cs.contains("bad_step")) {
        EXPECT_EQ(ours.at("skipped"), ds.at("skipped")) << "steps skipped";
        EXPECT_NEAR(ours.at("lr").get<double>(), ds.at("lr").get<double>(), 1e-12)
            << "the scheduler's lr after the steps";
      }
      std::printf("  %-50s %s; max |dloss| %.2e", name.c_str(),
                  theirs == "ok" ? "trains" : "refused by both", worst);
      if (!ours.at("norms").empty()) std::printf(", max relative |dnorm| %.2e", worst_norm);
      std::printf("\n");
      ++buffer_cases;
      continue;
    }
    if (cs.at("kind") == "loss_scaler") {
      const json ours = run_loss_scaler(cs);
      ASSERT_EQ(ours.size(), ds.size()) << "ours " << ours.dump() << "\nDeepSpeed " << ds.dump();
      for (size_t k = 0; k < ours.size(); ++k)
        ASSERT_EQ(ours[k], ds[k]) << "update " << k + 1 << "\nours " << ours.dump()
                                  << "\nDeepSpeed " << ds.dump();
      ++scalers;
    } else if (cs.at("kind") == "scheduler") {
      const json ours = run_scheduler(cs);
      ASSERT_EQ(ours.size(), ds.size());
      // torch's schedulers: bitwise (the same double operations as Python's floats).
      const bool torch_type =
          dtrain::zero::detail::is_torch_scheduler_name(cs["config"]["scheduler"]["type"]);
      for (size_t k = 0; k < ours.size(); ++k)
        for (size_t j = 0; j < 4; ++j) {
          const double a = ours[k][j], b = ds[k][j];
          const char* what = j == 0 ? " lr" : j == 1 ? " beta1" : j == 2 ? " beta2" : " momentum";
          if (torch_type)
            ASSERT_EQ(a, b) << "update " << k + 1 << what << " (torch's scheduler: bitwise)";
          else
            ASSERT_NEAR(a, b, 1e-12 * std::max(1.0, std::fabs(b))) << "update " << k + 1 << what;
        }
      ++schedulers;
      if (torch_type) ++torch_schedulers;
    } else if (cs.at("kind") == "scheduler_state") {
      ASSERT_TRUE(ds.contains("state")) << ds.dump();
      const json ours = run_scheduler_state(cs);
      // torch's keys and values, and its types (an int is not a float).
      EXPECT_TRUE(same_types(ours.at("state"), ds.at("state")))
          << "dtrain " << ours.at("state").dump() << "\ntorch  " << ds.at("state").dump();
      for (auto it = ours.at("group").begin(); it != ours.at("group").end(); ++it)
        EXPECT_EQ(*it, ds.at("group").at(it.key())) << "param group key " << it.key();
      EXPECT_EQ(ours.at("resumed"), ours.at("uninterrupted")) << "resumed from the state";
      ++states;
    } else {
      const json ours = run_optimizer(cs);
      ASSERT_EQ(ours.size(), ds.size());
      double worst = 0;
      for (size_t k = 0; k < ours.size(); ++k) {
        for (size_t e = 0; e < ours[k].size(); ++e) {
          const double a = ours[k][e], b = ds[k][e];
          worst = std::max(worst, std::fabs(a - b));
          // DeepSpeed's operations in float32 (OneCycle's changing betas: a few ulps).
          ASSERT_NEAR(a, b, 1e-6 * std::max(1.0, std::fabs(b)))
              << "update " << k + 1 << ", element " << e;
        }
      }
      std::printf("  %-50s max |dtrain - DeepSpeed| over 12 updates: %.2e\n", name.c_str(), worst);
      ++optimizers;
    }
  }
  std::printf(
      "%d scheduler (%d of them torch.optim.lr_scheduler's, bitwise), %d optimizer and %d loss "
      "scaler cases equal to DeepSpeed 0.19.8's classes, %d torch scheduler state_dicts as "
      "torch's, %d 16-bit engine cases (data_types)\n",
      schedulers, torch_schedulers, optimizers, scalers, states, buffer_cases);
}

// The engine's communication dtype in torch's names (null: the model's dtype).
json communication_dtype_name(const dtrain::zero::Config& c) {
  const std::string d = dtrain::zero::communication_data_type(c);
  if (d.empty()) return nullptr;
  return d == "fp32" ? "float32" : d == "fp16" ? "float16" : "bfloat16";
}

// What dtrain resolved, in the peer's terms.
json resolved(const dtrain::zero::Config& c) {
  return {{"train_batch_size", c.train_batch_size},
          {"train_micro_batch_size_per_gpu", c.train_micro_batch_size_per_gpu},
          {"gradient_accumulation_steps", c.gradient_accumulation_steps},
          {"stage", c.zero.stage},
          {"fp16", c.fp16.enabled},
          {"bf16", c.bf16},
          {"gradient_clipping", c.gradient_clipping},
          {"offload_optimizer", c.zero.offload_optimizer.device},
          {"offload_param", c.zero.offload_param.device},
          {"offload_optimizer_pin_memory", c.zero.offload_optimizer.pin_memory},
          {"offload_param_pin_memory", c.zero.offload_param.pin_memory},
          {"reduce_bucket_size", c.zero.reduce_bucket_size},
          {"throughput_timer", c.throughput_timer},
          {"loss_scale", c.fp16.loss_scale},
          {"initial_scale_power", c.fp16.initial_scale_power},
          {"loss_scale_window", c.fp16.loss_scale_window},
          {"hysteresis", c.fp16.hysteresis},
          {"consecutive_hysteresis", c.fp16.consecutive_hysteresis},
          {"min_loss_scale", c.fp16.min_loss_scale},
          {"communication_data_type", communication_dtype_name(c)}};
}

// The optimizer's values as DeepSpeed's param_groups name them, and the scheduler's first rates.
json engine_values(const dtrain::zero::Config& c, const json& ds) {
  json out = json::object();
  const auto& o = c.optimizer;
  if (ds.contains("optimizer") && o.given) {
    json v = {{"lr", o.lr}, {"weight_decay", o.weight_decay}};
    const json& d = ds.at("optimizer");
    if (d.contains("eps")) v["eps"] = o.eps;
    if (d.contains("betas")) v["betas"] = {o.beta1, o.beta2};
    if (d.contains("bias_correction")) v["bias_correction"] = o.bias_correction;
    if (d.contains("momentum")) v["momentum"] = o.momentum;
    if (d.contains("dampening")) v["dampening"] = o.dampening;
    if (d.contains("nesterov")) v["nesterov"] = o.nesterov;
    if (d.contains("lr_decay")) v["lr_decay"] = o.lr_decay;
    if (d.contains("initial_accumulator_value"))
      v["initial_accumulator_value"] = o.initial_accumulator_value;
    // DeepSpeed's decoupled flag: its Adam's adam_w_mode (Lion decays decoupled, but has none).
    v["decoupled"] = o.type != "SGD" && o.type != "Adagrad" && o.type != "Lion" &&
                     o.type != "RMSprop" && o.adam_w_mode;
    out["optimizer"] = v;
  }
  if (ds.contains("lrs") && !c.scheduler.type.empty()) {
    // Without a config optimizer the peer's stands in for the caller's: lr 0.5.
    dtrain::zero::LRScheduler s(c.scheduler, o.given ? o.lr : 0.5, o.beta1, o.beta2);
    json lrs = json::array();
    for (size_t k = 0; k < ds.at("lrs").size(); ++k) {
      lrs.push_back(s.lr());
      s.step();
    }
    out["lrs"] = lrs;
  }
  return out;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Numbers within rounding (DeepSpeed keeps some as ints, some as floats), the rest equal.
bool same(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) {
    const double x = a.get<double>(), y = b.get<double>();
    return std::fabs(x - y) <= 1e-12 * std::max(1.0, std::fabs(y));
  }
  if (a.is_array() && b.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!same(a[i], b[i])) return false;
    return true;
  }
  if (a.is_object() && b.is_object()) {
    for (auto it = a.begin(); it != a.end(); ++it)
      if (!b.contains(it.key()) || !same(*it, b.at(it.key()))) return false;
    return true;
  }
  return a == b;
}

// Each config at each world size: accepted by both with the same resolved values, refused by
// both, or refused by one side for a reason the other side's message shows is deliberate.
// DeepSpeed accepts a config when DeepSpeedConfig does at that world size and its engine
// (deepspeed.initialize, one rank) does too; where only this CPU build stops the engine (fp16,
// FusedLamb) the engine's decision is not known and the config counts as accepted. dtrain
// accepts what DeepSpeed refuses only where it says so: Hugging Face's "auto", resolved, or a
// note that DeepSpeed would refuse it; it refuses what DeepSpeed accepts only with a message
// naming why: not supported or implemented by dtrain, a typo DeepSpeed would let pass, or
// "auto" that needs Hugging Face's training arguments.
struct Tally {
  int both_accept = 0, both_refuse = 0, dtrain_only = 0, deepspeed_only = 0;
};

void check_config(const std::string& name, const json& ds, int world,
                  const std::function<dtrain::zero::Config(int)>& parse, Tally& tally) {
  SCOPED_TRACE(name + " at world size " + std::to_string(world));
  ASSERT_TRUE(ds.contains("worlds")) << ds.dump();
  const json& w = ds.at("worlds").at(std::to_string(world));
  const json engine = ds.value("engine", json::object());
  std::string ds_error = w.contains("error") ? w.at("error").get<std::string>()
                         : engine.contains("error")
                             ? "deepspeed.initialize: " + engine.at("error").get<std::string>()
                             : "";
  const bool ds_ok = ds_error.empty();
  std::string ours_error;
  dtrain::zero::Config c;
  try {
    c = parse(world);
  } catch (const dtrain::zero::ConfigError& e) {
    ours_error = e.what();
  }
  const bool ours_ok = ours_error.empty();
  std::string notes;
  for (const auto& n : c.notes) notes += n + "\n";
  std::printf("  %-52s %d  DeepSpeed %-8s dtrain %s\n", name.substr(0, 52).c_str(), world,
              ds_ok ? "accepts" : "refuses", ours_ok ? "accepts" : ours_error.c_str());
  if (!ds_ok) std::printf("  %-52s    DeepSpeed: %s\n", "", ds_error.c_str());
  if (ds_ok && ours_ok) {
    ++tally.both_accept;
    json ours = resolved(c);
    for (auto it = ours.begin(); it != ours.end(); ++it) {
      const json& theirs = w.at(it.key());
      if (theirs.is_null()) continue;                // an offload section DeepSpeed does not have
      if (theirs.is_string() && theirs == "auto") {  // kept by DeepSpeed, resolved by dtrain
        EXPECT_TRUE(contains(notes, it.key() + ": \"auto\"")) << it.key() << "\n" << notes;
        continue;
      }
      EXPECT_TRUE(same(*it, theirs)) << it.key() << " resolved differently: dtrain " << it->dump()
                                     << ", DeepSpeed " << theirs.dump();
    }
    const json values = engine_values(c, engine);
    for (auto it = values.begin(); it != values.end(); ++it)
      EXPECT_TRUE(same(*it, engine.at(it.key()))) << it.key() << " differs: dtrain " << it->dump()
                                                  << ", DeepSpeed " << engine.at(it.key()).dump();
    EXPECT_EQ(c.optimizer.given, !w.at("optimizer").is_null());
    EXPECT_EQ(c.scheduler.type.empty(), w.at("scheduler").is_null());
  } else if (ours_ok) {
    ++tally.dtrain_only;
    EXPECT_TRUE(contains(notes, "\"auto\"") || contains(notes, "DeepSpeed 0.19.8 would refuse"))
        << "dtrain accepts what DeepSpeed refuses, without a note saying so: " << ds_error;
  } else if (ds_ok) {
    ++tally.deepspeed_only;
    EXPECT_TRUE(contains(ours_error, "not supported by dtrain") ||
                contains(ours_error, "not implemented by dtrain") ||
                contains(ours_error, "so that a typo cannot go unnoticed") ||
                contains(ours_error, "as a likely typo of a known key") ||
                contains(ours_error, "\"auto\" is filled in by Hugging Face"))
        << "dtrain refuses what DeepSpeed accepts without saying why: " << ours_error;
  } else {
    ++tally.both_refuse;
  }
  if (!ours_ok) {  // a refusal names the key path, and what is wrong
    EXPECT_TRUE(contains(ours_error, ": ")) << ours_error;
  }
}

void check_configs(const json& peer) {
  Tally tally;
  int configs = 0;
  std::printf("config, world size, DeepSpeed 0.19.8 and dtrain:\n");
  for (const auto& cs : config_cases()) {
    const std::string name = cs.at("name");
    ASSERT_TRUE(peer.contains(name)) << name;
    for (const auto& w : cs.at("worlds"))
      check_config(
          name, peer.at(name), w.get<int>(),
          [&](int world) { return dtrain::zero::parse_config(cs.at("config"), world); }, tally);
    ++configs;
  }
  const auto files = corpus();
  ASSERT_GE(files.size(), 11u) << "DeepSpeed's 4 templates and tests/zero/configs";
  for (const auto& f : files) {
    for (int w : {1, 2, 3, 4, 8})
      check_config(
          f.filename().string(), peer.at(f.string()), w,
          [&](int world) { return dtrain::zero::parse_config_text(f.string(), world); }, tally);
    ++configs;
  }
  std::printf(
      "%d configs (%zu files), %d config and world size pairs: %d accepted by both with the "
      "same values, %d refused by both, %d accepted by dtrain only, %d by DeepSpeed only\n",
      configs, files.size(),
      tally.both_accept + tally.both_refuse + tally.dtrain_only + tally.deepspeed_only,
      tally.both_accept, tally.both_refuse, tally.dtrain_only, tally.deepspeed_only);
}

// The same value with the same JSON types (an integer is not a float here).
bool same_types(const json& a, const json& b) {
  if (a.is_number_integer() && b.is_number_integer()) return a == b;  // signed or unsigned
  if (a.type() != b.type()) return false;
  if (a.is_structured()) {
    if (a.size() != b.size()) return false;
    if (a.is_object()) {
      for (auto it = a.begin(); it != a.end(); ++it)
        if (!b.contains(it.key()) || !same_types(*it, b.at(it.key()))) return false;
      return true;
    }
    for (size_t i = 0; i < a.size(); ++i)
      if (!same_types(a[i], b[i])) return false;
    return true;
  }
  return a == b;
}

void check_hjson(const json& peer) {
  int n = 0;
  for (const auto& cs : hjson_cases()) {
    const std::string text = cs.at("text");
    SCOPED_TRACE(text);
    const json& ds = peer.at(cs.at("name").get<std::string>());
    std::string ours_error;
    json ours;
    try {
      ours = dtrain::zero::read_config_text(text, "config");
    } catch (const dtrain::zero::ConfigError& e) {
      ours_error = e.what();
    }
    if (ds.contains("error")) {
      EXPECT_FALSE(ours_error.empty())
          << "hjson refuses it (" << ds.at("error") << "), dtrain reads " << ours.dump();
    } else {
      const json theirs = json::parse(ds.at("json").get<std::string>());
      EXPECT_TRUE(ours_error.empty()) << ours_error;
      EXPECT_TRUE(same_types(ours, theirs))
          << "dtrain " << ours.dump() << "\nhjson  " << theirs.dump();
    }
    std::printf(
        "  %-60s %s\n", json(text).dump().substr(0, 60).c_str(),
        ds.contains("error") ? "refused by both" : ds.at("json").get<std::string>().c_str());
    ++n;
  }
  std::printf("%d config texts read as hjson 3.1 (DeepSpeed's reader) reads them\n", n);
}

// dtrain's engine (one rank) over the case's steps, stdout kept: the progress lines, or the
// config's refusal.
// The client optimizer a progress case names, over `params`.
std::shared_ptr<torch::optim::Optimizer> client_optimizer(const json& spec,
                                                          std::vector<torch::Tensor> params) {
  namespace optim = torch::optim;
  const std::string type = spec.at("type");
  const double lr = spec.at("lr");
  if (type == "Adam" || type == "AdamW") {
    const json betas = spec.value("betas", json::array({0.9, 0.999}));
    const std::tuple<double, double> b = {betas.at(0), betas.at(1)};
    if (type == "Adam")
      return std::make_shared<optim::Adam>(params, optim::AdamOptions(lr).betas(b));
    return std::make_shared<optim::AdamW>(params, optim::AdamWOptions(lr).betas(b));
  }
  if (type == "SGD")
    return std::make_shared<optim::SGD>(
        params, optim::SGDOptions(lr).momentum(spec.value("momentum", 0.0)));
  if (type == "RMSprop") return std::make_shared<optim::RMSprop>(params, optim::RMSpropOptions(lr));
  if (type == "Adagrad") return std::make_shared<optim::Adagrad>(params, optim::AdagradOptions(lr));
  throw std::invalid_argument("client optimizer type " + type);
}

// A throughput line with its measured numbers replaced by <float> once each is checked to be
// a Python float's repr; the line as it is when it has another shape (so that it differs).
std::string throughput_shape(const std::string& line) {
  static const std::string f =
      "(-?inf|nan|-?[0-9]+\\.[0-9]+(e[-+][0-9]{2,})?|-?[0-9]e[-+][0-9]{2,})";
  static const std::regex shape(
      "^(epoch=[0-9]+/micro_step=[0-9]+/global_step=[0-9]+), "
      "RunningAvgSamplesPerSec=" +
      f + ", CurrSamplesPerSec=" + f + ", MemAllocated=" + f + "GB, MaxMemAllocated=" + f + "GB$");
  std::smatch m;
  if (!std::regex_match(line, m, shape)) return line;
  return m[1].str() +
         ", RunningAvgSamplesPerSec=<float>, CurrSamplesPerSec=<float>, MemAllocated=<float>GB, "
         "MaxMemAllocated=<float>GB";
}

bool is_throughput(const std::string& line) { return line.rfind("epoch=", 0) == 0; }

json run_progress(const json& cs) {
  json out = {{"lines", json::array()}};
  dtrain::zero::Config config;
  try {
    config = dtrain::zero::parse_config(cs.at("config"), 1);
  } catch (const dtrain::zero::ConfigError& e) {
    out["refused"] = e.what();
    return out;
  }
  std::string printed;
  testing::internal::CaptureStdout();
  try {
    dtrain::test::run_ranks(1, [&](std::shared_ptr<dtrain::ProcessGroup> pg) {
      torch::manual_seed(0);
      torch::nn::Sequential model(torch::nn::Linear(4, 3), torch::nn::Linear(3, 2));
      const bool final = cs.value("final", false);
      if (final) {
        torch::NoGradGuard
            no_grad;  // the peer's values (libtorch's Linear initialises differently)
        int k = 0;
        for (auto& p : model->parameters())
          p.copy_((torch::sin(torch::arange(p.numel(), torch::kFloat32) * 0.37 + k++) * 0.5)
                      .view(p.sizes()));
      }
      dtrain::zero::InitOptions init;
      init.group = pg;
      if (cs.contains("client"))
        init.optimizer = client_optimizer(cs.at("client"), model->parameters());
      dtrain::zero::Engine<torch::nn::Sequential> engine(model, config, init);
      if (final) torch::manual_seed(1);  // the peer's inputs
      const json bad = cs.at("bad_steps");
      for (int k = 0; k < cs.at("steps").get<int>(); ++k) {
        auto x = torch::randn({2, 4});
        if (std::find(bad.begin(), bad.end(), json(k)) != bad.end()) x.index_put_({0, 0}, INFINITY);
        engine.backward(engine.forward(x).pow(2).mean());
        engine.step();
      }
      if (final) {
        // The engine's module state (gathered: stage 3 keeps only this rank's part in the
        // module's parameters), in the module's order.
        const auto module = engine.core().model_state(true).toGenericDict().at("module");
        std::vector<double> values;
        for (const auto& p : model->named_parameters()) {
          auto flat = module.toGenericDict()
                          .at(p.key())
                          .toTensor()
                          .to(torch::kFloat64)
                          .flatten()
                          .contiguous();
          values.insert(values.end(), flat.data_ptr<double>(),
                        flat.data_ptr<double>() + flat.numel());
        }
        out["final"] = values;
      }
    });
  } catch (...) {
    printed = testing::internal::GetCapturedStdout();
    throw;
  }
  printed = testing::internal::GetCapturedStdout();
  std::istringstream in(printed);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("[Rank 0] step=", 0) == 0 || is_throughput(line))
      out["lines"].push_back(is_throughput(line) ? throughput_shape(line) : line);
  return out;
}

void check_progress(const json& peer) {
  int n = 0, lines = 0, throughput = 0;
  for (const auto& cs : progress_cases()) {
    const std::string name = cs.at("name");
    SCOPED_TRACE(name);
    const json& ds = peer.at(name);
    const json ours = run_progress(cs);
    // DeepSpeed refuses in deepspeed.initialize (log_level) or fails its first step
    // (steps_per_print 0, a string): dtrain refuses the config, naming the same error.
    const std::string ds_error = ds.contains("init")     ? ds.at("init").get<std::string>()
                                 : ds.at("step") != "ok" ? ds.at("step").get<std::string>()
                                                         : "";
    if (!ds_error.empty()) {
      ASSERT_TRUE(ours.contains("refused")) << "DeepSpeed stops: " << ds_error;
      const std::string why = ours.at("refused");
      const std::string type = ds_error.substr(0, ds_error.find(':'));
      EXPECT_TRUE(contains(why, "DeepSpeed 0.19.8 refuses it too") || contains(why, type))
          << "dtrain: " << why << "\nDeepSpeed: " << ds_error;
      std::printf("  %-56s stopped by both (DeepSpeed: %s)\n", name.c_str(), ds_error.c_str());
    } else {
      ASSERT_FALSE(ours.contains("refused")) << ours.at("refused");
      json theirs = json::array();
      int timed = 0;
      for (const auto& l : ds.at("lines")) {
        const std::string line = l;
        theirs.push_back(is_throughput(line) ? throughput_shape(line) : line);
        timed += is_throughput(line);
      }
      EXPECT_EQ(ours.at("lines"), theirs)
          << "dtrain    " << ours.at("lines").dump(1) << "\nDeepSpeed " << ds.at("lines").dump(1);
      std::printf("  %-56s %zu lines equal (%d throughput)\n", name.c_str(), theirs.size(), timed);
      if (cs.value("final", false)) {  // the update too: the client steps as DeepSpeed steps it
        const auto a = ours.at("final").get<std::vector<double>>();
        const auto b = ds.at("final").get<std::vector<double>>();
        ASSERT_EQ(a.size(), b.size());
        double worst = 0;
        for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
        EXPECT_LT(worst, 1e-5) << "parameters after the steps differ from DeepSpeed's";
        // Bit for bit where the gradients are: dtrain on the peer's libtorch 2.x. libtorch
        // 1.13's kernels (Debian's, OpenBLAS) give gradients an ulp apart (3e-8 after 5 steps).
        if (cs.value("exact", false) && TORCH_VERSION_MAJOR >= 2) {
          EXPECT_EQ(worst, 0) << "parameters after the steps not DeepSpeed's bit for bit";
        }
        std::printf("  %-56s parameters after %d steps within %.1e of DeepSpeed's\n", "",
                    cs.at("steps").get<int>(), worst);
      }
      lines += static_cast<int>(theirs.size());
      throughput += timed;
    }
    ++n;
  }
  EXPECT_GT(throughput, 0) << "no case made DeepSpeed print its throughput line";
  std::printf(
      "%d progress cases (%d lines, %d of them throughput lines, their numbers as Python floats) "
      "as DeepSpeed 0.19.8's engine prints them\n",
      n, lines, throughput);
}

// One test, so that ctest (one process per test) imports DeepSpeed once for both checks.
// dtrain's side of a module_strict case (the peer's run_module_strict).
json run_module_strict(const json& cs) {
  json out;
  auto chain = [](const std::vector<int64_t>& widths) {
    torch::nn::Sequential m;
    for (size_t i = 0; i + 1 < widths.size(); ++i)
      m->push_back(torch::nn::Linear(widths[i], widths[i + 1]));
    torch::NoGradGuard no_grad;  // the peer's values (libtorch's Linear initialises differently)
    int k = 0;
    for (auto& p : m->parameters())
      p.copy_((torch::sin(torch::arange(p.numel(), torch::kFloat32) * 0.37 + k++) * 0.5)
                  .view(p.sizes()));
    return m;
  };
  json config = cs.at("config");
  config["train_micro_batch_size_per_gpu"] = 8;
  const fs::path dir =
      fs::temp_directory_path() / ("dtrain-ds-strict-" + std::to_string(::getpid()));
  dtrain::test::run_ranks(1, [&](std::shared_ptr<dtrain::ProcessGroup> pg) {
    auto train = [](auto& engine, torch::nn::Sequential& m, int seed) {
      torch::manual_seed(seed);
      json losses = json::array();
      for (int k = 0; k < 2; ++k) {
        auto loss = engine.forward(torch::randn({8, 4}).to(m->parameters()[0].scalar_type()))
                        .to(torch::kFloat)
                        .pow(2)
                        .mean();
        engine.backward(loss);
        engine.step();
        losses.push_back(loss.template item<double>());
      }
      return losses;
    };
    auto first = chain({4, 3, 2});
    dtrain::zero::Engine<torch::nn::Sequential> saved(first, dtrain::zero::parse_config(config, 1),
                                                      {pg});
    train(saved, first, 0);
    saved.save_checkpoint(dir.string(), "a");
    auto model = chain(cs.at("widths").get<std::vector<int64_t>>());
    dtrain::zero::Engine<torch::nn::Sequential> engine(model, dtrain::zero::parse_config(config, 1),
                                                       {pg});
    try {
      engine.load_checkpoint(dir.string(), "a",
                             {.load_module_only = cs.at("module_only").get<bool>(),
                              .load_module_strict = cs.at("strict").get<bool>()});
    } catch (const dtrain::UsageError& e) {
      out["load"] = e.what();
      return;
    }
    out["load"] = "ok";
    out["losses"] = train(engine, model, 1);
    if (engine.config().zero.stage == 3) engine.core().before_forward();  // gathers the module
    json params = json::array();
    for (const auto& p : model->parameters()) {
      auto v = p.detach().to(torch::kFloat).flatten().contiguous();
      params.push_back(std::vector<float>(v.data_ptr<float>(), v.data_ptr<float>() + v.numel()));
    }
    out["params"] = params;
  });
  fs::remove_all(dir);
  return out;
}

// DeepSpeed's load_module_strict: the load passes or is refused on both sides (dtrain's
// refusal a UsageError naming the keys where DeepSpeed fails in torch or in its optimizer);
// where it passes, 2 more steps give the same losses and parameters (at stage 3, where
// DeepSpeed loads nothing, those of DeepSpeed's load at stage 2).
TEST(ZeroDeepSpeedReference, LoadModuleStrictAsDeepSpeeds) {
  const json& peer = peer_results();
  ASSERT_FALSE(peer.contains("failure")) << peer.value("failure", "");
  int passed = 0, refused = 0;
  for (const auto& cs : module_strict_cases()) {
    const std::string name = cs.at("name");
    SCOPED_TRACE(name);
    ASSERT_TRUE(peer.contains(name));
    const json ours = run_module_strict(cs);
    const bool stage3 = cs.at("config").at("zero_optimization").at("stage") == 3;
    const bool theirs_ok = peer.at(name).at("load") == "ok", ours_ok = ours.at("load") == "ok";
    // At stage 3 DeepSpeed 0.19.8 returns from the load having loaded none of the saved values
    // (its module holds empty placeholders; docs/deepspeed.md), and its engine.module's
    // parameters are placeholders too. dtrain loads them from the checkpoint's fp32 master: its
    // run is DeepSpeed's run of the same case at stage 2.
    std::string reference_name = name;
    if (stage3) reference_name.replace(reference_name.find("stage 3"), 7, "stage 2");
    ASSERT_TRUE(peer.contains(reference_name));
    const json& ds = peer.at(reference_name);
    ASSERT_EQ(ours_ok, theirs_ok) << "dtrain: " << ours.at("load")
                                  << "\nDeepSpeed: " << ds.at("load");
    if (!ours_ok) {
      ++refused;
      std::printf("  %-60s refused by both; dtrain: %s\n", name.c_str(),
                  ours.at("load").get<std::string>().c_str());
      continue;
    }
    ++passed;
    // As the buffers cases: equal up to a few ulps against the peer's torch 2.x; libtorch 1.13's
    // bf16 kernels round some steps differently (one bf16 ulp of a parameter, 1.2e-5 of the
    // loss measured), so there the bound is bf16's 8-bit mantissa.
    const bool bf16 = cs.at("config").contains("bf16");
    const double tolerance = bf16 && TORCH_VERSION_MAJOR < 2 ? 1e-2 : 1e-6;
    double worst = 0;
    for (size_t k = 0; k < 2; ++k) {
      const double a = ours.at("losses")[k], b = ds.at("losses")[k];
      worst = std::max(worst, std::fabs(a - b));
      EXPECT_NEAR(a, b, tolerance * std::max(1.0, std::fabs(b))) << "step " << k + 1;
    }
    ASSERT_EQ(ours.at("params").size(), ds.at("params").size());
    for (size_t i = 0; i < ours.at("params").size(); ++i) {
      const auto a = ours.at("params")[i].get<std::vector<double>>();
      const auto b = ds.at("params")[i].get<std::vector<double>>();
      ASSERT_EQ(a.size(), b.size()) << "parameter " << i;
      for (size_t j = 0; j < a.size(); ++j) {
        worst = std::max(worst, std::fabs(a[j] - b[j]));
        EXPECT_NEAR(a[j], b[j], tolerance) << "parameter " << i << " element " << j;
      }
    }
    std::printf(stage3 ? "  %-60s loaded by dtrain (DeepSpeed returns having loaded nothing); "
                         "losses and parameters within %.1e of DeepSpeed's at stage 2\n"
                       : "  %-60s loaded by both; losses and parameters within %.1e\n",
                name.c_str(), worst);
  }
  EXPECT_GE(passed, 7);
  EXPECT_GE(refused, 3);
}

TEST(ZeroDeepSpeedReference, SchedulersOptimizersAndConfigsAsDeepSpeeds) {
  const json& peer = peer_results();
  ASSERT_FALSE(peer.contains("failure")) << peer.value("failure", "");
  {
    SCOPED_TRACE("schedulers and optimizers");
    check_steps(peer);
  }
  {
    SCOPED_TRACE("configs");
    check_configs(peer);
  }
  {
    SCOPED_TRACE("loss scaler objects");
    check_scaler_objects(peer);
  }
  {
    SCOPED_TRACE("config text as hjson");
    check_hjson(peer);
  }
  {
    SCOPED_TRACE("progress lines");
    check_progress(peer);
  }
}

}  // namespace
