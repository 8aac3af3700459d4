// Parity: DDP on N processes with per-rank batch b ends, after 20 Adam steps, with the
// parameters (and BatchNorm buffers) of one process trained with batch N*b on the same
// samples - for the seed's MLP and for a small CNN with SyncBatchNorm. The models train in
// float64 so the comparison measures DDP's semantics, not float32 summation order; a
// float32 run is checked too, at a tolerance that float32 rounding under Adam allows.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "launcher/subprocess.h"
#include "support/paths.h"

namespace {

using dtrain::test::run_command;
using namespace std::chrono_literals;

std::vector<torch::Tensor> train(const std::string& model, int nproc, int batch, int global_batch,
                                 bool float32 = false) {
  auto out =
      std::filesystem::temp_directory_path() /
      ("parity_" + model + "_" + std::to_string(nproc) + "_" + std::to_string(::getpid()) + ".pt");
  std::vector<std::string> argv{DTRAIN_BIN,
                                "run",
                                "--nproc-per-node",
                                std::to_string(nproc),
                                PARITY_WORKER_BIN,
                                "--model",
                                model,
                                "--steps",
                                "20",
                                "--batch",
                                std::to_string(batch),
                                "--global-batch",
                                std::to_string(global_batch),
                                "--out",
                                out.string()};
  if (float32) argv.push_back("--float32");
  auto r = run_command(argv, {.timeout = 300s});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  std::vector<torch::Tensor> params;
  if (r.exit_code == 0) torch::load(params, out.string());
  std::filesystem::remove(out);
  return params;
}

double max_relative_difference(const std::vector<torch::Tensor>& a,
                               const std::vector<torch::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    auto diff = (a[i].to(torch::kFloat64) - b[i].to(torch::kFloat64)).abs().max().item<double>();
    auto scale = std::max(b[i].to(torch::kFloat64).abs().max().item<double>(), 1e-12);
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

class Parity : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(Parity, DdpOnNRanksEqualsOneProcessWithNTimesTheBatch) {
  auto [model, n] = GetParam();
  const int b = 8;
  auto reference = train(model, 1, n * b, n * b);
  auto ddp = train(model, n, b, n * b);
  ASSERT_FALSE(reference.empty());
  ASSERT_FALSE(ddp.empty());
  double rel = max_relative_difference(ddp, reference);
  EXPECT_LE(rel, 1e-5) << model << " on " << n << " ranks";
}

INSTANTIATE_TEST_SUITE_P(ModelsAndWorlds, Parity,
                         ::testing::Combine(::testing::Values("mlp", "cnn"),
                                            ::testing::Values(2, 3)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  std::to_string(std::get<1>(info.param)) + "_ranks";
                         });

// ||a - b|| / ||b|| over each tensor, the worst one.
double norm_relative_difference(const std::vector<torch::Tensor>& a,
                                const std::vector<torch::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    auto bd = b[i].to(torch::kFloat64);
    worst = std::max(worst, (a[i].to(torch::kFloat64) - bd).norm().item<double>() /
                                std::max(bd.norm().item<double>(), 1e-12));
  }
  return worst;
}

// In float32, summing the same gradients in another order changes their last bits, and Adam
// turns that into a full lr-sized step of the other sign wherever a gradient is near zero: a
// few elements differ by up to steps * lr. The tensors as a whole stay close.
TEST(ParityFloat32, MlpOnTwoRanksStaysCloseToOneProcess) {
  auto reference = train("mlp", 1, 16, 16, true);
  auto ddp = train("mlp", 2, 8, 16, true);
  ASSERT_FALSE(reference.empty());
  double rel = norm_relative_difference(ddp, reference);
  std::printf("float32 norm-relative difference: %g\n", rel);
  EXPECT_LE(rel, 1e-3);
}

}  // namespace
