// The Fashion-MNIST example under `--deepspeed CONFIG`: bf16 + ZeRO stage 3 + CPU optimizer
// offload reaches its accuracy, and a bigger model (784-4096-4096-10, ~20M parameters) shows
// the per-rank memory drop from stage 0 to stage 3.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "launcher/subprocess.h"
#include "support/paths.h"

namespace {

using namespace std::chrono_literals;

nlohmann::json last_json(const std::string& out) {
  auto start = out.rfind("[default0]:{");
  if (start == std::string::npos) return {};
  auto end = out.find('\n', start);
  return nlohmann::json::parse(out.substr(start + 11, end - start - 11));
}

TEST(ZeroExample, Bf16Stage3WithOffloadReachesTheAccuracyInOneEpoch) {
  auto r = dtrain::test::run_command(
      {DTRAIN_BIN, "run", "--nproc-per-node", "2", FASHION_MNIST_BIN, "--deepspeed",
       std::string(DTRAIN_SOURCE_DIR) + "/examples/fashion_mnist/ds_bf16_stage3.json", "--epochs",
       "1", "--log-every", "0"},
      {.timeout = 300s});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto j = last_json(r.out);
  EXPECT_EQ(j["precision"], "bf16");
  EXPECT_EQ(j["zero_stage"], 3);
  EXPECT_GE(j["test_accuracy"].get<double>(), 0.84) << r.out;
  EXPECT_GT(j["rank0_mib"]["offloaded_to_cpu"].get<double>(), 0);
}

TEST(ZeroExample, BiggerModelHoldsLessPerRankAtStage3) {
  std::map<int, nlohmann::json> mem;
  for (int stage : {0, 3}) {
    std::string cfg = R"({"train_micro_batch_size_per_gpu": 32, "optimizer": {"type": "Adam"},
                          "zero_optimization": {"reduce_bucket_size": 1e6, "stage": )" +
                      std::to_string(stage) + "}}";
    auto r = dtrain::test::run_command(
        {DTRAIN_BIN, "run", "--nproc-per-node", "2", FASHION_MNIST_BIN, "--deepspeed", cfg,
         "--model", "wide", "--max-steps", "2", "--no-eval"},
        {.timeout = 120s});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    mem[stage] = last_json(r.out)["rank0_mib"];
  }
  std::printf("rank 0 MiB at stage 0: %s\nrank 0 MiB at stage 3: %s\n", mem[0].dump().c_str(),
              mem[3].dump().c_str());
  // 2 ranks: parameters and Adam state halve; gradients halve plus a bucket of <= 1e6 elements.
  EXPECT_NEAR(mem[3]["params"].get<double>(), mem[0]["params"].get<double>() / 2, 0.01);
  EXPECT_NEAR(mem[3]["optimizer"].get<double>(), mem[0]["optimizer"].get<double>() / 2, 0.01);
  EXPECT_LT(mem[3]["grads"].get<double>(), mem[0]["grads"].get<double>());
}

}  // namespace
