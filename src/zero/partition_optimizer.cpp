// The optimizers ZeRO runs on flat partitions (see partition_optimizer.h).
#include "zero/partition_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <sstream>
#include <type_traits>

#include "dtrain/error.h"
#include "dtrain/zero.h"
#include "optim/state_key.h"
#include "zero/cpu_optimizers.h"

namespace dtrain::zero::detail {
namespace {

// Whether the fused CPU kernels (cpu_adam_step, cpu_optimizers.h) can step `w`: the partition
// and its state flat CPU arrays, its gradient on the CPU, all of one type they take (float or
// double).
bool fused_cpu_step_applies(const torch::Tensor& w, const torch::Tensor& g,
                            std::initializer_list<torch::Tensor> state) {
  if (!w.device().is_cpu() || !g.device().is_cpu() || !w.is_contiguous() ||
      g.scalar_type() != w.scalar_type() ||
      (w.scalar_type() != torch::kFloat32 && w.scalar_type() != torch::kFloat64))
    return false;
  for (const auto& s : state)
    if (!s.is_contiguous()) return false;
  return true;
}

class Adam final : public PartitionOptimizer {
 public:
  Adam(const OptimizerConfig& c, const torch::Tensor& w) : c_(c) {
    for (int k = 0; k < 2; ++k) state_.push_back(torch::zeros_like(w));
  }
  std::string type() const override { return c_.type; }
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  double lr() const override { return c_.lr; }
  void step(const torch::Tensor& w, const torch::Tensor& g, const StepArgs& a) override {
    const double lr = a.lr, beta1 = a.beta1, beta2 = a.beta2;
    const bool adamw = c_.adam_w_mode;
    auto& m = state_[0];
    auto& v = state_[1];
    // One fused pass (cpu_adam_step) whenever the partition and its state are flat CPU arrays.
    if (g.is_contiguous() && fused_cpu_step_applies(w, g, {m, v})) {
      if (w.scalar_type() == torch::kFloat32)
        return cpu_adam_step(w.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(),
                             v.data_ptr<float>(), w.numel(), a.step, lr, beta1, beta2, c_.eps,
                             c_.weight_decay, adamw, 0, c_.bias_correction);
      return cpu_adam_step(w.data_ptr<double>(), g.data_ptr<double>(), m.data_ptr<double>(),
                           v.data_ptr<double>(), w.numel(), a.step, lr, beta1, beta2, c_.eps,
                           c_.weight_decay, adamw, 0, c_.bias_correction);
    }
    const double bc1 = c_.bias_correction ? 1 - std::pow(beta1, double(a.step)) : 1.0,
                 bc2 = c_.bias_correction ? 1 - std::pow(beta2, double(a.step)) : 1.0;
    torch::Tensor grad = g;
    if (c_.weight_decay != 0) {
      if (adamw)
        w.mul_(1 - lr * c_.weight_decay);
      else
        grad = g.add(w, c_.weight_decay);
    }
    m.mul_(beta1).add_(grad, 1 - beta1);
    v.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
    auto denom = (v.sqrt() / std::sqrt(bc2)).add_(c_.eps);
    w.addcdiv_(m, denom, -lr / bc1);
  }

 private:
  OptimizerConfig c_;
};

class Sgd final : public PartitionOptimizer {
 public:
  Sgd(const OptimizerConfig& c, const torch::Tensor& w) : c_(c) {
    if (c_.momentum > 0) state_.push_back(torch::zeros_like(w));
  }
  std::string type() const override { return c_.type; }
  std::vector<std::string> state_names() const override {
    if (state_.empty()) return {};
    return {"momentum_buffer"};
  }
  double lr() const override { return c_.lr; }
  void step(const torch::Tensor& w, const torch::Tensor& g, const StepArgs& a) override {
    auto d = c_.weight_decay != 0 ? g.add(w, c_.weight_decay) : g;
    const double momentum = a.momentum >= 0 ? a.momentum : c_.momentum;
    if (!state_.empty()) {
      auto& buf = state_[0];
      if (a.step == 1)
        buf.copy_(d);
      else
        buf.mul_(momentum).add_(d, 1 - c_.dampening);
      d = c_.nesterov ? d.add(buf, momentum) : buf;
    }
    w.add_(d, -a.lr);
  }

