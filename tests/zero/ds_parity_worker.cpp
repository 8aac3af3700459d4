// dtrain's ZeRO engine training the model of tests/zero/deepspeed_parity_peer.py (the same
// formulas for the initial weights, the data and each rank's rows) for every case of CASES.json;
// run under `dtrain run --nproc-per-node N`. Rank 0 writes
// {name: {"losses": [mean over ranks per step], "params": {name: [...]}, "skipped_steps", "norms"
// (get_global_grad_norm() after each step: null for nullopt, "inf"), "applied"
// (was_step_applied() after each step),
// "amp_scale" (fp16 torch_autocast: the GradScaler's scale), "samples" (global_samples() after
// each step), "boundaries" (is_gradient_accumulation_boundary() before each backward and after
// each step), "returned" (what each backward returned), "micro_steps", "mom" (get_mom()),
// "refused" ({probe: refused?})}} to OUT.json; "loss_mult": the loss times this into backward;
// "mode", "resize", "scale_wrt_gas" and "probes" as the peer's; for
// a config dtrain refuses {"init_refused": the ConfigError's text}. A case with "reordered": true
// trains a module with model()'s values and names whose parameters are registered in another order.
// A case with "save_dtrain": DIR saves the engine's checkpoint there after the last step (with the
// case's "client_state"), "save_dtrain_mid": DIR after step 5; with "resume_from": DIR (a DeepSpeed
// checkpoint saved after step 5) the case loads it and trains steps 6-10 only; "client_state" in
// the output is what the engine read of the checkpoint's client_state; with "save_16bit": DIR,
// save_16bit_model writes DIR/pytorch_model.bin after the last step; with "convert_to": DIR beside
// "resume_from", the loaded checkpoint is saved into DIR (at this run's world size, its
// client_state kept) and no step is taken. "freeze": names of parameters set requires_grad
// false before the engine is built (not the engine's, as a fine-tuning's base weights); a case
// that resumes starts them 1 away from model()'s values, so that only the load brings them back.
// "exclude_frozen": every save with exclude_frozen_parameters, every load with
// load_module_strict false, and no frozen parameter moved away.
//   ds_parity_worker CASES.json OUT.json
#include <cmath>
#include <fstream>

#include "dtrain/dtrain.h"

