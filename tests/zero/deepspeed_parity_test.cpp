// DeepSpeed 0.19.8 and dtrain's ZeRO engine side by side: the same model, initial weights, data
// and config, 2 ranks each (DeepSpeed on CPU under the venv's torchrun, dtrain's engine under
// `dtrain run`), stages 1-3 with each optimizer type DeepSpeed runs on CPU and a scheduler; the
// losses of every step and the final parameters agree within float32 noise; and each side reads
// the other's checkpoints. One DeepSpeed job runs every case (importing DeepSpeed is the slow
// part).
#include <gtest/gtest.h>
#include <torch/version.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "dtrain/zero.h"
#include "launcher/subprocess.h"
#include "support/free_port.h"
#include "support/paths.h"
#include "support/peer_cache.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace std::chrono_literals;

json cases() {
  const json optimizers = {
      {"AdamW", {{"type", "AdamW"}, {"params", {{"lr", 0.01}, {"weight_decay", 0.01}}}}},
      {"Adam (decoupled decay by default)",
       {{"type", "Adam"}, {"params", {{"lr", 0.01}, {"weight_decay", 0.05}}}}},
      {"Adam without bias correction",
       {{"type", "Adam"}, {"params", {{"lr", 0.005}, {"bias_correction", false}}}}},
      {"SGD momentum", {{"type", "SGD"}, {"params", {{"lr", 0.05}, {"momentum", 0.9}}}}}};
  json out = json::array();
  for (int stage = 1; stage <= 3; ++stage) {
    for (auto it = optimizers.begin(); it != optimizers.end(); ++it) {
      json config = {{"train_micro_batch_size_per_gpu", 4},
                     {"optimizer", it.value()},
                     {"zero_optimization",
                      {{"stage", stage}, {"stage3_gather_16bit_weights_on_model_save", true}}},
                     {"zero_allow_untested_optimizer", true},  // DeepSpeed: SGD under ZeRO
                     {"steps_per_print", 1000}};
      if (it.key() == "AdamW")
        config["scheduler"] = {{"type", "WarmupLR"},
                               {"params", {{"warmup_min_lr", 0.001}, {"warmup_num_steps", 5}}}};
      if (it.key() == "SGD momentum")
        config["scheduler"] = {{"type", "WarmupCosineLR"},
                               {"params", {{"total_num_steps", 8}, {"warmup_num_steps", 3}}}};
      out.push_back({{"name", "stage " + std::to_string(stage) + ", " + it.key() +
                                  (config.contains("scheduler")
                                       ? " + " + config["scheduler"]["type"].get<std::string>()
                                       : "")},
                     {"config", config}});
    }
  }
  // DeepSpeed cuts stage 3's partitions into sub-groups of about sub_group_size elements (here
  // 3: [352], [22, 88], [4]), each its own fp32 flat group and optimizer state in its files.
  json sub = out[8];  // stage 3, Adam
  sub["name"] = "stage 3, Adam, sub_group_size 100";
  sub["config"]["zero_optimization"]["sub_group_size"] = 100;
  out.push_back(sub);
  // The other optimizer classes DeepSpeed builds for Adam, whose state_dict its engine loads
  // from dtrain's files: torch.optim.AdamW (torch_adam) and its CPU Adam (offload_optimizer).
  json torch_adam = out[6];  // stage 2, AdamW + WarmupLR
  torch_adam["name"] = "stage 2, AdamW torch_adam + WarmupLR";
  torch_adam["config"]["optimizer"]["params"]["torch_adam"] = true;
  out.push_back(torch_adam);
  json offload = out[0];  // stage 1, Adam
  offload["name"] = "stage 1, Adam, offload_optimizer";
  offload["config"]["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
  out.push_back(offload);
  // Adagrad by name: DeepSpeed builds torch.optim.Adagrad (state "sum", a tensor step), and with
  // offload_optimizer its DeepSpeedCPUAdagrad (state "exp_avg_sq", an int step); each side's
  // engine loads the other's.
  const json adagrad = {{"type", "Adagrad"},
                        {"params",
                         {{"lr", 0.05},
                          {"lr_decay", 0.01},
                          {"initial_accumulator_value", 0.1},
                          {"weight_decay", 0.001}}}};
  const json cpu_adagrad = {{"type", "Adagrad"},
                            {"params", {{"lr", 0.05}, {"weight_decay", 0.001}, {"eps", 1e-8}}}};
  for (int stage = 1; stage <= 3; ++stage) {
    for (bool cpu : {false, true}) {
      if (cpu && stage == 1) continue;
      json a = out[static_cast<size_t>(4 * (stage - 1))];  // stage N, Adam
      a["name"] =
          "stage " + std::to_string(stage) + ", Adagrad" + (cpu ? ", offload_optimizer" : "");
      a["config"]["optimizer"] = cpu ? cpu_adagrad : adagrad;
      if (cpu) a["config"]["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
      if (stage == 2 && !cpu) {
        a["config"]["scheduler"] = {
            {"type", "WarmupLR"}, {"params", {{"warmup_min_lr", 0.001}, {"warmup_num_steps", 5}}}};
        a["name"] = a["name"].get<std::string>() + " + WarmupLR";
      }
      out.push_back(a);
    }
  }
  // Lion by name: DeepSpeedCPULion (offload_optimizer only; state "exp_avg" and the
  // "exp_avg_sq" it never reads, an int step).
  for (int stage : {2, 3}) {
    json l = out[static_cast<size_t>(4 * (stage - 1))];
    l["name"] = "stage " + std::to_string(stage) + ", Lion, offload_optimizer";
    l["config"]["optimizer"] = {
        {"type", "Lion"},
        {"params", {{"lr", 0.002}, {"betas", {0.9, 0.99}}, {"weight_decay", 0.01}}}};
    l["config"]["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
    out.push_back(l);
  }
  // RMSprop by name (torch.optim.RMSprop; under ZeRO with zero_allow_untested_optimizer): state
  // square_avg, momentum_buffer, a tensor step.
  json rms = out[4];  // stage 2, Adam
  rms["name"] = "stage 2, RMSprop momentum";
  rms["config"]["optimizer"] = {
      {"type", "RMSprop"}, {"params", {{"lr", 0.002}, {"momentum", 0.5}, {"weight_decay", 0.001}}}};
  out.push_back(rms);
  return out;
}

double max_diff(const json& a, const json& b) {
  double d = 0;
  for (auto it = b.begin(); it != b.end(); ++it) {
    if (!a.contains(it.key())) return INFINITY;
    const auto& pa = a.at(it.key());
    if (pa.size() != it.value().size()) return INFINITY;
    for (size_t i = 0; i < pa.size(); ++i)
      d = std::max(d, std::fabs(pa[i].get<double>() - it.value()[i].get<double>()));
  }
  return d;
}

json flat_params(const torch::OrderedDict<std::string, torch::Tensor>& sd) {
  json out = json::object();
  for (const auto& item : sd) {
    auto t = item.value().detach().to(torch::kFloat64).contiguous().reshape({-1});
    out[item.key()] = std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
  }
  return out;
}

// An empty directory of this test process's own under the temporary directory.
fs::path fresh_dir(const std::string& prefix) {
  const fs::path dir = fs::temp_directory_path() / (prefix + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// dtrain's engine on 2 ranks (`ranks`; the worker under `dtrain run`) over every case of CASES.
// Every checkpoint it loads must be read in parts, each rank its own (as DeepSpeed's of stages
// 1-3 are when they hold the engine's parameters, in any order): the engine says so on stderr
// when it reads one whole, which would give the same results with every rank holding the lot.
void run_dtrain(const fs::path& cases, const fs::path& out, int ranks = 2) {
  auto r = dtrain::test::run_command({DTRAIN_BIN, "run", "--nproc-per-node", std::to_string(ranks),
                                      DS_PARITY_WORKER_BIN, cases.string(), out.string()},
                                     {.timeout = 300s});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.err.find("is read whole on every rank"), std::string::npos) << r.err;
}

// DeepSpeed on 2 ranks over every case of CASES: the venv's torchrun on a port of its own
// (DeepSpeed's env:// init hangs on port 0).
void run_deepspeed(const fs::path& cases, const fs::path& out) {
  auto r = dtrain::test::run_command(
      {DTRAIN_VENV_PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
       std::to_string(dtrain::test::free_port()),
       std::string(DTRAIN_SOURCE_DIR) + "/tests/zero/deepspeed_parity_peer.py", cases.string(),
       out.string()},
      {.timeout = 500s});
  ASSERT_EQ(r.exit_code, 0) << "DeepSpeed's run failed (is deepspeed in the venv?)\n"
                            << r.out << r.err;
}

// Both sides over the same cases (written to dir/cases.json): dtrain's engine and DeepSpeed's,
// and with `resume_deepspeeds` dtrain again from each case's DeepSpeed checkpoint ("save"):
// loaded at 2 ranks and trained on ("resumed"; and into a module whose parameters are
// registered in another order, "resumed_reordered"), and loaded at 1 and at 3 ranks, saved
// there, and that checkpoint trained on at 2 ranks ("resumed_via", by world size).
struct ParityRuns {
  json ours, theirs, resumed, resumed_via = json::object(), resumed_reordered;
};
// DeepSpeed's side is kept for the suite's second build (support/peer_cache.h) unless a case has
// DeepSpeed read or resume dtrain's files (its results then depend on this build's).
void run_both(const fs::path& dir, const json& cases, bool resume_deepspeeds, ParityRuns* out) {
  { std::ofstream(dir / "cases.json") << cases.dump(); }
  ASSERT_NO_FATAL_FAILURE(run_dtrain(dir / "cases.json", dir / "dtrain.json"));
  std::vector<std::string> outputs = {"ds.json"};
  bool reads_dtrain = false;
  for (const auto& c : cases) {
    reads_dtrain = reads_dtrain || c.contains("read_dtrain") || c.contains("resume_dtrain");
    for (const char* key : {"save", "save_16bit_ds"})
      if (c.contains(key)) outputs.push_back(fs::path(c[key].get<std::string>()).filename());
  }
  const auto deepspeed = [&] { run_deepspeed(dir / "cases.json", dir / "ds.json"); };
  if (reads_dtrain) {
    ASSERT_NO_FATAL_FAILURE(deepspeed());
  } else {
    const std::string key =
        cases.dump() + dtrain::test::file_text(fs::path(DTRAIN_SOURCE_DIR) /
                                               "tests/zero/deepspeed_parity_peer.py");
    ASSERT_NO_FATAL_FAILURE(dtrain::test::cached_peer_run(key, dir, outputs, deepspeed));
  }
  out->ours = json::parse(std::ifstream(dir / "dtrain.json"));
  out->theirs = json::parse(std::ifstream(dir / "ds.json"));
  if (!resume_deepspeeds) return;
  json resume = json::array();
  for (const auto& c : cases) {
    resume.push_back({{"name", c["name"]}, {"config", c["config"]}, {"resume_from", c["save"]}});
    for (const char* key : {"freeze", "exclude_frozen"})
      if (c.contains(key)) resume.back()[key] = c[key];
  }
  { std::ofstream(dir / "resume.json") << resume.dump(); }
  ASSERT_NO_FATAL_FAILURE(run_dtrain(dir / "resume.json", dir / "resumed.json"));
  out->resumed = json::parse(std::ifstream(dir / "resumed.json"));
  // The same parameters registered in another order (DeepSpeed's files hold them in the saved
  // module's order): each rank still reads only its part, where the engine holds it.
  for (auto& c : resume) c["reordered"] = true;
  { std::ofstream(dir / "resume_reordered.json") << resume.dump(); }
  ASSERT_NO_FATAL_FAILURE(
      run_dtrain(dir / "resume_reordered.json", dir / "resumed_reordered.json"));
  out->resumed_reordered = json::parse(std::ifstream(dir / "resumed_reordered.json"));
  for (int w : {1, 3}) {
    const std::string at = "_at" + std::to_string(w);
    json convert = json::array(), again = json::array();
    for (const auto& c : cases) {
      const std::string to = c["save"].get<std::string>() + at;
      convert.push_back({{"name", c["name"]},
                         {"config", c["config"]},
                         {"resume_from", c["save"]},
                         {"convert_to", to}});
      again.push_back({{"name", c["name"]}, {"config", c["config"]}, {"resume_from", to}});
      for (const char* key : {"freeze", "exclude_frozen"})
        if (c.contains(key)) convert.back()[key] = again.back()[key] = c[key];
    }
    { std::ofstream(dir / ("convert" + at + ".json")) << convert.dump(); }
    { std::ofstream(dir / ("again" + at + ".json")) << again.dump(); }
    ASSERT_NO_FATAL_FAILURE(
        run_dtrain(dir / ("convert" + at + ".json"), dir / ("converted" + at + ".json"), w));
    ASSERT_NO_FATAL_FAILURE(
        run_dtrain(dir / ("again" + at + ".json"), dir / ("resumed" + at + ".json")));
    out->resumed_via[std::to_string(w)] =
        json::parse(std::ifstream(dir / ("resumed" + at + ".json")));
  }
}

// dtrain resuming each case's DeepSpeed checkpoint at 2 ranks (`runs.resumed`), and through
// 1 and 3 ranks (`runs.resumed_via`: loaded there, each rank reading its part of DeepSpeed's
// files, saved, and resumed at 2): each reads the checkpoint's client_state and ends where
// DeepSpeed's uninterrupted run `y` ends (within `bound`), optimizer state included. Returns
// the largest gap.
double expect_resumed_as_deepspeed(const ParityRuns& runs, const std::string& name,
                                   const json& client_state, const json& y, double bound = 1e-5) {
  double gap = 0;
  std::vector<std::pair<std::string, const json*>> resumes = {{"at 2 ranks", &runs.resumed}};
  for (const auto& [w, via] : runs.resumed_via.items())
    resumes.push_back({"at " + w + " ranks (saved there, resumed at 2)", &via});
  resumes.push_back({"at 2 ranks into a module that registers its parameters in another order",
                     &runs.resumed_reordered});
  for (const auto& [how, run] : resumes) {
    SCOPED_TRACE("DeepSpeed's checkpoint loaded " + how);
    if (!run->contains(name)) {
      ADD_FAILURE() << "no resumed run";
      return INFINITY;
    }
    EXPECT_EQ((*run)[name]["client_state"], client_state)
        << "client_state of DeepSpeed's checkpoint, as dtrain's engine read it";
    const double d = max_diff((*run)[name]["params"], y["params"]);
    EXPECT_LT(d, bound) << "resumed from DeepSpeed's checkpoint, ended elsewhere";
    // global_samples read from DeepSpeed's file, then counted on as DeepSpeed counts it.
    const json& samples = (*run)[name]["samples"];
    EXPECT_EQ(samples, json(std::vector<json>(y["samples"].begin() + 5, y["samples"].end())));
    gap = std::max(gap, d);
  }
  return gap;
}

// One case's run on both sides: the losses step by step within `loss_bound` (relative) and the
// final parameters within `param_bound`. Sets the largest gaps of each.
struct Gaps {
  double loss = 0, param = 0;
};
// fn(case, name, dtrain's results, DeepSpeed's) for each case, under its name as a trace; a
// case either side did not write fails the test.
template <class Fn>
void for_each_case(const json& cases, const ParityRuns& runs, Fn&& fn) {
  for (const auto& c : cases) {
    const std::string name = c.at("name");
    SCOPED_TRACE(name);
    ASSERT_TRUE(runs.ours.contains(name) && runs.theirs.contains(name));
    fn(c, name, runs.ours[name], runs.theirs[name]);
  }
}

void expect_same_run(const json& x, const json& y, double loss_bound, double param_bound,
                     const char* step, Gaps* gaps) {
  ASSERT_EQ(x["losses"].size(), y["losses"].size());
  for (size_t k = 0; k < x["losses"].size(); ++k) {
    const double u = x["losses"][k], v = y["losses"][k];
    gaps->loss = std::max(gaps->loss, std::fabs(u - v));
    EXPECT_NEAR(u, v, loss_bound * std::max(1.0, std::fabs(v))) << step << " " << k + 1;
  }
  gaps->param = max_diff(x["params"], y["params"]);
  EXPECT_LT(gaps->param, param_bound) << "parameters apart";
  // get_global_grad_norm() after each step: DeepSpeed's None (null) and inf ("inf") alike, the
  // norms within the losses' bound (relative, at least 1e-5; on libtorch 1.13, whose bf16
  // kernels leave the parameters further apart, 5 times it: the gradients follow them).
  if (!x.contains("norms") || !y.contains("norms")) return;
  EXPECT_EQ(x["applied"], y["applied"]) << "was_step_applied() after each " << step;
  // The counters and calls DeepSpeed scripts read: global_samples after each step,
  // is_gradient_accumulation_boundary() before each backward and after each step, the
  // micro-step counter and get_mom() at the end (Python's ints and floats apart).
  EXPECT_EQ(x["samples"], y["samples"]) << "global_samples after each " << step;
  EXPECT_EQ(x["boundaries"], y["boundaries"]) << "is_gradient_accumulation_boundary()";
  EXPECT_EQ(x["micro_steps"], y["micro_steps"]) << "micro_steps";
  // What backward returned (the loss over the accumulation steps): Python's float of it.
  ASSERT_EQ(x["returned"].size(), y["returned"].size()) << "backward calls";
  for (size_t k = 0; k < x["returned"].size(); ++k)
    EXPECT_NEAR(x["returned"][k].get<double>(), y["returned"][k].get<double>(),
                loss_bound * std::max(1.0, std::fabs(y["returned"][k].get<double>())))
        << "backward " << k + 1 << " returned";
  EXPECT_EQ(x["mom"].dump(), y["mom"].dump()) << "get_mom()";
  EXPECT_EQ(x.value("refused", json()), y.value("refused", json())) << "refused calls";
  ASSERT_EQ(x["norms"].size(), y["norms"].size());
  for (size_t k = 0; k < x["norms"].size(); ++k) {
    const json &a = x["norms"][k], &b = y["norms"][k];
    if (!a.is_number() || !b.is_number()) {
      EXPECT_EQ(a.dump(), b.dump()) << "get_global_grad_norm() after " << step << " " << k + 1;
      continue;
    }
    const double bound = std::max(TORCH_VERSION_MAJOR >= 2 ? loss_bound : 5 * loss_bound, 1e-5);
    EXPECT_NEAR(a.get<double>(), b.get<double>(), bound * std::fabs(b.get<double>()))
        << "get_global_grad_norm() after " << step << " " << k + 1;
  }
}

// Training, then checkpoints both ways: dtrain's read by DeepSpeed's zero_to_fp32 and by
// torch.load(weights_only=True) (stages 1-3); DeepSpeed's (saved after step 5) read by
// `dtrain zero to-fp32` and resumed by dtrain's engine (stages 1-3: parameters, Adam/SGD/Adagrad
// state, steps and scheduler), which then ends where DeepSpeed ended.
TEST(ZeroDeepSpeedParity, TwoRanksStagesOneToThreeTrainAndCheckpointAsDeepSpeed) {
  const fs::path dir = fresh_dir("dtrain-ds-parity");
  json cs = cases();
  for (size_t i = 0; i < cs.size(); ++i) {
    // DeepSpeed's client_state, written by each side and read by the other.
    cs[i]["client_state"] = {{"step", 5},
                             {"case", i},
                             {"loss_history", {0.5, 0.25}},
                             {"sampler", {{"epoch", 1}, {"offset", 40}, {"shuffle", true}}},
                             {"note", nullptr}};
    cs[i]["save_dtrain"] = (dir / ("dtrain_" + std::to_string(i))).string();
    cs[i]["save_16bit"] = (dir / ("dtrain16_" + std::to_string(i))).string();
    cs[i]["save_16bit_ds"] = (dir / ("ds16_" + std::to_string(i))).string();
    cs[i]["read_dtrain"] = cs[i]["save_dtrain"];
    cs[i]["save_dtrain_mid"] = (dir / ("dtrain_mid_" + std::to_string(i))).string();
    cs[i]["resume_dtrain"] = cs[i]["save_dtrain_mid"];
    cs[i]["save"] = (dir / ("ds_" + std::to_string(i))).string();
  }
  ParityRuns runs;
  ASSERT_NO_FATAL_FAILURE(run_both(dir, cs, /*resume_deepspeeds=*/true, &runs));
  std::printf("%-44s %-11s %-9s %-9s %-9s %-9s %-9s %-9s %s\n", "2 ranks, 10 steps, fp32",
              "final loss", "|dloss|", "|dparam|", "DS reads", "to-fp32", "resumed", "DS resumes",
              "16-bit");
  for_each_case(
      cs, runs, [&](const json& c, const std::string& name, const json& x, const json& y) {
        Gaps gaps;
        ASSERT_NO_FATAL_FAILURE(expect_same_run(x, y, 1e-5, 1e-5, "step", &gaps));
        const double loss_diff = gaps.loss, param_diff = gaps.param;
        // dtrain's checkpoint through DeepSpeed's zero_to_fp32, and every file of it through
        // torch.load(weights_only=True): the model file (one per rank at stage 3, as DeepSpeed's)
        // and 2 optimizer files.
        const bool stage3 = c["config"]["zero_optimization"]["stage"] == 3;
        EXPECT_EQ(y.value("weights_only", json("missing")), json(stage3 ? 4 : 3))
            << "torch.load(weights_only=True) of dtrain's files: "
            << y.value("weights_only", json());
        ASSERT_TRUE(y.contains("dtrain_fp32")) << y.value("dtrain_fp32_error", "");
        EXPECT_EQ(y.value("dtrain_client", json()), c["client_state"])
            << "client_state in dtrain's model file, as DeepSpeed reads it";
        // The module in rank 0's model file as DeepSpeed's: whole at stages 1-2, its parameters
        // empty at stage 3 (they are in the optimizer files; nothing is gathered for a save).
        EXPECT_EQ(y.value("dtrain_module_shapes", json()),
                  y.value("ds_module_shapes", json("missing")));
        const double ds_reads = max_diff(y["dtrain_fp32"], x["params"]);
        EXPECT_LT(ds_reads, 1e-7) << "zero_to_fp32 of dtrain's checkpoint";
        // DeepSpeed's checkpoint (after step 5) through `dtrain zero to-fp32`.
        const std::string out = (fs::path(c["save"].get<std::string>()) / "fp32.pt").string();
        auto conv = dtrain::test::run_command(
            {DTRAIN_BIN, "zero", "to-fp32", c["save"].get<std::string>(), out}, {.timeout = 120s});
        ASSERT_EQ(conv.exit_code, 0) << conv.out << conv.err;
        const double to_fp32 =
            max_diff(flat_params(dtrain::zero::load_state_dict_file(out)), y["params_mid"]);
        EXPECT_LT(to_fp32, 1e-7) << "dtrain zero to-fp32 of DeepSpeed's checkpoint";
        // save_16bit_model: dtrain's file next to DeepSpeed's (the same keys in the same order, the
        // values of the same training), and torch.load(weights_only=True) of dtrain's.
        const auto ours16 = dtrain::zero::load_state_dict_file(
            (fs::path(c["save_16bit"].get<std::string>()) / "pytorch_model.bin").string());
        const auto theirs16 = dtrain::zero::load_state_dict_file(
            (fs::path(c["save_16bit_ds"].get<std::string>()) / "pytorch_model.bin").string());
        EXPECT_EQ(ours16.keys(), theirs16.keys());
        const double save16 = max_diff(flat_params(ours16), flat_params(theirs16));
        EXPECT_LT(save16, 1e-5) << "save_16bit_model: dtrain's and DeepSpeed's apart";
        EXPECT_LT(max_diff(y.value("dtrain_16bit", json::object()), flat_params(ours16)), 1e-12)
            << "torch.load of dtrain's 16-bit file";
        const double resumed_diff = expect_resumed_as_deepspeed(runs, name, c["client_state"], y);
        // DeepSpeed's engine resuming dtrain's step-5 checkpoint (its load_checkpoint, with the
        // optimizer state; saved with deepspeed_loss_scaler, which stage 3 needs), ending where
        // DeepSpeed's uninterrupted run ended.
        const json& back = y.value("resumed_dtrain", json::object());
        ASSERT_TRUE(back.contains("global_steps"))
            << "DeepSpeed did not resume dtrain's checkpoint";
        // DeepSpeed 0.19.8 at stage 3 with torch.optim.Adagrad loads no checkpoint into a fresh
        // engine, its own neither (the peer's stage3_torch_adagrad says why): the same error for
        // both, and the load once its param group is as a step leaves it.
        if (back.contains("error") || back.contains("own_error")) {
          EXPECT_EQ(back.value("error", ""), back.value("own_error", ""))
              << "DeepSpeed refuses dtrain's checkpoint otherwise than its own";
          std::printf("%-44s DeepSpeed's own stage-3 Adagrad checkpoint does not load either: %s\n",
                      "", back.value("own_error", "").c_str());
        }
        EXPECT_EQ(back["global_steps"], 5);
        EXPECT_EQ(back["global_samples"], y["samples"][4]) << "global_samples of dtrain's file";
        EXPECT_EQ(back["client_state"], c["client_state"])
            << "client_state as DeepSpeed returns it";
        const double ds_resumed = max_diff(back["params"], y["params"]);
        EXPECT_LT(ds_resumed, 1e-5) << "DeepSpeed resumed dtrain's checkpoint and ended elsewhere";
        std::printf("%-44s %-11.7f %-9.1e %-9.1e %-9.1e %-9.1e %-9.1e %-9.1e %.1e\n", name.c_str(),
                    y["losses"].back().get<double>(), loss_diff, param_diff, ds_reads, to_fp32,
                    resumed_diff, ds_resumed, save16);
      });
  fs::remove_all(dir);
}

// Stage 0 in fp32 with what DeepSpeed builds by name from torch (it hands torch's schedulers its
// optimizer unwrapped only here: under ZeRO, fp16 or bf16 it wraps it, and torch's schedulers
// refuse the wrapper): RMSprop, and torch.optim.lr_scheduler's schedulers, over 10 steps at 2
// ranks; the losses and final parameters agree within float32 noise.
// Frozen parameters (requires_grad false, a fine-tuning's base weights: here the first layer's
// weight and the last layer's bias) in checkpoints of stages 2 and 3. DeepSpeed writes them as
// frozen_param_shapes and frozen_param_fragments: whole at stage 2, each rank's piece at stage 3,
// whose module holds empty placeholders. Both ways: DeepSpeed's zero_to_fp32 and its engine read
// dtrain's files, `dtrain zero to-fp32` and dtrain's engine read DeepSpeed's (at 2 ranks, and
// saved at 1 and 3 ranks, where 352 elements split 118/118/116). Every resuming side starts the
// frozen parameters 1 away from the saved values, so that only the load brings them back. And
// with DeepSpeed's exclude_frozen_parameters (Hugging Face's Trainer saves PEFT models so): the
// same module keys as DeepSpeed's (no frozen parameter), no frozen parameter in either
// zero_to_fp32, and each side resuming the other's with load_module_strict=False, optimizer
// state included.
TEST(ZeroDeepSpeedParity, TwoRanksFrozenParametersInCheckpointsAsDeepSpeed) {
  const fs::path dir = fresh_dir("dtrain-ds-frozen");
  json cs = json::array();
  for (bool exclude : {false, true}) {
    for (int stage : {2, 3}) {
      json config = {{"train_micro_batch_size_per_gpu", 4},
                     {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 0.01}}}}},
                     {"zero_optimization",
                      {{"stage", stage}, {"stage3_gather_16bit_weights_on_model_save", true}}},
                     {"steps_per_print", 1000}};
      const std::string i = std::to_string(stage) + (exclude ? "x" : "");
      cs.push_back(
          {{"name", "stage " + std::to_string(stage) + ", Adam, 0.weight and 2.bias frozen" +
                        (exclude ? ", excluded from saves" : "")},
           {"config", config},
           {"freeze", {"0.weight", "2.bias"}},
           {"exclude_frozen", exclude},
           {"save_dtrain", (dir / ("dtrain_" + i)).string()},
           {"read_dtrain", (dir / ("dtrain_" + i)).string()},
           {"save_dtrain_mid", (dir / ("dtrain_mid_" + i)).string()},
           {"resume_dtrain", (dir / ("dtrain_mid_" + i)).string()},
           {"save", (dir / ("ds_" + i)).string()},
           {"save_16bit", (dir / ("dtrain16_" + i)).string()},
           {"save_16bit_ds", (dir / ("ds16_" + i)).string()}});
    }
  }
  ParityRuns runs;
  ASSERT_NO_FATAL_FAILURE(run_both(dir, cs, /*resume_deepspeeds=*/true, &runs));
  for_each_case(
      cs, runs, [&](const json& c, const std::string& name, const json& x, const json& y) {
        Gaps gaps;
        ASSERT_NO_FATAL_FAILURE(expect_same_run(x, y, 1e-5, 1e-5, "step", &gaps));
        // The frozen parameters did not move, on either side; excluded, they are in no file.
        json trainable = x["params"], trainable_mid = y["params_mid"];
        for (const auto& f : c["freeze"]) {
          const std::string frozen = f;
          EXPECT_EQ(y["params_mid"][frozen], y["params"][frozen]) << frozen;
          EXPECT_EQ(x["params"][frozen], y["params"][frozen]) << frozen;
          if (c["exclude_frozen"]) {
            trainable.erase(frozen);
            trainable_mid.erase(frozen);
          }
        }
        const json& expected = c["exclude_frozen"] ? trainable : x["params"];
        const json& expected_mid = c["exclude_frozen"] ? trainable_mid : y["params_mid"];
        // The module in rank 0's model file: DeepSpeed's keys and shapes.
        EXPECT_EQ(y.value("dtrain_module_shapes", json()),
                  y.value("ds_module_shapes", json("missing")));
        ASSERT_TRUE(y.contains("dtrain_fp32")) << y.value("dtrain_fp32_error", "");
        EXPECT_EQ(y["dtrain_fp32"].size(), expected.size()) << y["dtrain_fp32"].dump();
        EXPECT_LT(max_diff(y["dtrain_fp32"], expected), 1e-7)
            << "DeepSpeed's zero_to_fp32 of dtrain's checkpoint";
        const std::string out = (fs::path(c["save"].get<std::string>()) / "fp32.pt").string();
        auto conv = dtrain::test::run_command(
            {DTRAIN_BIN, "zero", "to-fp32", c["save"].get<std::string>(), out}, {.timeout = 120s});
        ASSERT_EQ(conv.exit_code, 0) << conv.out << conv.err;
        const json ours = flat_params(dtrain::zero::load_state_dict_file(out));
        EXPECT_EQ(ours.size(), expected_mid.size()) << ours.dump();
        EXPECT_LT(max_diff(ours, expected_mid), 1e-7)
            << "dtrain zero to-fp32 of DeepSpeed's checkpoint";
        // save_16bit_model: the same keys as DeepSpeed's (frozen parameters left out when excluded)
        // and the same values.
        const auto ours16 = flat_params(dtrain::zero::load_state_dict_file(
            (fs::path(c["save_16bit"].get<std::string>()) / "pytorch_model.bin").string()));
        const auto theirs16 = flat_params(dtrain::zero::load_state_dict_file(
            (fs::path(c["save_16bit_ds"].get<std::string>()) / "pytorch_model.bin").string()));
        EXPECT_EQ(ours16.size(), theirs16.size()) << ours16.dump();
        EXPECT_EQ(theirs16.size(), expected.size()) << theirs16.dump();
        EXPECT_LT(max_diff(ours16, theirs16), 1e-5) << "save_16bit_model";
        const double resumed = expect_resumed_as_deepspeed(runs, name, json::object(), y);
        const json& back = y.value("resumed_dtrain", json::object());
        ASSERT_TRUE(back.contains("params")) << "DeepSpeed did not resume dtrain's checkpoint";
        const double ds_resumed = max_diff(back["params"], y["params"]);
        EXPECT_LT(ds_resumed, 1e-5) << "DeepSpeed's engine resuming dtrain's checkpoint";
        std::printf("%-62s losses %.1e params %.1e; resumed by dtrain %.1e, by DeepSpeed %.1e\n",
                    name.c_str(), gaps.loss, gaps.param, resumed, ds_resumed);
      });
  fs::remove_all(dir);
}

