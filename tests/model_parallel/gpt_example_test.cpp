// The GPT example end to end through `dtrain run`: real processes, the corpus Debian's
// base-files ships, and dp x pp x tp = 1 x 2 x 2 on 4 processes following the loss curve of
// 1 process; a bad shape is a clear error.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "launcher/subprocess.h"
#include "support/json_lines.h"
#include "support/paths.h"

namespace {

using dtrain::test::run_command;
using namespace std::chrono_literals;

nlohmann::json result_of(const std::string& out) { return dtrain::test::last_json_line(out); }

dtrain::test::RunResult gpt(int nproc, const std::vector<std::string>& extra) {
  std::vector<std::string> argv{DTRAIN_BIN,
                                "run",
                                "--nproc-per-node",
                                std::to_string(nproc),
                                GPT_BIN,
                                "--steps",
                                "4",
                                "--d-model",
                                "32",
                                "--block",
                                "16",
                                "--batch",
                                "8",
                                "--log-every",
                                "2"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return run_command(argv, {.timeout = 300s});
}

TEST(GptExample, PipelineAndTensorParallelOnFourProcessesMatchOneProcess) {
  auto one = gpt(1, {});
  ASSERT_EQ(one.exit_code, 0) << one.out << one.err;
  auto four = gpt(4, {"--pp", "2", "--tp", "2", "--micro-batches", "4"});
  ASSERT_EQ(four.exit_code, 0) << four.out << four.err;
  auto a = result_of(one.out), b = result_of(four.out);
  EXPECT_EQ(b["world_size"], 4);
  EXPECT_EQ(b["pp"], 2);
  EXPECT_EQ(b["tp"], 2);
  EXPECT_EQ(b["dp"], 1);
  ASSERT_EQ(a["losses"].size(), 4u) << one.out;
  ASSERT_EQ(b["losses"].size(), 4u) << four.out;
  for (size_t s = 0; s < 4; ++s)
    EXPECT_NEAR(b["losses"][s].get<double>(), a["losses"][s].get<double>(), 1e-4) << "step " << s;
  EXPECT_NE(four.out.find("[default0]:step 2 loss"), std::string::npos) << four.out;
}

TEST(GptExample, AShapeThatDoesNotFitTheWorldIsAClearError) {
  auto r = gpt(2, {"--pp", "2", "--tp", "2"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE((r.out + r.err).find("pp * tp = 4 does not divide the world size 2"), std::string::npos)
      << r.out << r.err;
}

}  // namespace
