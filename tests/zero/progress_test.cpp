// The engine's progress output pieces without DeepSpeed: the throughput timer's cadence and
// numbers on a clock the test moves, and get_mom()'s list for a client optimizer without betas.
// (zero_deepspeed_reference_test compares both lines with DeepSpeed's own.)
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "dtrain/zero.h"
#include "zero/progress_text.h"
#include "zero/throughput_timer.h"

namespace {

using dtrain::zero::detail::ThroughputTimer;

// One micro-batch per optimizer step, each `seconds` long; the lines it prints.
std::vector<std::string> run(ThroughputTimer& t, double& now, int steps, double seconds,
                             int gas = 1) {
  std::vector<std::string> lines;
  for (int k = 0; k < steps * gas; ++k) {
    t.start();
    now += seconds;
    const bool boundary = (k + 1) % gas == 0;
    if (auto line = t.stop(boundary, true); !line.empty()) lines.push_back(line);
  }
  return lines;
}

TEST(ZeroThroughputTimer, PrintsFromStepThreeAtTheCadenceWithDeepSpeedsFormulas) {
  double now = 1000;
  ThroughputTimer::Options o;
  o.batch_size = 8;
  o.steps_per_output = 2;
  ThroughputTimer t(
      o, [&] { return now; },
      [] {
        return std::pair<int64_t, int64_t>{int64_t(3) << 29, 1 << 30};
      });
  const auto lines = run(t, now, 6, 0.5);
  // Steps 1-2 are not timed; 3 is, but 3 % 2 != 0; 4 and 6 print. Running average over the
  // timed steps: 8 / (1.0 / 2) at step 4.
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0],
            "epoch=0/micro_step=4/global_step=4, RunningAvgSamplesPerSec=16.0, "
            "CurrSamplesPerSec=15.999680006399874, MemAllocated=1.5GB, MaxMemAllocated=1.0GB");
  EXPECT_EQ(lines[1].substr(0, 69),
            "epoch=0/micro_step=6/global_step=6, RunningAvgSamplesPerSec=16.0, Cur");
}

TEST(ZeroThroughputTimer, CountsMicroStepsAndStaysSilentWhenDisabledOrNotStarted) {
  double now = 0;
  ThroughputTimer::Options o;
  o.batch_size = 4;
  o.steps_per_output = 3;
  ThroughputTimer t(
      o, [&] { return now; },
      [] {
        return std::pair<int64_t, int64_t>{0, 0};
      });
  const auto lines = run(t, now, 3, 0.25, /*gas=*/2);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].substr(0, 36), "epoch=0/micro_step=6/global_step=3, ");
  EXPECT_NE(lines[0].find("RunningAvgSamplesPerSec=8.0, "), std::string::npos) << lines[0];
  // A stop() without a start() counts nothing.
  EXPECT_EQ(t.stop(true, true), "");
  EXPECT_EQ(t.global_step_count(), 3);

  o.enabled = false;
  ThroughputTimer off(o, [&] { return now; });
  EXPECT_TRUE(run(off, now, 9, 0.1).empty());
  EXPECT_EQ(off.global_step_count(), 0);
  o.enabled = true;
  o.steps_per_output.reset();  // steps_per_print not set: timed, never printed
  ThroughputTimer unset(o, [&] { return now; });
  EXPECT_TRUE(run(unset, now, 9, 0.1).empty());
}

TEST(ZeroThroughputTimer, MeasuresThisProcessesMemoryOnTheCpu) {
  const auto [now, peak] = dtrain::zero::detail::allocated_memory(torch::Device(torch::kCPU));
  EXPECT_GT(now, int64_t(1) << 20);  // a process with libtorch loaded holds megabytes
  EXPECT_GE(peak, now);
}

// An optimizer of the user's own: DeepSpeed's get_mom() finds no "betas" in its group.
struct Plain : torch::optim::Optimizer {
  explicit Plain(std::vector<torch::Tensor> p)
      : Optimizer({torch::optim::OptimizerParamGroup(std::move(p))},
                  std::make_unique<torch::optim::SGDOptions>(0.1)) {}
  torch::Tensor step(LossClosure) override { return {}; }
};

TEST(ZeroProgressText, ClientOptimizersMomentumAsDeepSpeedReadsTheirGroups) {
  auto c = dtrain::zero::parse_config(nlohmann::json{{"train_batch_size", 2}}, 1);
  dtrain::zero::LRScheduler s(c.scheduler, 0.1, 0.9);
  auto w = torch::zeros({2}, torch::requires_grad());
  using dtrain::zero::detail::mom_list_text;
  EXPECT_EQ(mom_list_text(c, s, std::make_shared<Plain>(std::vector{w}).get()), "[0.0]");
  torch::optim::SGD sgd({w}, torch::optim::SGDOptions(0.1));
  EXPECT_EQ(mom_list_text(c, s, &sgd), "[0]");  // torch's default momentum, the int 0
  torch::optim::Adam adam({w}, torch::optim::AdamOptions(0.1).betas({0.5, 0.75}));
  EXPECT_EQ(mom_list_text(c, s, &adam), "[(0.5, 0.75)]");
  EXPECT_EQ(dtrain::zero::detail::lr_list_text(c, s, 0.1, true), "[0.1]");
}

}  // namespace