TEST(ZeroDeepSpeedParity, TwoRanksStageZeroTorchOptimizerAndSchedulersByName) {
  const fs::path dir = fresh_dir("dtrain-ds-parity-byname");
  json cs = json::array();
  auto add = [&](const std::string& name, const json& optimizer, const json& scheduler) {
    json config = {{"train_micro_batch_size_per_gpu", 4},
                   {"optimizer", optimizer},
                   {"zero_optimization", {{"stage", 0}}},
                   {"steps_per_print", 1000}};
    if (!scheduler.is_null()) config["scheduler"] = scheduler;
    cs.push_back({{"name", name}, {"config", config}});
  };
  const json rms = {{"type", "RMSprop"}, {"params", {{"lr", 0.002}, {"momentum", 0.5}}}};
  add("stage 0, RMSprop momentum", rms, nullptr);
  add("stage 0, RMSprop centered + StepLR",
      {{"type", "RMSprop"}, {"params", {{"lr", 0.002}, {"centered", true}}}},
      {{"type", "StepLR"}, {"params", {{"step_size", 3}, {"gamma", 0.5}}}});
  add("stage 0, SGD + OneCycleLR (momentum cycled)", {{"type", "SGD"}, {"params", {{"lr", 0.05}}}},
      {{"type", "OneCycleLR"}, {"params", {{"max_lr", 0.1}, {"total_steps", 12}}}});
  add("stage 0, Adam + CosineAnnealingWarmRestarts", {{"type", "Adam"}, {"params", {{"lr", 0.01}}}},
      {{"type", "CosineAnnealingWarmRestarts"}, {"params", {{"T_0", 3}, {"T_mult", 2}}}});
  add("stage 0, RMSprop + OneCycleLR three_phase", rms,
      {{"type", "OneCycleLR"},
       {"params", {{"max_lr", 0.01}, {"total_steps", 12}, {"three_phase", true}}}});
  ParityRuns runs;
  ASSERT_NO_FATAL_FAILURE(run_both(dir, cs, /*resume_deepspeeds=*/false, &runs));
  std::printf("%-50s %-11s %-9s %s\n", "2 ranks, 10 steps, fp32, stage 0", "final loss", "|dloss|",
              "|dparam|");
  for_each_case(cs, runs,
                [&](const json& c, const std::string& name, const json& x, const json& y) {
                  Gaps gaps;
                  ASSERT_NO_FATAL_FAILURE(expect_same_run(x, y, 1e-5, 1e-5, "step", &gaps));
                  const double loss_diff = gaps.loss, param_diff = gaps.param;
                  std::printf("%-50s %-11.7f %-9.1e %.1e\n", name.c_str(),
                              y["losses"].back().get<double>(), loss_diff, param_diff);
                });
  fs::remove_all(dir);
}