namespace {

constexpr int kSteps = 10, kMicro = 4;

torch::nn::Sequential model() {
  torch::nn::Sequential m(torch::nn::Linear(16, 22), torch::nn::Tanh(), torch::nn::Linear(22, 4));
  torch::NoGradGuard ng;
  int k = 0;
  for (auto& p : m->parameters()) {
    std::vector<float> v(static_cast<size_t>(p.numel()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(0.3 * std::sin(0.37 * i + k));
    p.copy_(torch::tensor(v).view(p.sizes()));
    ++k;
  }
  return m;
}

// model()'s network and values with its parameters registered in another order ("2" before
// "0": 2.weight, 2.bias, 0.weight, 0.bias), the names the same.
struct ReorderedImpl : torch::nn::Module {
  ReorderedImpl() {
    second = register_module("2", torch::nn::Linear(22, 4));
    first = register_module("0", torch::nn::Linear(16, 22));
    torch::NoGradGuard ng;
    auto values = model()->named_parameters();
    for (auto& item : named_parameters()) item.value().copy_(values[item.key()]);
  }
  torch::Tensor forward(const torch::Tensor& x) { return second(torch::tanh(first(x))); }
  torch::nn::Linear first{nullptr}, second{nullptr};
};
TORCH_MODULE(Reordered);

std::pair<torch::Tensor, torch::Tensor> batch(int step, int rank, int world) {
  const int first = (step * world + rank) * kMicro;
  std::vector<float> x;
  std::vector<int64_t> y;
  for (int r = 0; r < kMicro; ++r) {
    for (int j = 0; j < 16; ++j)
      x.push_back(static_cast<float>(std::cos(0.05 * ((first + r) * 16 + j))));
    y.push_back((first + r) % 4);
  }
  return {torch::tensor(x).view({kMicro, 16}), torch::tensor(y)};
}

}  // namespace

// Whether the engine refuses each of the case's "probes" (a UsageError), as the peer's
// refusals() asks DeepSpeed.
template <typename E>
nlohmann::json refusals(E& engine, const nlohmann::json& probes) {
  auto refused = [](auto&& fn) {
    try {
      fn();
      return false;
    } catch (const dtrain::UsageError&) {
      return true;
    }
  };
  nlohmann::json out = nlohmann::json::object();
  for (const std::string probe : probes) {
    if (probe == "no_sync")
      out[probe] = refused([&] { auto guard = engine.no_sync(); });
    else if (probe == "step_in_no_sync")
      out[probe] = refused([&] {
        auto guard = engine.no_sync();
        engine.step();
      });
    else if (probe == "nested_no_sync")
      out[probe] = refused([&] {
        auto guard = engine.no_sync();
        auto inner = engine.no_sync();
      });
    else if (probe == "set_boundary")
      out[probe] = refused([&] { engine.set_gradient_accumulation_boundary(true); });
    else if (probe == "bad_train_batch_size")
      out[probe] = refused([&] { engine.set_train_batch_size(13); });
    else
      throw std::runtime_error("unknown probe " + probe);
  }
  return out;
}

// One case of CASES.json on the module `m` (its fresh values), into `out`.
template <typename Module>
void run_case(const nlohmann::json& cs, Module m, dtrain::ProcessGroup& pg, nlohmann::json& out) {
  // "exclude_frozen": saved with DeepSpeed's exclude_frozen_parameters, loaded non-strict.
  const bool exclude = cs.value("exclude_frozen", false);
  for (const auto& name : cs.value("freeze", nlohmann::json::array())) {
    torch::Tensor p = m->named_parameters()[name.get<std::string>()];
    p.set_requires_grad(false);
    torch::NoGradGuard ng;
    if (cs.contains("resume_from") && !exclude) p.add_(1.0);
  }
  auto engine = dtrain::zero::initialize(m, cs.at("config"));
  std::vector<double> losses;
  nlohmann::json norms = nlohmann::json::array(), applied = nlohmann::json::array(),
                 samples = nlohmann::json::array(), boundaries = nlohmann::json::array(),
                 returned = nlohmann::json::array();
  const dtrain::zero::BackwardOptions plain{.scale_wrt_gas = cs.value("scale_wrt_gas", true)};
  const std::string mode = cs.value("mode", "");
  // One micro-batch's forward and backward (the peer's train().loss_of).
  auto loss_of = [&](int micro) {
    auto [x, y] = batch(micro, pg.rank(), pg.world_size());
    x = x.to(m->parameters()[0].scalar_type());  // bf16 cases: the module's dtype
    torch::Tensor loss = torch::nn::functional::cross_entropy(engine(x).to(torch::kFloat), y);
    boundaries.push_back(engine.is_gradient_accumulation_boundary());
    auto options = plain;
    options.retain_graph = mode == "retain_graph";
    returned.push_back(
        engine
            .backward(cs.contains("loss_mult") ? loss * cs.at("loss_mult").get<double>() : loss,
                      options)
            .template item<double>());
    return loss;
  };
  int first = 0;
  if (cs.contains("resume_from")) {
    engine.load_checkpoint(cs.at("resume_from").get<std::string>(), "",
                           {.load_module_strict = !exclude});
    first = kSteps / 2;
    if (cs.contains("convert_to")) {
      engine.save_checkpoint(
          cs.at("convert_to").get<std::string>(), "",
          {.client_state = engine.client_state(), .exclude_frozen_parameters = exclude});
      first = kSteps;
    }
  }
  for (int step = first; step < kSteps; ++step) {
    for (const auto& r : cs.value("resize", nlohmann::json::array())) {
      if (r.at("at") == step && r.contains("train_batch_size"))
        engine.set_train_batch_size(r.at("train_batch_size").get<int64_t>());
      if (r.at("at") == step && r.contains("micro_batch_size"))
        engine.set_train_micro_batch_size(r.at("micro_batch_size").get<int64_t>());
    }
    if (step == kSteps / 2 && cs.contains("save_dtrain_mid"))
      engine.save_checkpoint(cs.at("save_dtrain_mid").get<std::string>(), "",
                             {.client_state = cs.value("client_state", nlohmann::json::object()),
                              .deepspeed_loss_scaler = true,
                              .exclude_frozen_parameters = exclude});
    // The step's first micro-batch as the mode says, then its last (for retain_graph: a second
    // backward through the first's graph).
    torch::Tensor loss;
    if (mode == "no_sync") {
      auto guard = engine.no_sync();
      loss_of(2 * step);
    } else if (mode == "set_boundary") {
      engine.set_gradient_accumulation_boundary(false);
      loss_of(2 * step);
      engine.set_gradient_accumulation_boundary(true);
    } else if (mode == "unmanaged") {
      loss_of(2 * step);
    } else if (mode == "zero_grad") {
      loss_of(2 * step);
      engine.step();
      m->zero_grad();
    } else if (mode == "engine_zero_grad") {
      loss_of(2 * step);
      engine.step();
      engine.zero_grad();
    } else if (mode == "retain_graph") {
      loss = loss_of(2 * step);
      engine.step();
      returned.push_back(engine.backward(loss, plain).template item<double>());
    } else if (!mode.empty()) {
      throw std::runtime_error("unknown mode " + mode);
    }
    if (!loss.defined()) loss = loss_of(mode.empty() ? step : 2 * step + 1);
    engine.step();
    applied.push_back(engine.was_step_applied());
    samples.push_back(engine.global_samples());
    boundaries.push_back(engine.is_gradient_accumulation_boundary());
    const auto norm = engine.get_global_grad_norm();  // as the peer writes it
    norms.push_back(!norm                  ? nlohmann::json(nullptr)
                    : std::isfinite(*norm) ? nlohmann::json(*norm)
                                           : nlohmann::json(std::isnan(*norm) ? "nan" : "inf"));
    torch::Tensor t = loss.detach().clone().reshape({1});
    dtrain::all_reduce(t);
    losses.push_back(t.item<double>() / pg.world_size());
  }
  if (cs.contains("save_dtrain"))
    engine.save_checkpoint(cs.at("save_dtrain").get<std::string>(), "",
                           {.client_state = cs.value("client_state", nlohmann::json::object()),
                            .exclude_frozen_parameters = exclude});
  if (cs.contains("save_16bit"))
    engine.save_16bit_model(cs.at("save_16bit").get<std::string>(), "pytorch_model.bin", exclude);
  if (engine.config().zero.stage == 3) engine.core().before_forward();  // gathers the module
  nlohmann::json params = nlohmann::json::object();
  for (auto& item : m->named_parameters()) {
    torch::Tensor p = item.value().detach().contiguous().to(torch::kFloat64).reshape({-1});
    params[item.key()] =
        std::vector<double>(p.data_ptr<double>(), p.data_ptr<double>() + p.numel());
  }
  out[cs.at("name").get<std::string>()] = {{"losses", losses},
                                           {"params", params},
                                           {"client_state", engine.client_state()},
                                           {"skipped_steps", engine.skipped_steps()},
                                           {"norms", norms},
                                           {"applied", applied},
                                           {"samples", samples},
                                           {"boundaries", boundaries},
                                           {"returned", returned},
                                           {"micro_steps", engine.core().micro_steps()},
                                           {"mom", engine.get_mom()}};
  if (!cs.value("probes", nlohmann::json::array()).empty())
    out[cs.at("name").get<std::string>()]["refused"] = refusals(engine, cs.at("probes"));
  if (engine.config().torch_autocast.enabled && engine.config().torch_autocast.dtype == "fp16")
    out[cs.at("name").get<std::string>()]["amp_scale"] = engine.loss_scale();
}

int main(int argc, char** argv) {
  dtrain::init(argc, argv);
  if (argc != 3) {
    std::fprintf(stderr, "usage: ds_parity_worker CASES.json OUT.json\n");
    return 2;
  }
  auto pg = dtrain::init_process_group();
  const auto cases = nlohmann::json::parse(std::ifstream(argv[1]));
  nlohmann::json out = nlohmann::json::object();
  for (const auto& cs : cases) {
    try {
      (void)dtrain::zero::parse_config(cs.at("config"), pg->world_size());
    } catch (const dtrain::zero::ConfigError& e) {  // a config dtrain refuses
      out[cs.at("name").get<std::string>()] = {{"init_refused", e.what()}};
      continue;
    }
    if (cs.value("reordered", false))
      run_case(cs, Reordered(), *pg, out);
    else
      run_case(cs, model(), *pg, out);
  }
  if (pg->rank() == 0) std::ofstream(argv[2]) << out.dump();
  return 0;
}
