// FusedAdam (src/optim/fused_adam.cpp) against libtorch's own torch::optim::Adam: the same
// parameters step for step (float32 and float64, weight decay, amsgrad, two param groups, a
// frozen parameter), the same state (a checkpoint of one resumes the other), closures, and
// torch::optim::Adam's refusal of sparse gradients.
#include "dtrain/fused_adam.h"

#include <gtest/gtest.h>
#include <torch/version.h>

#include <sstream>
#include <string>
#include <vector>

namespace dtrain {
namespace {

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(12, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 4));
    frozen = register_parameter("frozen", torch::ones({3}));  // never in the graph: no gradient
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::Tensor frozen;
};
TORCH_MODULE(Net);

Net make_net(torch::Dtype dtype) {
  torch::manual_seed(7);
  Net net;
  net->to(dtype);
  return net;
}

// Two groups: fc1 at the options' lr, fc2 at a tenth of it (and the frozen parameter).
std::vector<torch::optim::OptimizerParamGroup> groups(Net& net,
                                                      const torch::optim::AdamOptions& o) {
  auto second = std::make_unique<torch::optim::AdamOptions>(o);
  second->lr(o.lr() / 10);
  return {torch::optim::OptimizerParamGroup(net->fc1->parameters(),
                                            std::make_unique<torch::optim::AdamOptions>(o)),
          torch::optim::OptimizerParamGroup({net->fc2->weight, net->fc2->bias, net->frozen},
                                            std::move(second))};
}

void train(Net& net, torch::optim::Optimizer& opt, int steps, int first_step = 0) {
  for (int s = first_step; s < first_step + steps; ++s) {
    torch::manual_seed(100 + s);  // the same batch for both optimizers at a step
    auto x = torch::randn({8, 12}, torch::TensorOptions().dtype(net->fc1->weight.scalar_type()));
    auto y = torch::randint(0, 4, {8}, torch::kLong);
    opt.zero_grad();
    torch::nn::functional::cross_entropy(net->forward(x), y).backward();
    opt.step();
  }
}

// Both optimizers step on the reference model's gradients, so what differs is the optimizer alone
// (each model's own backward would differ by rounding, which Adam amplifies where a gradient is
// near zero).
void train_pair(Net& ref, torch::optim::Optimizer& ref_opt, Net& other,
                torch::optim::Optimizer& other_opt, int steps) {
  for (int s = 0; s < steps; ++s) {
    torch::manual_seed(100 + s);
    auto x = torch::randn({8, 12}, torch::TensorOptions().dtype(ref->fc1->weight.scalar_type()));
    auto y = torch::randint(0, 4, {8}, torch::kLong);
    ref_opt.zero_grad();
    other_opt.zero_grad();
    torch::nn::functional::cross_entropy(ref->forward(x), y).backward();
    auto rp = ref->parameters(), op = other->parameters();
    for (size_t i = 0; i < rp.size(); ++i)
      if (rp[i].grad().defined()) op[i].mutable_grad() = rp[i].grad().clone();
    ref_opt.step();
    other_opt.step();
  }
}

void expect_close(Net& a, Net& b, double rtol, const std::string& what) {
  auto pa = a->named_parameters(), pb = b->named_parameters();
  for (const auto& item : pa) {
    const auto& other = pb[item.key()];
    EXPECT_TRUE(torch::allclose(item.value(), other, rtol, rtol * 1e-2))
        << what << ": " << item.key() << " differs by "
        << (item.value() - other).abs().max().item<double>();
  }
}

TEST(FusedAdam, StepsAsTorchAdamDoes) {
  for (auto dtype : {torch::kFloat, torch::kDouble}) {
    for (double wd : {0.0, 0.01}) {
      for (bool amsgrad : {false, true}) {
        std::string what = dtype == torch::kFloat ? "float32" : "float64";
        what += ", weight_decay " + std::to_string(wd);
        if (amsgrad) what += ", amsgrad";
        const auto o = torch::optim::AdamOptions(1e-2).weight_decay(wd).amsgrad(amsgrad);
        Net ref = make_net(dtype), fused = make_net(dtype);
        torch::optim::Adam ref_opt(groups(ref, o));
        FusedAdam fused_opt(groups(fused, o));
        train_pair(ref, ref_opt, fused, fused_opt, 30);
        // Float rounding apart (other operation order), never a different update: after 30
        // steps of lr 1e-2 a wrong bias correction or moment moves weights by ~1e-2.
        expect_close(ref, fused, dtype == torch::kFloat ? 1e-4 : 1e-10, what);
        EXPECT_TRUE(torch::equal(fused->frozen, torch::ones({3}, dtype))) << what;
        EXPECT_EQ(fused_opt.state().size(), ref_opt.state().size()) << what;  // none for frozen
        for (auto& [key, state] : fused_opt.state())  // torch::optim::Adam's, counted as it counts
          EXPECT_EQ(static_cast<torch::optim::AdamParamState&>(*state).step(), 30) << what;
      }
    }
  }
}