// The bounds of a bf16 case against the peer: the same bf16 operations in the same order on the
// libtorch 2.x tree (losses and parameters equal up to float32 noise). libtorch 1.13's bf16
// kernels round differently from the peer's torch 2.x (the forward and backward themselves):
// there the loss bound is that of bf16's 8-bit mantissa, and the parameters may end a few steps
// apart, 5 x lr (Adam's 0.01: 0.05; Adagrad's 0.05, whose first steps are lr each: 0.25).
constexpr double kBf16LossBound = TORCH_VERSION_MAJOR >= 2 ? 1e-6 : 1e-2;
constexpr double kFp16AutocastLossBound = TORCH_VERSION_MAJOR >= 2 ? 1e-6 : 1e-2;
double bf16_param_bound(const json& config) {
  return TORCH_VERSION_MAJOR >= 2 ? 1e-6 : 5 * config["optimizer"]["params"]["lr"].get<double>();
}

// bf16 with micro-batches at 2 ranks: DeepSpeed reduces the gradients in its communication dtype
// (bf16 unless set) and accumulates them in grad_accum_dtype (bf16 unless set); dtrain rounds
// its fp32 reductions to the same dtypes. Stages 0-3, 2 micro-batches per step, 10 micro-steps.
TEST(ZeroDeepSpeedParity, TwoRanksBf16MicroBatchesAsDeepSpeed) {
  const fs::path dir = fresh_dir("dtrain-ds-parity16");
  json cs = json::array();
  auto add = [&](const std::string& name, int stage, const json& extra) {
    json config = {{"train_micro_batch_size_per_gpu", 4},
                   {"gradient_accumulation_steps", 2},
                   {"bf16", {{"enabled", true}}},
                   {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 0.01}}}}},
                   {"zero_optimization", {{"stage", stage}}},
                   {"steps_per_print", 1000}};
    config.update(extra);
    cs.push_back({{"name", name}, {"config", config}});
  };
  for (int stage = 0; stage <= 3; ++stage)
    add("bf16, stage " + std::to_string(stage), stage, json::object());
  // Stage 0 with offload_optimizer: DeepSpeed's CPU optimizer under its FP16_UnfusedOptimizer
  // (the fused FP16_Optimizer takes FusedAdam only).
  const json offload0 = {
      {"zero_optimization", {{"stage", 0}, {"offload_optimizer", {{"device", "cpu"}}}}}};
  add("bf16, stage 0, offload_optimizer", 0, offload0);
  json adagrad0 = offload0;
  adagrad0["optimizer"] = {{"type", "Adagrad"}, {"params", {{"lr", 0.05}, {"eps", 1e-8}}}};
  add("bf16, stage 0, Adagrad, offload_optimizer", 0, adagrad0);
  const json fp32_accum = {{"data_types", {{"grad_accum_dtype", "fp32"}}}};
  for (int stage = 1; stage <= 3; ++stage)
    add("bf16, stage " + std::to_string(stage) + ", grad_accum_dtype fp32", stage, fp32_accum);
  json fp32_comm = fp32_accum;
  fp32_comm["communication_data_type"] = "fp32";
  add("bf16, stage 1, grad_accum_dtype and communication fp32", 1, fp32_comm);
  add("bf16, stage 2, grad_accum_dtype and communication fp32", 2, fp32_comm);
  ParityRuns runs;
  ASSERT_NO_FATAL_FAILURE(run_both(dir, cs, /*resume_deepspeeds=*/false, &runs));
  std::printf("%-58s %-11s %-9s %s\n", "2 ranks, 10 micro-steps of 2 per step", "final loss",
              "|dloss|", "|dparam|");
  for_each_case(cs, runs,
                [&](const json& c, const std::string& name, const json& x, const json& y) {
                  // The same bf16 operations in the same order: losses equal up to float32 noise
                  // against the peer's torch 2.x, and the bf16 parameters equal (one bf16 rounding
                  // apart would be ~4e-3 here). libtorch 1.13's bf16 kernels round differently (the
                  // forward and backward themselves): there the loss bound is that of bf16's 8-bit
                  // mantissa.
                  Gaps gaps;
                  ASSERT_NO_FATAL_FAILURE(expect_same_run(
                      x, y, kBf16LossBound, bf16_param_bound(c.at("config")), "micro-step", &gaps));
                  const double loss_diff = gaps.loss, param_diff = gaps.param;
                  std::printf("%-58s %-11.7f %-9.1e %.1e\n", name.c_str(),
                              y["losses"].back().get<double>(), loss_diff, param_diff);
                });
  fs::remove_all(dir);
}

