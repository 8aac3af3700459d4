// The engine's GradScaler (fp16 torch_autocast) against torch.amp.GradScaler itself, run by the
// venv's torch 2.11 on the CPU: the scale and growth tracker after every update of a long run of
// clean steps and infs (growth after 2000, back-off), and the unscaled values of gradients that
// reach into fp32's subnormals and its top. zero_deepspeed_parity_test runs it inside training
// against DeepSpeed (10 steps, where the scale only falls).
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "launcher/subprocess.h"
#include "support/paths.h"
#include "zero/grad_scaler.h"

namespace {

using dtrain::zero::detail::AmpGradScaler;
using json = nlohmann::json;

// torch.amp.GradScaler("cpu") stepping an SGD over one parameter whose gradient is inf (true)
// or finite (false) at each step: [[scale, growth tracker] after each update], and the given
// gradients unscaled at the initial scale.
constexpr const char* kPeer = R"(
import json, sys, torch
flags, grads = json.loads(sys.argv[1]), json.loads(sys.argv[2])
s = torch.amp.GradScaler("cpu")
p = torch.nn.Parameter(torch.zeros(len(grads)))
opt = torch.optim.SGD([p], lr=0.0)
s.scale(torch.ones(()))  # the scale is made lazily
p.grad = torch.tensor(grads, dtype=torch.float32)
s.unscale_(opt)
unscaled = p.grad.view(torch.int32).tolist()  # the bits
opt.zero_grad(set_to_none=False)
s.update()
out = []
for f in flags:
    p.grad = torch.full((len(grads),), float("inf") if f else 1.0)
    s.step(opt)
    s.update()
    out.append([s.get_scale(), int(s._growth_tracker.item())])
print(json.dumps({"updates": out, "unscaled": unscaled}))
)";

TEST(ZeroGradScaler, ScalesUnscalesAndUpdatesAsTorchGradScaler) {
  // 2100 clean steps (growth at the 2000th), an inf, 4100 clean (two growths), three infs, 5
  // clean.
  std::vector<bool> flags;
  auto add = [&](int n, bool inf) { flags.insert(flags.end(), n, inf); };
  add(2100, false);
  add(1, true);
  add(4100, false);
  add(3, true);
  add(5, false);
  const std::vector<float> grads = {1.5f,   3e-39f, -2.5e-42f, 6.5e37f, 123.456f,
                                    -7e-8f, 1e-45f, 3.4e38f,   0.0f};
  auto r = dtrain::test::run_command(
      {DTRAIN_VENV_PYTHON, "-c", kPeer, json(flags).dump(), json(grads).dump()},
      {.timeout = std::chrono::seconds(120)});
  ASSERT_EQ(r.exit_code, 0) << "torch's GradScaler did not run (is torch in the venv?)\n" << r.err;
  const json peer = json::parse(r.out);

  AmpGradScaler s;
  torch::Tensor g = torch::tensor(grads);
  EXPECT_FALSE(s.unscale(g));
  for (size_t i = 0; i < grads.size(); ++i) {
    const float v = g[static_cast<int64_t>(i)].item<float>();
    int32_t bits = 0;
    std::memcpy(&bits, &v, sizeof bits);
    EXPECT_EQ(bits, peer["unscaled"][i].get<int32_t>()) << "gradient " << grads[i];
  }
  s.update(false);
  ASSERT_EQ(peer["updates"].size(), flags.size());
  int grew = 0, backed_off = 0;
  for (size_t k = 0; k < flags.size(); ++k) {
    const float before = s.value();
    s.update(flags[k]);
    grew += s.value() > before;
    backed_off += s.value() < before;
    ASSERT_EQ(s.value(), peer["updates"][k][0].get<double>()) << "update " << k + 1;
    ASSERT_EQ(s.growth_tracker(), peer["updates"][k][1].get<int64_t>()) << "update " << k + 1;
  }
  EXPECT_EQ(grew, 3);  // the run reached both rules
  EXPECT_EQ(backed_off, 4);

  // An inf or NaN anywhere is found; the loss comes back float32 for a 16-bit loss.
  torch::Tensor bad = torch::tensor({1.0f, std::numeric_limits<float>::quiet_NaN()});
  EXPECT_TRUE(AmpGradScaler().unscale(bad));
  const auto loss = AmpGradScaler().scale(torch::scalar_tensor(2.0, torch::kHalf));
  EXPECT_EQ(loss.scalar_type(), torch::kFloat32);
  EXPECT_EQ(loss.item<float>(), 131072.0f);
}

}  // namespace
