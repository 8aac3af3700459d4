// dtrain's LR schedulers and optimizers against DeepSpeed 0.19.8's own classes (the venv's,
// on CPU), driven over the same steps: the learning rate and betas each update sees, and the
// parameters after each update. The peer (deepspeed_reference_peer.py) builds optimizer and
// scheduler with DeepSpeed's engine code from the same config; one Python process runs every
// case. dtrain's side runs the real engine (one rank) with a loss whose gradient is the given
// one. Lamb is not here: DeepSpeed 0.19.8's FusedLamb has no CPU kernel (its CPU accelerator
// maps it to NotImplementedBuilder).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "dtrain/zero.h"
#include "support/paths.h"
#include "support/thread_group.h"

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

json sched(const std::string& type, json params = json::object()) {
  return {{"type", type}, {"params", params}};
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

json all_cases() {
  json c = build_cases();
  for (const auto& f : corpus())
    c.push_back(
        {{"name", f.string()}, {"kind", "config"}, {"path", f.string()}, {"world_size", 2}});
  return c;
}

// Every case through one DeepSpeed process (importing DeepSpeed is the slow part).
const json& peer_results() {
  static const json results = [] {
    const json cases = all_cases();
    const fs::path dir =
        fs::temp_directory_path() / ("dtrain-ds-ref-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    { std::ofstream(dir / "cases.json") << cases.dump(); }
    const std::string cmd = std::string(DTRAIN_VENV_PYTHON) + " " + DTRAIN_SOURCE_DIR +
                            "/tests/zero/deepspeed_reference_peer.py " +
                            (dir / "cases.json").string() + " " + (dir / "ds.json").string() +
                            " 2>" + (dir / "peer.err").string();
    json out = json::object();
    if (std::system(cmd.c_str()) != 0) {
      std::ifstream e(dir / "peer.err");
      out["failure"] = "the DeepSpeed peer failed: " + cmd + "\n" +
                       std::string(std::istreambuf_iterator<char>(e), {}) +
                       "(is deepspeed installed in the venv? scripts/requirements.txt)";
    } else {
      std::ifstream in(dir / "ds.json");
      const json ds = json::parse(in);
      for (size_t i = 0; i < cases.size() && i < ds.size(); ++i)
        out[cases[i].at("name").get<std::string>()] = ds[i];
    }
    fs::remove_all(dir);
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

json run_scheduler(const json& cs) {
  auto c = parse(cs.at("config"));
  const bool has_betas = c.optimizer.type != "SGD";
  dtrain::zero::LRScheduler s(c.scheduler, c.optimizer.lr, c.optimizer.beta1, c.optimizer.beta2);
  json out = json::array();
  for (int k = 0; k < cs.at("steps").get<int>(); ++k) {
    auto [b1, b2] = s.betas();
    out.push_back({s.lr(), has_betas ? b1 : 0.0, has_betas ? b2 : 0.0});
    s.step();
  }
  return out;
}

struct OneParam : torch::nn::Module {
  explicit OneParam(const torch::Tensor& init) { w = register_parameter("w", init.clone()); }
  torch::Tensor w;
};

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

void check_steps(const json& peer) {
  const json cases = build_cases();
  int schedulers = 0, optimizers = 0;
  for (const auto& cs : cases) {
    const std::string name = cs.at("name");
    SCOPED_TRACE(name);
    ASSERT_TRUE(peer.contains(name));
    const json& ds = peer.at(name);
    if (cs.at("kind") == "scheduler") {
      const json ours = run_scheduler(cs);
      ASSERT_EQ(ours.size(), ds.size());
      for (size_t k = 0; k < ours.size(); ++k)
        for (size_t j = 0; j < 3; ++j) {
          const double a = ours[k][j], b = ds[k][j];
          ASSERT_NEAR(a, b, 1e-12 * std::max(1.0, std::fabs(b))) << "update " << k + 1
                                                                 << (j == 0   ? " lr"
                                                                     : j == 1 ? " beta1"
                                                                              : " beta2");
        }
      ++schedulers;
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
  std::printf("%d scheduler and %d optimizer cases equal to DeepSpeed 0.19.8's classes\n",
              schedulers, optimizers);
}

// What dtrain resolved, in the peer's terms.
json resolved(const dtrain::zero::Config& c) {
  json out = {{"train_batch_size", c.train_batch_size},
              {"train_micro_batch_size_per_gpu", c.train_micro_batch_size_per_gpu},
              {"gradient_accumulation_steps", c.gradient_accumulation_steps},
              {"stage", c.zero.stage},
              {"fp16", c.fp16.enabled},
              {"bf16", c.bf16},
              {"gradient_clipping", c.gradient_clipping},
              {"offload_optimizer", c.zero.offload_optimizer.device},
              {"offload_param", c.zero.offload_param.device},
              {"reduce_bucket_size", c.zero.reduce_bucket_size}};
  return out;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Each config: accepted by both with the same resolved values, refused by both, or refused by
// one side for a reason the other side's message shows is deliberate: dtrain resolves
// Hugging Face's "auto" where DeepSpeed (which expects it filled in) fails on it; dtrain
// refuses what it does not implement (nvme offload, 1-bit optimizers), and unknown keys that
// DeepSpeed would silently ignore, each with a message that says so.
void check_corpus(const json& peer) {
  const auto files = corpus();
  ASSERT_GE(files.size(), 11u) << "DeepSpeed's 4 templates and tests/zero/configs";
  int accepted = 0, refused = 0;
  std::printf("%-40s %-12s %s\n", "config (world size 2)", "DeepSpeed", "dtrain");
  for (const auto& f : files) {
    SCOPED_TRACE(f.string());
    const json& ds = peer.at(f.string());
    const bool ds_ok = !ds.contains("error");
    std::string ours_error;
    json ours;
    bool auto_resolved = false;
    try {
      auto c = dtrain::zero::parse_config_text(f.string(), 2);
      ours = resolved(c);
      for (const auto& n : c.notes) auto_resolved = auto_resolved || contains(n, "\"auto\"");
      // The optimizer's values, where DeepSpeed took them as given.
      if (c.optimizer.given) {
        if (ds.contains("optimizer_lr")) ours["optimizer_lr"] = c.optimizer.lr;
        if (ds.contains("optimizer_eps")) ours["optimizer_eps"] = c.optimizer.eps;
        if (ds.contains("optimizer_weight_decay"))
          ours["optimizer_weight_decay"] = c.optimizer.weight_decay;
      }
    } catch (const dtrain::zero::ConfigError& e) {
      ours_error = e.what();
    }
    const bool ours_ok = ours_error.empty();
    const std::string ds_text = ds_ok ? "accepted" : ds.at("error").get<std::string>();
    std::printf("%-40s %-12s %s\n", f.filename().c_str(), ds_ok ? "accepted" : "refused",
                ours_ok ? "accepted" : ours_error.c_str());
    if (!ds_ok) std::printf("%-40s   DeepSpeed: %s\n", "", ds_text.c_str());
    ours_ok ? ++accepted : ++refused;
    if (ds_ok && ours_ok) {
      for (auto it = ours.begin(); it != ours.end(); ++it)
        EXPECT_EQ(*it, ds.at(it.key())) << it.key() << " resolved differently";
    } else if (ours_ok) {
      // DeepSpeed 0.19.8 fails on "auto" (e.g. TypeError comparing "auto" with an int).
      EXPECT_TRUE(contains(ours.dump(), "auto") || auto_resolved)
          << "dtrain accepts what DeepSpeed refuses for another reason than \"auto\": " << ds_text;
    } else if (ds_ok) {
      EXPECT_TRUE(contains(ours_error, "not supported by dtrain") ||
                  contains(ours_error, "not implemented by dtrain") ||
                  contains(ours_error, "would silently ignore it") ||
                  contains(ours_error, "\"auto\" is filled in by Hugging Face"))
          << "dtrain refuses what DeepSpeed accepts without saying why: " << ours_error;
    }
    if (!ours_ok) {  // a refusal names the key path, and what to do
      EXPECT_TRUE(contains(ours_error, ": ")) << ours_error;
    }
  }
  std::printf("%zu configs: %d accepted, %d refused\n", files.size(), accepted, refused);
}

// One test, so that ctest (one process per test) imports DeepSpeed once for both checks.
TEST(ZeroDeepSpeedReference, SchedulersOptimizersAndConfigsAsDeepSpeeds) {
  const json& peer = peer_results();
  ASSERT_FALSE(peer.contains("failure")) << peer.value("failure", "");
  {
    SCOPED_TRACE("schedulers and optimizers");
    check_steps(peer);
  }
  {
    SCOPED_TRACE("config corpus");
    check_corpus(peer);
  }
}

}  // namespace