 private:
  OptimizerConfig c_;
};

// torch.optim.RMSprop, which DeepSpeed 0.19.8 builds by name: its single-tensor step (the one
// it takes on the CPU), op by op. Its momentum buffer exists when the momentum was positive at
// the first step (torch makes the state then), and follows OneCycleLR's momentum after.
class RMSprop final : public PartitionOptimizer {
 public:
  RMSprop(const OptimizerConfig& c, const torch::Tensor& w) : c_(c) {
    state_.push_back(torch::zeros_like(w));
    if (c_.momentum > 0) state_.push_back(torch::zeros_like(w));
    if (c_.centered) state_.push_back(torch::zeros_like(w));
  }
  std::string type() const override { return c_.type; }
  std::vector<std::string> state_names() const override {
    std::vector<std::string> n = {"square_avg"};
    if (c_.momentum > 0) n.push_back("momentum_buffer");
    if (c_.centered) n.push_back("grad_avg");
    return n;
  }
  double lr() const override { return c_.lr; }
  void step(const torch::Tensor& w, const torch::Tensor& g, const StepArgs& a) override {
    const double momentum = a.momentum >= 0 ? a.momentum : c_.momentum;
    auto grad = c_.weight_decay != 0 ? g.add(w, c_.weight_decay) : g;
    auto& square_avg = state_[0];
    square_avg.mul_(c_.alpha).addcmul_(grad, grad, 1 - c_.alpha);
    torch::Tensor avg;
    if (c_.centered) {
      auto& grad_avg = state_.back();
      grad_avg.lerp_(grad, 1 - c_.alpha);
      avg = square_avg.addcmul(grad_avg, grad_avg, -1).sqrt_();
    } else {
      avg = square_avg.sqrt();
    }
    avg.add_(c_.eps);
    if (c_.momentum > 0 && momentum > 0) {
      auto& buf = state_[1];
      buf.mul_(momentum).addcdiv_(grad, avg);
      w.add_(buf, -a.lr);
    } else {
      w.addcdiv_(grad, avg, -a.lr);
    }
  }

 private:
  OptimizerConfig c_;
};

class Lamb final : public PartitionOptimizer {
 public:
  Lamb(const OptimizerConfig& c, const torch::Tensor& w) : c_(c) {
    for (int k = 0; k < 2; ++k) state_.push_back(torch::zeros_like(w));
  }
  std::string type() const override { return c_.type; }
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  double lr() const override { return c_.lr; }
  void step(const torch::Tensor& w, const torch::Tensor& g, const StepArgs& a) override {
    const double lr = a.lr, beta1 = a.beta1, beta2 = a.beta2;
    auto& m = state_[0];
    auto& v = state_[1];
    const double bc1 = c_.bias_correction ? 1 - std::pow(beta1, double(a.step)) : 1.0,
                 bc2 = c_.bias_correction ? 1 - std::pow(beta2, double(a.step)) : 1.0;
    m.mul_(beta1).add_(g, 1 - beta1);
    v.mul_(beta2).addcmul_(g, g, 1 - beta2);
    auto update = (m / bc1) / ((v / bc2).sqrt().add_(c_.eps));
    if (c_.weight_decay != 0) update.add_(w, c_.weight_decay);
    // Trust ratio per parameter: norms over the whole parameter, summed over the ranks that
    // hold pieces of it.
    const auto& offsets = *a.offsets;
    const auto& numels = *a.numels;
    const size_t n = offsets.size();
    const int64_t base = a.base, len = w.numel();
    auto sums = torch::zeros({static_cast<int64_t>(n), 2}, torch::kFloat64);
    std::vector<std::pair<int64_t, int64_t>> segs(n, {0, 0});
    for (size_t i = 0; i < n; ++i) {
      int64_t lo = std::max(offsets[i], base), hi = std::min(offsets[i] + numels[i], base + len);
      if (lo >= hi) continue;
      segs[i] = {lo - base, hi - lo};
      sums[i][0] = w.narrow(0, lo - base, hi - lo).to(torch::kFloat64).pow(2).sum().item<double>();
      sums[i][1] =
          update.narrow(0, lo - base, hi - lo).to(torch::kFloat64).pow(2).sum().item<double>();
    }
    a.sum_over_ranks(sums);
    auto acc = sums.accessor<double, 2>();
    for (size_t i = 0; i < n; ++i) {
      if (segs[i].second == 0) continue;
      double wn = std::sqrt(acc[i][0]), un = std::sqrt(acc[i][1]);
      double trust = (wn > 0 && un > 0) ? std::clamp(wn / un, c_.min_coeff, c_.max_coeff) : 1.0;
      w.narrow(0, segs[i].first, segs[i].second)
          .add_(update.narrow(0, segs[i].first, segs[i].second), -lr * trust);
    }
  }