// The calls that take the accumulation from DeepSpeed's micro-step counter, two micro-batches
// per step on 2 ranks: no_sync() around the first (stages 0-1, DDP's gradient accumulation),
// set_gradient_accumulation_boundary(false) then (true) (stages 0-3), and
// "managed_gradient_accumulation": false, where each step() is the boundary (stages 0-3). The
// losses, parameters, global_samples, is_gradient_accumulation_boundary() before each backward
// and after each step, and which misuses both refuse (no_sync at stages 2-3, step() or a second
// guard inside no_sync, the boundary set in unmanaged mode). And DeepSpeed's batch-size warm-up
// (set_train_batch_size, set_train_micro_batch_size) in the usual one-micro-batch loop, and the
// module's zero_grad() between micro-batches.
TEST(ZeroDeepSpeedParity, TwoRanksAccumulationControlsAsDeepSpeed) {
  const fs::path dir = fresh_dir("dtrain-ds-parity-accum");
  json cs = json::array();
  auto add = [&](const std::string& mode, int stage, int gas, const json& extra, const json& probes,
                 const std::string& what = "") {
    json config = {{"train_micro_batch_size_per_gpu", 4},
                   {"gradient_accumulation_steps", gas},
                   {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 0.01}}}}},
                   {"zero_optimization", {{"stage", stage}}},
                   {"steps_per_print", 1000}};
    config.merge_patch(extra);
    if (mode == "unmanaged") config["managed_gradient_accumulation"] = false;
    cs.push_back({{"name", mode + ", stage " + std::to_string(stage) + ", gas " +
                               std::to_string(gas) + what},
                  {"config", config},
                  {"mode", mode},
                  {"probes", probes}});
  };
  const json overlap = {{"zero_optimization", {{"overlap_comm", true}}}};
  const json bf16 = {{"bf16", {{"enabled", true}}}};
  const json in_guard = {"step_in_no_sync", "nested_no_sync"};
  add("no_sync", 0, 1, json::object(), in_guard);
  add("no_sync", 1, 1, json::object(), in_guard);
  // DeepSpeed 0.19.8 fails at stage 1 with overlap_comm: its hooks reduce inside the guard, and
  // the next backward asserts ("The parameter 2.bias has already been reduced"). dtrain's
  // buckets reduce the sum once, ending where DeepSpeed ends without overlap_comm.
  add("no_sync", 1, 1, overlap, in_guard, ", overlap_comm");
  cs.back()["peer_config"] = cs[cs.size() - 2]["config"];
  add("no_sync", 1, 2, json::object(), json::array());
  add("no_sync", 1, 1, bf16, json::array(), ", bf16");
  add("no_sync", 0, 2, bf16, json::array(), ", bf16");
  for (int stage = 0; stage <= 3; ++stage)
    add("set_boundary", stage, 2, json::object(), stage >= 2 ? json{"no_sync"} : json::array());
  add("set_boundary", 2, 2, overlap, json::array(), ", overlap_comm");
  add("set_boundary", 1, 2, bf16, json::array(), ", bf16");
  for (int stage = 0; stage <= 3; ++stage)
    add("unmanaged", stage, 2, json::object(), json{"set_boundary"});
  add("unmanaged", 1, 1, json::object(), json::array());
  add("unmanaged", 2, 2, overlap, json::array(), ", overlap_comm");
  add("unmanaged", 1, 2, bf16, json::array(), ", bf16");
  // The module's zero_grad() after the first micro-batch's step(): stages 0-1 drop its gradient
  // (it lives in .grad until the boundary; with bf16's fp32 accumulation it is added in already),
  // stages 2-3 have reduced it in its backward. SGD with momentum here: Adam's first update of a
  // gradient near its eps (one weight's is 1.8e-8 here) turns libtorch 1.13's last-bit
  // differences into 4e-4 of that weight.
  const json sgd = {{"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.1}, {"momentum", 0.9}}}}},
                    {"zero_allow_untested_optimizer", true}};
  json sgd_bf16 = sgd;
  sgd_bf16["bf16"] = {{"enabled", true}};
  json sgd_bf16_fp32 = sgd_bf16;
  sgd_bf16_fp32["data_types"] = {{"grad_accum_dtype", "fp32"}};
  for (int stage = 0; stage <= 3; ++stage) add("zero_grad", stage, 2, sgd, json::array());
  add("zero_grad", 1, 2, sgd_bf16, json::array(), ", bf16");
  add("zero_grad", 1, 2, sgd_bf16_fp32, json::array(), ", bf16, grad_accum_dtype fp32");
  add("zero_grad", 0, 2, sgd_bf16, json::array(), ", bf16");
  // The engine's own zero_grad() there (every .grad to None, whatever the module's default).
  for (int stage = 0; stage <= 3; ++stage) add("engine_zero_grad", stage, 2, sgd, json::array());
  add("engine_zero_grad", 1, 2, sgd_bf16_fp32, json::array(), ", bf16, grad_accum_dtype fp32");
  // backward(loss, retain_graph=True), step(), and backward through the same graph again; and
  // backward(loss, scale_wrt_gas=False) (the loss not divided by the 2 accumulation steps).
  // DeepSpeed 0.19.8 fails at stage 3: the second backward meets its released parameters ("The
  // size of tensor a (0) must match the size of tensor b (22)"). dtrain's graph holds what it
  // gathered, ending where DeepSpeed's stage 2 ends.
  for (int stage = 0; stage <= 3; ++stage)
    add("retain_graph", stage, 2, json::object(), json::array());
  cs.back()["peer_config"] = cs[cs.size() - 2]["config"];
  for (int stage : {0, 2}) {
    add("set_boundary", stage, 2, json::object(), json::array(), ", scale_wrt_gas false");
    cs.back()["scale_wrt_gas"] = false;
  }
  // Batch-size warm-up: set_train_batch_size(16) before step 3 (2 accumulation steps from
  // there), set_train_micro_batch_size(2) before step 7 (global_samples counts 8 a step).
  for (int stage = 0; stage <= 3; ++stage) {
    add("resize", stage, 1, json::object(), json{"bad_train_batch_size"});
    cs.back()["mode"] = "";
    cs.back()["resize"] = {{{"at", 3}, {"train_batch_size", 16}},
                           {{"at", 7}, {"micro_batch_size", 2}}};
  }
  // Refused by both when the engine is built: overlap_comm in unmanaged mode below stage 2.
  const std::set<std::string> refused = {"unmanaged, stage 0, gas 2, overlap_comm",
                                         "unmanaged, stage 1, gas 2, overlap_comm"};
  add("unmanaged", 0, 2, overlap, json::array(), ", overlap_comm");
  add("unmanaged", 1, 2, overlap, json::array(), ", overlap_comm");
  ParityRuns runs;
  ASSERT_NO_FATAL_FAILURE(run_both(dir, cs, /*resume_deepspeeds=*/false, &runs));
  std::printf("%-44s %-11s %-9s %-9s %s\n", "2 ranks, 10 steps of 2 micro-batches", "final loss",
              "|dloss|", "|dparam|", "global_samples");
  for_each_case(
      cs, runs, [&](const json& c, const std::string& name, const json& x, const json& y) {
        if (refused.count(name) || y.contains("init_refused")) {
          EXPECT_TRUE(refused.count(name)) << y;
          EXPECT_TRUE(y.contains("init_refused")) << "DeepSpeed built it";
          ASSERT_TRUE(x.contains("init_refused")) << "dtrain built it";
          EXPECT_NE(x["init_refused"].get<std::string>().find("overlap_comm"), std::string::npos);
          std::printf("%-44s refused by both: %s\n", name.c_str(),
                      y["init_refused"].get<std::string>().c_str());
          return;
        }
        const bool is_bf16 = c["config"].contains("bf16");
        Gaps gaps;
        ASSERT_NO_FATAL_FAILURE(expect_same_run(x, y, is_bf16 ? kBf16LossBound : 1e-6,
                                                is_bf16 ? bf16_param_bound(c.at("config")) : 1e-6,
                                                "step", &gaps));
        std::printf("%-44s %-11.7f %-9.1e %-9.1e %s\n", name.c_str(),
                    y["losses"].back().get<double>(), gaps.loss, gaps.param,
                    y["samples"].back().dump().c_str());
      });
  fs::remove_all(dir);
}

