// The Fashion-MNIST example end to end through `dtrain run`: accuracy targets, exact resume
// from a mid-epoch checkpoint, and a clear error for a wrong data path.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>
#include <vector>

#include "launcher/subprocess.h"
#include "support/json_lines.h"
#include "support/paths.h"

namespace {

using dtrain::test::run_command;
using namespace std::chrono_literals;

nlohmann::json result_of(const std::string& out) { return dtrain::test::last_json_line(out); }

dtrain::test::RunResult train(const std::vector<std::string>& extra, int nproc = 2) {
  std::vector<std::string> argv{DTRAIN_BIN, "run", "--nproc-per-node", std::to_string(nproc),
                                FASHION_MNIST_BIN};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return run_command(argv, {.timeout = 900s});
}

TEST(FashionMnist, MlpReachesTheTargetAccuracyInThreeEpochsOnTwoProcesses) {
  auto r = train({"--epochs", "3", "--log-every", "200"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto j = result_of(r.out);
  EXPECT_EQ(j["world_size"], 2);
  EXPECT_EQ(j["epochs"], 3);
  EXPECT_GT(j["samples_per_s"].get<double>(), 0);
  EXPECT_GE(j["test_accuracy"].get<double>(), 0.87) << r.out;
  // Progress lines and a per-epoch accuracy line come from rank 0 only.
  EXPECT_NE(r.out.find("[default0]:epoch 1 step 200/469 loss"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[default0]:epoch 3 test accuracy"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("[default1]:epoch"), std::string::npos) << r.out;
}

TEST(FashionMnist, CnnWithSyncBatchNormReachesTheTargetAccuracy) {
  auto r = train({"--model", "cnn", "--epochs", "3", "--log-every", "200"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_GE(result_of(r.out)["test_accuracy"].get<double>(), 0.90) << r.out;
}

// With libtorch's Adam and with dtrain::FusedAdam (--optimizer fused-adam): the state each
// checkpoints is all a resumed run needs to end bitwise where the straight run ends.
TEST(FashionMnist, ResumeFromAMidEpochCheckpointEndsBitwiseEqual) {
  for (const std::string optimizer : {"adam", "fused-adam"}) {
    SCOPED_TRACE("--optimizer " + optimizer);
    auto dir = std::filesystem::temp_directory_path() /
               ("fmnist_resume_" + std::to_string(::getpid()) + "_" + optimizer);
    std::filesystem::remove_all(dir);
    auto straight =
        train({"--max-steps", "80", "--no-eval", "--log-every", "0", "--optimizer", optimizer});
    ASSERT_EQ(straight.exit_code, 0) << straight.err;
    auto first = train({"--max-steps", "40", "--no-eval", "--log-every", "0", "--checkpoint-dir",
                        dir.string(), "--optimizer", optimizer});
    ASSERT_EQ(first.exit_code, 0) << first.err;
    ASSERT_TRUE(std::filesystem::exists(dir / "ckpt_40.pt"));
    auto resumed = train({"--max-steps", "80", "--no-eval", "--log-every", "0", "--checkpoint-dir",
                          dir.string(), "--resume", "--optimizer", optimizer});
    ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
    EXPECT_NE(resumed.out.find("resumed from"), std::string::npos) << resumed.out;
    auto a = result_of(straight.out), b = result_of(resumed.out), c = result_of(first.out);
    EXPECT_EQ(b["steps"], 80);
    EXPECT_EQ(b["optimizer"], optimizer);
    EXPECT_EQ(a["param_digest"], b["param_digest"]);
    EXPECT_NE(a["param_digest"], c["param_digest"]);  // the digest does tell models apart
    std::filesystem::remove_all(dir);
  }
}

TEST(FashionMnist, AWrongDataPathIsAClearError) {
  auto r = train({"--data-dir", "/nonexistent/fmnist", "--epochs", "1"}, 1);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("/nonexistent/fmnist/train-images-idx3-ubyte.gz does not exist"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("apt-get install dataset-fashion-mnist"), std::string::npos) << r.err;
}

// A bad flag value is one line naming the flag, what it takes and what it got, exit code 2,
// before any training: under `dtrain run` (every rank says it; the job fails with it) and alone.
TEST(FashionMnist, BadFlagValuesAreOneLineAndExitCode2) {
  for (const auto& [flag, value, takes] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"--epochs", "-1", "a whole number > 0"},
           {"--batch-size", "0", "a whole number > 0"},
           {"--lr", "abc", "a number > 0"},
           {"--log-every", "-2", "a whole number >= 0"}}) {
    SCOPED_TRACE(flag + " " + value);
    const std::string line = flag + ": expected " + takes + ", got '" + value + "'\n";
    auto alone = run_command({FASHION_MNIST_BIN, flag, value}, {.timeout = 60s});
    EXPECT_EQ(alone.exit_code, 2);
    EXPECT_EQ(alone.err.rfind(line, 0), 0u) << alone.err;
    auto r = train({flag, value}, 1);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find(line), std::string::npos) << r.err;
  }
}

}  // namespace