 private:
  OptimizerConfig c_;
};

// DeepSpeed 0.19.8 builds torch.optim.Adagrad for "Adagrad", and DeepSpeedCPUAdagrad with
// offload_optimizer; each is followed here, with its state's name ("sum", "exp_avg_sq").
class Adagrad final : public PartitionOptimizer {
 public:
  Adagrad(const OptimizerConfig& c, const torch::Tensor& w, bool cpu_adagrad)
      : c_(c), cpu_(cpu_adagrad) {
    state_.push_back(cpu_ ? torch::zeros_like(w)
                          : torch::full_like(w, c_.initial_accumulator_value));
  }
  std::string type() const override { return c_.type; }
  std::vector<std::string> state_names() const override { return {cpu_ ? "exp_avg_sq" : "sum"}; }
  double lr() const override { return c_.lr; }
  void step(const torch::Tensor& w, const torch::Tensor& g, const StepArgs& a) override {
    auto& sum = state_[0];
    if (cpu_ && fused_cpu_step_applies(w, g, {sum})) {
      auto gc = g.contiguous();
      if (w.scalar_type() == torch::kFloat32)
        return cpu_adagrad_step(w.data_ptr<float>(), gc.data_ptr<float>(), sum.data_ptr<float>(),
                                w.numel(), a.lr, c_.eps, c_.weight_decay);
      return cpu_adagrad_step(w.data_ptr<double>(), gc.data_ptr<double>(), sum.data_ptr<double>(),
                              w.numel(), a.lr, c_.eps, c_.weight_decay);
    }
    if (cpu_) {  // the same operations, as tensors (another dtype or device)
      auto grad = c_.weight_decay > 0 ? g.add(w, c_.weight_decay) : g;
      sum.addcmul_(grad, grad);
      w.addcdiv_(grad, sum.sqrt().add_(c_.eps), -a.lr);
      return;
    }
    // torch.optim.Adagrad's single-tensor step (the one it takes on the CPU), op by op.
    auto grad = c_.weight_decay != 0 ? g.add(w, c_.weight_decay) : g;
    const double clr = a.lr / (1 + static_cast<double>(a.step - 1) * c_.lr_decay);
    sum.addcmul_(grad, grad, 1);
    auto denom = sum.sqrt().add_(c_.eps);
    w.addcdiv_(grad, denom, -clr);
  }