// torch_autocast: DeepSpeed runs the engine's forward under torch.autocast in the section's dtype
// (its autocast_if_enabled), the parameters and optimizer in fp32; at stages 1-3 it reduces the
// gradients of the lower_precision_safe_modules' parameters (Linear and Conv unless listed) in
// that dtype and the rest in their own, whatever communication_data_type says (with no dtype
// given, every gradient in its own). Stages 0-3 in bf16 (stage 3's Sequential through
// zero3_linear), with offload, micro-batches, the module list, communication_data_type, and off.
TEST(ZeroDeepSpeedParity, TwoRanksTorchAutocastAsDeepSpeed) {
  const fs::path dir = fresh_dir("dtrain-ds-parity-autocast");
  json cs = json::array();
  auto add = [&](const std::string& name, int stage, const json& autocast, const json& extra) {
    json config = {{"train_micro_batch_size_per_gpu", 4},
                   {"torch_autocast", autocast},
                   {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 0.01}}}}},
                   {"zero_optimization", {{"stage", stage}}},
                   {"steps_per_print", 1000}};
    config.update(extra);
    cs.push_back({{"name", name}, {"config", config}});
  };
  const json bf16 = {{"enabled", true}, {"dtype", "bfloat16"}};
  for (int stage = 0; stage <= 3; ++stage)
    add("autocast bf16, stage " + std::to_string(stage), stage, bf16, json::object());
  add("autocast bf16, stage 3, offload both", 3, bf16,
      {{"zero_optimization",
        {{"stage", 3},
         {"offload_optimizer", {{"device", "cpu"}}},
         {"offload_param", {{"device", "cpu"}}}}}});
  // save_16bit_model with every parameter partitioned (gathered for the save, the marked ones
  // in bf16 at DeepSpeed's all-gather): DeepSpeed's file holds them unrounded, as dtrain's.
  add("autocast bf16, stage 3, save_16bit_model, none persistent", 3, bf16,
      {{"zero_optimization",
        {{"stage", 3},
         {"stage3_param_persistence_threshold", 0},
         {"stage3_gather_16bit_weights_on_model_save", true}}}});
  cs.back()["save_16bit"] = (dir / "dtrain16").string();
  cs.back()["save_16bit_ds"] = (dir / "ds16").string();
  add("autocast, no dtype (cpu: bf16), stage 2", 2, {{"enabled", true}}, json::object());
  add("autocast bf16, stage 1, offload_optimizer", 1, bf16,
      {{"zero_optimization", {{"stage", 1}, {"offload_optimizer", {{"device", "cpu"}}}}}});
  add("autocast bf16, stage 2, 2 micro-batches", 2, bf16, {{"gradient_accumulation_steps", 2}});
  add("autocast bf16, stage 2, overlap_comm", 2, bf16,
      {{"zero_optimization", {{"stage", 2}, {"overlap_comm", true}, {"reduce_bucket_size", 100}}}});
  json conv_only = bf16;
  conv_only["lower_precision_safe_modules"] = {"torch.nn.Conv2d"};
  add("autocast bf16, stage 2, modules Conv2d only", 2, conv_only, json::object());
  add("autocast bf16, stage 1, Conv2d only, communication bf16", 1, conv_only,
      {{"communication_data_type", "bf16"}});
  add("autocast off, dtype bf16, stage 2", 2, {{"enabled", false}, {"dtype", "bf16"}},
      json::object());
  ParityRuns runs;
  ASSERT_NO_FATAL_FAILURE(run_both(dir, cs, /*resume_deepspeeds=*/false, &runs));
  const json& a = runs.ours;
  std::printf("%-58s %-11s %-9s %s\n", "2 ranks, 10 steps", "final loss", "|dloss|", "|dparam|");
  for_each_case(
      cs, runs, [&](const json& c, const std::string& name, const json& x, const json& y) {
        // The same autocast casts and kernels against the peer's torch 2.x (fp32 parameters):
        // equal up to float32 noise; libtorch 1.13's bf16 kernels round differently (see above).
        const bool off = name.rfind("autocast off", 0) == 0;
        Gaps gaps;
        ASSERT_NO_FATAL_FAILURE(expect_same_run(x, y, off ? 1e-5 : kBf16LossBound,
                                                off ? 1e-5 : bf16_param_bound(c.at("config")),
                                                "step", &gaps));
        std::printf("%-58s %-11.7f %-9.1e %.1e\n", name.c_str(), y["losses"].back().get<double>(),
                    gaps.loss, gaps.param);
      });
  // Autocast changed the run: its losses are not the fp32 run's.
  EXPECT_NE(a["autocast bf16, stage 2"]["losses"],
            a["autocast off, dtype bf16, stage 2"]["losses"]);
  const auto ours16 =
      dtrain::zero::load_state_dict_file((dir / "dtrain16" / "pytorch_model.bin").string());
  const auto theirs16 =
      dtrain::zero::load_state_dict_file((dir / "ds16" / "pytorch_model.bin").string());
  EXPECT_EQ(ours16.keys(), theirs16.keys());
  EXPECT_LT(max_diff(flat_params(ours16), flat_params(theirs16)),
            TORCH_VERSION_MAJOR >= 2 ? 1e-6 : 1e-2)
      << "save_16bit_model under torch_autocast: dtrain's and DeepSpeed's apart";
  fs::remove_all(dir);
}