#if TORCH_VERSION_MAJOR >= 2
// The step is ATen's fused kernel, not a fallback to libtorch's Adam (which the comparison above
// cannot tell apart): bit for bit what _fused_adam_ called directly on the same gradients gives.
TEST(FusedAdam, StepsAreAtensFusedKernelsBitForBit) {
  const auto o = torch::optim::AdamOptions(1e-2).weight_decay(0.01);
  Net net = make_net(torch::kFloat), direct = make_net(torch::kFloat);
  FusedAdam opt(net->parameters(), o);
  std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, ours;
  for (const auto& item : direct->named_parameters())  // the frozen one never has a gradient
    if (item.key() != "frozen") params.push_back(item.value());
  for (const auto& item : net->named_parameters())
    if (item.key() != "frozen") ours.push_back(item.value());
  for (auto& p : params) {
    exp_avgs.push_back(torch::zeros_like(p));
    exp_avg_sqs.push_back(torch::zeros_like(p));
  }
  for (int s = 1; s <= 10; ++s) {
    torch::manual_seed(100 + s);
    auto x = torch::randn({8, 12});
    auto y = torch::randint(0, 4, {8}, torch::kLong);
    opt.zero_grad();
    torch::nn::functional::cross_entropy(net->forward(x), y).backward();
    grads.clear();
    std::vector<torch::Tensor> steps;
    for (auto& p : ours) {
      grads.push_back(p.grad().clone());
      steps.push_back(torch::full({}, static_cast<double>(s)));
    }
    opt.step();
    torch::NoGradGuard no_grad;
    at::_fused_adam_(params, grads, exp_avgs, exp_avg_sqs, {}, steps, o.lr(), 0.9, 0.999,
                     o.weight_decay(), o.eps(), /*amsgrad=*/false, /*maximize=*/false);
  }
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(torch::equal(ours[i], params[i])) << "parameter " << i;
}
#endif

// A checkpoint of either optimizer resumes the other, and the runs end where libtorch's Adam
// alone would have (in float64: each model's own backward, whose rounding stays far below 1e-10).
TEST(FusedAdam, StateIsTorchAdamsBothWays) {
  const auto o = torch::optim::AdamOptions(1e-2).weight_decay(0.001);
  Net whole = make_net(torch::kDouble);
  torch::optim::Adam whole_opt(groups(whole, o));
  train(whole, whole_opt, 20);

  for (bool fused_first : {true, false}) {
    Net net = make_net(torch::kDouble);
    std::stringstream saved;
    {
      auto opt = fused_first ? std::unique_ptr<torch::optim::Adam>(new FusedAdam(groups(net, o)))
                             : std::make_unique<torch::optim::Adam>(groups(net, o));
      train(net, *opt, 10);
      torch::serialize::OutputArchive archive;
      opt->save(archive);
      archive.save_to(saved);
    }
    auto opt = fused_first ? std::make_unique<torch::optim::Adam>(groups(net, o))
                           : std::unique_ptr<torch::optim::Adam>(new FusedAdam(groups(net, o)));
    torch::serialize::InputArchive archive;
    archive.load_from(saved);
    opt->load(archive);
    train(net, *opt, 10, 10);
    expect_close(whole, net, 1e-10, fused_first ? "fused, then torch's" : "torch's, then fused");
  }
}

TEST(FusedAdam, ClosureRunsFirstAndItsLossIsReturned) {
  Net ref = make_net(torch::kDouble), fused = make_net(torch::kDouble);
  torch::optim::Adam ref_opt(ref->parameters(), 1e-2);
  FusedAdam fused_opt(fused->parameters(), 1e-2);
  torch::manual_seed(3);
  auto x = torch::randn({8, 12}, torch::kDouble);
  auto y = torch::randint(0, 4, {8}, torch::kLong);
  auto closure_of = [&x, &y](Net* net, torch::optim::Optimizer* opt) {
    return [net, opt, &x, &y]() {
      opt->zero_grad();
      auto loss = torch::nn::functional::cross_entropy((*net)->forward(x), y);
      loss.backward();
      return loss;
    };
  };
  for (int s = 0; s < 5; ++s) {
    auto ref_loss = ref_opt.step(closure_of(&ref, &ref_opt));
    auto fused_loss = fused_opt.step(closure_of(&fused, &fused_opt));
    ASSERT_TRUE(fused_loss.defined());
    EXPECT_NEAR(fused_loss.item<double>(), ref_loss.item<double>(), 1e-12) << "step " << s;
  }
  expect_close(ref, fused, 1e-10, "closure");
}

TEST(FusedAdam, SparseGradientsAreRefusedAsTorchAdamRefusesThem) {
  auto refusal = [](torch::optim::Optimizer& opt, torch::Tensor& w) {
    w.mutable_grad() = torch::eye(3).to_sparse();
    try {
      opt.step();
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no error");
  };
  auto a = torch::zeros({3, 3}, torch::requires_grad()), b = a.detach().clone().requires_grad_();
  torch::optim::Adam ref(std::vector<torch::Tensor>{a});
  FusedAdam fused(std::vector<torch::Tensor>{b});
  const std::string want = refusal(ref, a);
  ASSERT_NE(want, "no error");
  EXPECT_EQ(refusal(fused, b), want);
}

}  // namespace
}  // namespace dtrain