 private:
  OptimizerConfig c_;
  bool cpu_;
};

// DeepSpeed 0.19.8 builds DeepSpeedCPULion for "Lion" with offload_optimizer, FusedLion (a CUDA
// kernel) without it; both are followed here.
//   DeepSpeedCPULion: its state is the momentum "exp_avg", and "exp_avg_sq", which it allocates
//     and never reads: kept (zeros) so that checkpoints are its own.
//   FusedLion (csrc/lion/multi_tensor_lion.cu, deepspeed/ops/lion/fused_lion.py): state
//     "exp_avg" only; in float32 whatever the parameter's type (the kernel's MATH_T),
//       c = beta1 * m + (1 - beta1) * g
//       p = p * (1 - lr * weight_decay) + (c > 0 ? -lr : lr)
//       m = beta2 * m + (1 - beta2) * g
//     as tensor ops, so that it runs on CPU and CUDA tensors alike. Its sign test differs from
//     the CPU Lion's at c == 0 (both +0 and -0 step up by lr here; the CPU Lion steps +0 down),
//     and it applies the decay factor even when weight_decay is 0 (a factor of exactly 1).
class Lion final : public PartitionOptimizer {
 public:
  Lion(const OptimizerConfig& c, const torch::Tensor& w, bool cpu_lion) : c_(c), cpu_(cpu_lion) {
    for (int k = 0; k < (cpu_ ? 2 : 1); ++k) state_.push_back(torch::zeros_like(w));
  }
  std::string type() const override { return c_.type; }
  std::vector<std::string> state_names() const override {
    if (!cpu_) return {"exp_avg"};
    return {"exp_avg", "exp_avg_sq"};
  }
  double lr() const override { return c_.lr; }
  void step(const torch::Tensor& w, const torch::Tensor& g, const StepArgs& a) override {
    auto& m = state_[0];
    if (!cpu_) return fused_step(w, g, m, a);
    if (fused_cpu_step_applies(w, g, {m})) {
      auto gc = g.contiguous();
      if (w.scalar_type() == torch::kFloat32)
        return cpu_lion_step(w.data_ptr<float>(), gc.data_ptr<float>(), m.data_ptr<float>(),
                             w.numel(), a.lr, a.beta1, a.beta2, c_.weight_decay);
      return cpu_lion_step(w.data_ptr<double>(), gc.data_ptr<double>(), m.data_ptr<double>(),
                           w.numel(), a.lr, a.beta1, a.beta2, c_.weight_decay);
    }
    // The same operations as tensors (another dtype or device).
    auto c = m.mul(a.beta1).add_(g, 1 - a.beta1);
    // -copysign(lr, c): a zero with its sign bit clear steps down, as DeepSpeed's sign mask does.
    auto update =
        torch::where(torch::signbit(c), torch::full_like(c, a.lr), torch::full_like(c, -a.lr));
    if (c_.weight_decay > 0) w.mul_(1 - a.lr * c_.weight_decay);
    w.add_(update);
    m.mul_(a.beta2).add_(g, 1 - a.beta2);
  }

 private:
  // FusedLion's element-wise update (see above). Its scalars are float arguments of the kernel;
  // 1 - beta and 1 - lr * decay are computed in float there too.
  void fused_step(const torch::Tensor& w, const torch::Tensor& g, torch::Tensor& m,
                  const StepArgs& a) const {
    const float lr = static_cast<float>(a.lr), b1 = static_cast<float>(a.beta1),
                b2 = static_cast<float>(a.beta2), decay = static_cast<float>(c_.weight_decay);
    const float omb1 = 1.0f - b1, omb2 = 1.0f - b2;
    const float after_decay = 1.0f - lr * decay;
    const auto f32 = [](const torch::Tensor& t) { return t.to(torch::kFloat32); };
    const torch::Tensor gf = f32(g), mf = f32(m);
    torch::Tensor pf = f32(w);
    const auto c = mf.mul(b1).add_(gf.mul(omb1));
    const auto update = torch::where(c.gt(0), torch::full_like(c, -lr), torch::full_like(c, lr));
    pf = pf.mul(after_decay).add_(update);
    const auto m_next = mf.mul(b2).add_(gf.mul(omb2));
    w.copy_(pf);
    m.copy_(m_next);
  }

