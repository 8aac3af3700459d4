// examples/distributor end to end: train on 2 processes through the Distributor, get the
// state dict back, test it in the driver.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "launcher/subprocess.h"
#include "support/paths.h"

namespace {

using dtrain::test::run_command;
using namespace std::chrono_literals;

nlohmann::json last_json_line(const std::string& out) {
  std::istringstream in(out);
  nlohmann::json last;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] == '{') last = nlohmann::json::parse(line);
  }
  return last;
}

TEST(DistributorExample, TrainsOnTwoProcessesAndTheDriverTestsTheReturnedModel) {
  auto r =
      run_command({DISTRIBUTOR_EXAMPLE_BIN, "--nproc", "2", "--epochs", "1"}, {.timeout = 600s});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto j = last_json_line(r.out);
  EXPECT_EQ(j["num_processes"], 2);
  EXPECT_EQ(j["tensors_returned"], 6);  // 3 Linear layers: weight + bias each
  // One epoch of the seed's MLP; three reach 0.88 (README).
  EXPECT_GE(j["test_accuracy"].get<double>(), 0.84) << r.out;
  // Worker output arrives rank-prefixed through the launcher.
  EXPECT_NE(r.out.find("[default0]:epoch 1 loss"), std::string::npos) << r.out;
}

TEST(DistributorExample, AWrongDataDirectoryIsAClearErrorFromTheDriver) {
  auto r = run_command({DISTRIBUTOR_EXAMPLE_BIN, "--data-dir", "/nonexistent"}, {.timeout = 120s});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("/nonexistent"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("dataset-fashion-mnist"), std::string::npos) << r.err;
}

// A bad flag value stops the driver before any worker starts: one line, exit code 2.
TEST(DistributorExample, BadFlagValuesAreOneLineAndExitCode2) {
  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{
           {"--batch-size", "0"}, {"--lr", "-1"}, {"--epochs", "-1"}, {"--nproc", "0"}}) {
    SCOPED_TRACE(flag + " " + value);
    auto r = run_command({DISTRIBUTOR_EXAMPLE_BIN, flag, value}, {.timeout = 60s});
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_EQ(r.err.rfind(flag + ": expected a ", 0), 0u) << r.err;
    EXPECT_EQ(r.out, "");
  }
}

}  // namespace