// fp16 torch_autocast: DeepSpeed scales the loss with torch.amp.GradScaler (2^16 to start). Its
// stage-0 engine all-reduces the scaled fp32 gradients, unscales them before it clips, and skips
// the step after an inf with the scale halved (the scheduler steps, no step counted as skipped).
// Its ZeRO optimizers (stages 1-3) reduce the marked gradients in fp16 still scaled, clip by the
// scaled norm, skip a step whose norm is not finite (counted, and the scale left as it is), and
// unscale in the GradScaler's step; without the norm (compute_grad_norm false) each rank checks
// its own partition and skips alone. "loss_mult" 100 makes the scaled gradients overflow fp16 in
// the autocast ops' backward (and in the reduction at stage 2).
TEST(ZeroDeepSpeedParity, TwoRanksFp16TorchAutocastAsDeepSpeed) {
  const fs::path dir = fresh_dir("dtrain-ds-parity-autocast16");
  json cs = json::array();
  auto add = [&](const std::string& name, int stage, const json& extra, const json& knobs = {}) {
    json config = {{"train_micro_batch_size_per_gpu", 4},
                   {"torch_autocast", {{"enabled", true}, {"dtype", "fp16"}}},
                   {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 0.01}}}}},
                   {"zero_optimization", {{"stage", stage}}},
                   {"gradient_clipping", 0.0},
                   {"steps_per_print", 1000}};
    config.update(extra);
    json c = {{"name", name}, {"config", config}};
    if (!knobs.is_null()) c.update(knobs);
    cs.push_back(c);
  };
  for (int stage = 0; stage <= 3; ++stage)
    add("autocast fp16, stage " + std::to_string(stage), stage, json::object());
  for (int stage : {0, 2, 3})
    add("autocast fp16, stage " + std::to_string(stage) + ", clipping 0.5", stage,
        {{"gradient_clipping", 0.5}});
  add("autocast fp16, stage 1, offload_optimizer", 1,
      {{"zero_optimization", {{"stage", 1}, {"offload_optimizer", {{"device", "cpu"}}}}}});
  add("autocast fp16, stage 3, offload both, 3 sub-groups", 3,
      {{"zero_optimization",
        {{"stage", 3},
         {"sub_group_size", 150},
         {"offload_optimizer", {{"device", "cpu"}}},
         {"offload_param", {{"device", "cpu"}}}}}});
  add("autocast fp16, stage 2, 3 micro-batches", 2, {{"gradient_accumulation_steps", 3}});
  add("autocast fp16, stage 2, overlap_comm", 2,
      {{"zero_optimization", {{"stage", 2}, {"overlap_comm", true}, {"reduce_bucket_size", 100}}}});
  add("autocast fp16, stage 2, compute_grad_norm false", 2,
      {{"zero_optimization", {{"stage", 2}, {"compute_grad_norm", false}}}});
  add("autocast fp16, stage 2, loss x 100 (fp16 overflow: skipped)", 2, json::object(),
      {{"loss_mult", 100}});
  const std::string backs_off_name = "autocast fp16, stage 0, loss x 100 (the scale backs off)";