  OptimizerConfig c_;
  bool cpu_;
};

// InitOptions::optimizer: its one group steps the partition, with the averaged gradient set
// as the partition's .grad for the call.
class Client final : public PartitionOptimizer {
 public:
  Client(std::shared_ptr<torch::optim::Optimizer> opt, const torch::Tensor& w)
      : opt_(std::move(opt)), param_(w) {
    opt_->param_groups()[0].params() = {param_};  // one tensor for good: it keys state by it
    if (auto* adagrad = dynamic_cast<torch::optim::Adagrad*>(opt_.get())) {
      // Adagrad makes its state in its constructor (for the module's parameters): made again,
      // as that constructor makes it, for the partition.
      const auto& o =
          static_cast<const torch::optim::AdagradOptions&>(adagrad->param_groups()[0].options());
      auto state = std::make_unique<torch::optim::AdagradParamState>();
      state->step(0);
      state->sum(
          torch::full_like(param_, o.initial_accumulator_value(), at::MemoryFormat::Preserve));
      adagrad->state().clear();
      adagrad->state()[dtrain::optim::state_key(adagrad->state(), param_)] = std::move(state);
    }
  }
  std::string type() const override { return kClientOptimizerType; }
  std::vector<std::string> state_names() const override { return {}; }
  const torch::optim::Optimizer* client() const override { return opt_.get(); }
  double lr() const override { return opt_->param_groups()[0].options().get_lr(); }
  void step(const torch::Tensor& /*w*/, const torch::Tensor& g, const StepArgs& a) override {
    auto& options = opt_->param_groups()[0].options();
    if (a.scheduled) options.set_lr(a.lr);
    if (a.cycled_betas) {  // DeepSpeed's OneCycle sets group["betas"] = (momentum, 0.99)
      if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&options))
        adam->betas({a.beta1, a.beta2});
      else if (auto* adamw = dynamic_cast<torch::optim::AdamWOptions*>(&options))
        adamw->betas({a.beta1, a.beta2});
    }
    if (a.momentum >= 0) {  // torch's OneCycleLR sets group["momentum"]
      if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&options))
        sgd->momentum(a.momentum);
      else if (auto* rms = dynamic_cast<torch::optim::RMSpropOptions*>(&options))
        rms->momentum(a.momentum);
    }
    param_.mutable_grad() = g;
    opt_->step();
    param_.mutable_grad() = torch::Tensor();
  }
  bool opaque() const override { return true; }
  // torch::optim's own archive, as bytes: keyed to this partition.
  torch::Tensor save_opaque() override {
    torch::serialize::OutputArchive archive;
    opt_->save(archive);
    std::ostringstream bytes;
    archive.save_to(bytes);
    const std::string b = bytes.str();
    auto t = torch::empty({static_cast<int64_t>(b.size())}, torch::kUInt8);
    std::memcpy(t.data_ptr(), b.data(), b.size());
    return t;
  }
  void load_opaque(const torch::Tensor& bytes) override {
    auto t = bytes.contiguous();
    torch::serialize::InputArchive archive;
    archive.load_from(reinterpret_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.numel()));
    opt_->load(archive);
  }

 private:
  std::shared_ptr<torch::optim::Optimizer> opt_;
  torch::Tensor param_;
};

}  // namespace

bool has_only_constructor_state(const torch::optim::Optimizer& client) {
  const auto* adagrad = dynamic_cast<const torch::optim::Adagrad*>(&client);
  if (adagrad == nullptr || client.param_groups().size() != 1) return client.state().empty();
  const double initial =
      static_cast<const torch::optim::AdagradOptions&>(client.param_groups()[0].options())
          .initial_accumulator_value();
  for (const auto& [key, state] : client.state()) {
    const auto* s = dynamic_cast<const torch::optim::AdagradParamState*>(state.get());
    if (s == nullptr || s->step() != 0 || s->sum().ne(initial).any().item<bool>()) return false;
  }
  return true;
}

std::unique_ptr<PartitionOptimizer> make_partition_optimizer(
    const OptimizerConfig& config, std::shared_ptr<torch::optim::Optimizer> client,
    const torch::Tensor& partition, bool offload_optimizer) {
  if (client) return std::make_unique<Client>(std::move(client), partition);
  if (config.type == "Adam" || config.type == "AdamW")
    return std::make_unique<Adam>(config, partition);
  if (config.type == "SGD") return std::make_unique<Sgd>(config, partition);
  if (config.type == "RMSprop") return std::make_unique<RMSprop>(config, partition);
  if (config.type == "Lamb") return std::make_unique<Lamb>(config, partition);
  if (config.type == "Adagrad")
    return std::make_unique<Adagrad>(config, partition, offload_optimizer);
  if (config.type == "Lion") return std::make_unique<Lion>(config, partition, offload_optimizer);
  throw_internal(__FILE__, __LINE__, "known optimizer type",
                 "optimizer type '" + config.type + "' passed the config's check");
}

}  // namespace dtrain::zero::detail