#if TORCH_VERSION_MAJOR >= 2
  add(backs_off_name, 0,
      {{"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 4}}}}}},
      {{"loss_mult", 100}});
  add("autocast fp16, stage 2, no norm, loss x 100 (each rank checks its own partition)", 2,
      {{"zero_optimization", {{"stage", 2}, {"compute_grad_norm", false}}}}, {{"loss_mult", 100}});
#else
  std::printf(
      "libtorch 1.13: its CPU autocast has no fp16 (the forward runs in fp32), so the two cases "
      "whose fp16 activations' gradients overflow run on the libtorch 2.x build only\n");
#endif
  ParityRuns runs;
  ASSERT_NO_FATAL_FAILURE(run_both(dir, cs, /*resume_deepspeeds=*/false, &runs));
  const json &a = runs.ours, &b = runs.theirs;
  std::printf("%-68s %-11s %-9s %-8s %-7s %s\n", "2 ranks, 10 steps", "final loss", "|dloss|",
              "|dparam|", "skipped", "scale");
  for_each_case(
      cs, runs, [&](const json& c, const std::string& name, const json& x, const json& y) {
        // libtorch 1.13's CPU autocast takes bf16 only (torch.autocast turns itself off for fp16):
        // its forward runs in fp32 where the peer's torch 2.x runs fp16.
        Gaps gaps;
        ASSERT_NO_FATAL_FAILURE(expect_same_run(
            x, y, kFp16AutocastLossBound, TORCH_VERSION_MAJOR >= 2 ? 1e-6 : 1e-2, "step", &gaps));
        EXPECT_EQ(x["skipped_steps"], y["skipped_steps"]);
        EXPECT_EQ(x["amp_scale"], y["amp_scale"]);
        std::printf("%-68s %-11.7f %-9.1e %-8.1e %-7d %g\n", name.c_str(),
                    y["losses"].back().get<double>(), gaps.loss, gaps.param,
                    y["skipped_steps"].get<int>(), y["amp_scale"].get<double>());
      });
  // The overflow cases did what they are there for.
  if (TORCH_VERSION_MAJOR >= 2) {
    const json& backs_off = b[backs_off_name];
    EXPECT_LT(backs_off["amp_scale"], 65536.0);
    EXPECT_LT(backs_off["losses"].back(), backs_off["losses"].front());  // and then it trains
  }
  EXPECT_EQ(b["autocast fp16, stage 2, loss x 100 (fp16 overflow: skipped)"]["skipped_steps"], 10);
  EXPECT_NE(a["autocast fp16, stage 2"]["losses"],
            a["autocast fp16, stage 2, clipping 0.5"]["losses"]);
  fs::remove_all(dir);
}

// bf16 at stage 0: DeepSpeed wraps its basic optimizer (FusedAdam in FP16_Optimizer, one flat
// fp32 group; its CPU optimizers under offload_optimizer in FP16_UnfusedOptimizer, fp32 copies
// per parameter) and saves the wrapper's state_dict as the model file's "optimizer". Each side
// resumes the other's step-5 checkpoint and ends where the uninterrupted run of the other ends.
TEST(ZeroDeepSpeedParity, TwoRanksBf16StageZeroCheckpointsBothWaysAsDeepSpeed) {
  const fs::path dir = fresh_dir("dtrain-ds-parity16ck");
  json cs = json::array();
  auto add = [&](const std::string& name, const json& optimizer, bool offload) {
    json config = {{"train_micro_batch_size_per_gpu", 4},
                   {"bf16", {{"enabled", true}}},
                   {"optimizer", optimizer},
                   {"zero_optimization", {{"stage", 0}}},
                   {"steps_per_print", 1000}};
    if (offload) config["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
    cs.push_back({{"name", name}, {"config", config}});
  };
  const json adam = {{"type", "Adam"}, {"params", {{"lr", 0.01}, {"weight_decay", 0.01}}}};
  add("bf16, stage 0, Adam (FP16_Optimizer)", adam, false);
  add("bf16, stage 0, Adam, offload_optimizer (FP16_UnfusedOptimizer)", adam, true);
  add("bf16, stage 0, Adagrad, offload_optimizer",
      {{"type", "Adagrad"}, {"params", {{"lr", 0.05}, {"eps", 1e-8}}}}, true);
  for (size_t i = 0; i < cs.size(); ++i) {
    cs[i]["client_state"] = {{"step", 5}, {"case", i}};
    cs[i]["save_dtrain_mid"] = (dir / ("dtrain_mid_" + std::to_string(i))).string();
    cs[i]["resume_dtrain"] = cs[i]["save_dtrain_mid"];
    cs[i]["save"] = (dir / ("ds_" + std::to_string(i))).string();
  }
  ParityRuns runs;
  ASSERT_NO_FATAL_FAILURE(run_both(dir, cs, /*resume_deepspeeds=*/true, &runs));
  std::printf("%-62s %-11s %-9s %-9s %-9s %s\n", "2 ranks, 10 steps, bf16", "final loss", "|dloss|",
              "|dparam|", "resumed", "DS resumes");
  for_each_case(
      cs, runs, [&](const json& c, const std::string& name, const json& x, const json& y) {
        const double bound = bf16_param_bound(c.at("config"));
        Gaps gaps;
        ASSERT_NO_FATAL_FAILURE(expect_same_run(x, y, kBf16LossBound, bound, "step", &gaps));
        // dtrain from DeepSpeed's checkpoint: the fp32 master and the optimizer state read from the
        // wrapper's keys (the 16-bit module alone would end elsewhere).
        const double resumed_diff =
            expect_resumed_as_deepspeed(runs, name, c["client_state"], y, bound);
        // DeepSpeed's own load_checkpoint of dtrain's (its wrapper's load_state_dict).
        const json& back = y.value("resumed_dtrain", json::object());
        ASSERT_TRUE(back.contains("global_steps"))
            << "DeepSpeed did not resume dtrain's checkpoint";
        EXPECT_EQ(back["global_steps"], 5);
        EXPECT_EQ(back["global_samples"], y["samples"][4]) << "global_samples of dtrain's file";
        const double ds_resumed = max_diff(back["params"], y["params"]);
        EXPECT_LT(ds_resumed, bound) << "DeepSpeed resumed dtrain's checkpoint and ended elsewhere";
        std::printf("%-62s %-11.7f %-9.1e %-9.1e %-9.1e %.1e\n", name.c_str(),
                    y["losses"].back().get<double>(), gaps.loss, gaps.param, resumed_diff,
                    ds_resumed);
      });
  fs::remove_all(dir);
}

// What DeepSpeed 0.19.8 runs and dtrain refused before: offload_optimizer at stage 0 (its CPU
// optimizer - DeepSpeedCPUAdam, DeepSpeedCPUAdagrad, DeepSpeedCPULion - over the whole model;
// checkpoints in its stage-0 layout, the optimizer state in the model file), and Lion without
// offload_optimizer (FusedLion, a CUDA kernel: the peer runs its update written in torch ops in
// its place, reference_fused_lion) at stages 0-3. The same equality as the cases above, each
// side resuming the other's step-5 checkpoint.
TEST(ZeroDeepSpeedParity, TwoRanksStageZeroOffloadAndFusedLionAsDeepSpeed) {
  const fs::path dir = fresh_dir("dtrain-ds-parity0");
  const json offload = {{"device", "cpu"}};
  const json lion = {{"type", "Lion"},
                     {"params", {{"lr", 0.002}, {"betas", {0.9, 0.99}}, {"weight_decay", 0.01}}}};
  json cs = json::array();
  auto add = [&](const std::string& name, int stage, const json& optimizer, bool cpu,
                 const json& scheduler = nullptr) {
    json config = {{"train_micro_batch_size_per_gpu", 4},
                   {"optimizer", optimizer},
                   {"zero_optimization", {{"stage", stage}}},
                   {"zero_allow_untested_optimizer", true},  // the peer's stand-in FusedLion
                   {"steps_per_print", 1000}};
    if (cpu) config["zero_optimization"]["offload_optimizer"] = offload;
    if (!scheduler.is_null()) config["scheduler"] = scheduler;
    cs.push_back({{"name", name}, {"config", config}});
  };
  add("stage 0, Adam, offload_optimizer", 0,
      {{"type", "Adam"}, {"params", {{"lr", 0.01}, {"weight_decay", 0.05}}}}, true);
  add("stage 0, AdamW + WarmupLR, offload_optimizer", 0,
      {{"type", "AdamW"}, {"params", {{"lr", 0.01}, {"weight_decay", 0.01}}}}, true,
      {{"type", "WarmupLR"}, {"params", {{"warmup_min_lr", 0.001}, {"warmup_num_steps", 5}}}});
  add("stage 0, Adagrad, offload_optimizer", 0,
      {{"type", "Adagrad"}, {"params", {{"lr", 0.05}, {"weight_decay", 0.001}, {"eps", 1e-8}}}},
      true);
  add("stage 0, Lion, offload_optimizer", 0, lion, true);
  for (int stage = 0; stage <= 3; ++stage)
    add("stage " + std::to_string(stage) + ", Lion (FusedLion)", stage, lion, false);
  for (size_t i = 0; i < cs.size(); ++i) {
    cs[i]["client_state"] = {{"step", 5}, {"case", i}};
    cs[i]["save_dtrain"] = (dir / ("dtrain_" + std::to_string(i))).string();
    cs[i]["read_dtrain"] = cs[i]["save_dtrain"];
    cs[i]["save_dtrain_mid"] = (dir / ("dtrain_mid_" + std::to_string(i))).string();
    cs[i]["resume_dtrain"] = cs[i]["save_dtrain_mid"];
    cs[i]["save"] = (dir / ("ds_" + std::to_string(i))).string();
  }
  ParityRuns runs;
  ASSERT_NO_FATAL_FAILURE(run_both(dir, cs, /*resume_deepspeeds=*/true, &runs));
  const json &a = runs.ours, &b = runs.theirs;
  std::printf("%-44s %-11s %-9s %-9s %-9s %-9s %s\n", "2 ranks, 10 steps, fp32", "final loss",
              "|dloss|", "|dparam|", "DS reads", "resumed", "DS resumes");
  for_each_case(
      cs, runs, [&](const json& c, const std::string& name, const json& x, const json& y) {
        Gaps gaps;
        ASSERT_NO_FATAL_FAILURE(expect_same_run(x, y, 1e-5, 1e-5, "step", &gaps));
        const double loss_diff = gaps.loss, param_diff = gaps.param;
        const int stage = c["config"]["zero_optimization"]["stage"];
        // Every file of dtrain's checkpoint through torch.load(weights_only=True) (stage 0: the
        // model file, with DeepSpeed's "optimizer", and dtrain's 2 optimizer files); at stages 1-3
        // the checkpoint through DeepSpeed's zero_to_fp32 too (which reads no stage-0 checkpoint).
        EXPECT_EQ(y.value("weights_only", json("missing")), json(stage == 3 ? 4 : 3))
            << "torch.load(weights_only=True) of dtrain's files: "
            << y.value("weights_only", json());
        double ds_reads = 0;
        if (stage > 0) {
          ASSERT_TRUE(y.contains("dtrain_fp32")) << y.value("dtrain_fp32_error", "");
          ds_reads = max_diff(y["dtrain_fp32"], x["params"]);
          EXPECT_LT(ds_reads, 1e-7) << "zero_to_fp32 of dtrain's checkpoint";
        }
        EXPECT_EQ(y.value("dtrain_client", json()), c["client_state"]);
        const double resumed_diff = expect_resumed_as_deepspeed(runs, name, c["client_state"], y);
        const json& back = y.value("resumed_dtrain", json::object());
        ASSERT_TRUE(back.contains("global_steps"))
            << "DeepSpeed did not resume dtrain's checkpoint";
        EXPECT_EQ(back["global_steps"], 5);
        EXPECT_EQ(back["global_samples"], y["samples"][4]) << "global_samples of dtrain's file";
        const double ds_resumed = max_diff(back["params"], y["params"]);
        EXPECT_LT(ds_resumed, 1e-5) << "DeepSpeed resumed dtrain's checkpoint and ended elsewhere";
        std::printf("%-44s %-11.7f %-9.1e %-9.1e %-9.1e %-9.1e %.1e\n", name.c_str(),
                    y["losses"].back().get<double>(), loss_diff, param_diff, ds_reads, resumed_diff,
                    ds_resumed);
      });
  // FusedLion and DeepSpeedCPULion compute the same update but for rounding (the CPU Lion fuses
  // its multiply-adds) and the sign of an exactly-zero interpolation: over these 10 steps they
  // end together.
  const double lions = max_diff(a["stage 0, Lion (FusedLion)"]["params"],
                                b["stage 0, Lion, offload_optimizer"]["params"]);
  std::printf("FusedLion (dtrain) against DeepSpeedCPULion (DeepSpeed), stage 0: |dparam| %.1e\n",
              lions);
  EXPECT_LT(lions, 1e-5);
  fs::remove_all(dir);
}

}  // namespace
