// The Spark engine's sizing (as TorchDistributor) and spark-submit command line, without a
// cluster or a GPU.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "dtrain/error.h"
#include "dtrain/spark.h"

namespace {

std::map<std::string, std::string> conf_of(const dtrain::spark::Plan& p) {
  return {p.conf.begin(), p.conf.end()};
}

TEST(SparkPlan, CpuOneProcessPerTaskLikeTorchDistributor) {
  auto p = dtrain::spark::plan(4, false, 0, {});
  EXPECT_EQ(p.tasks, 4);
  EXPECT_EQ(p.processes_per_task, 1);
  auto c = conf_of(p);
  EXPECT_EQ(c.at("spark.task.cpus"), "1");
  EXPECT_EQ(c.at("spark.task.maxFailures"), "1");  // no silent rerun of the barrier stage
  EXPECT_EQ(c.at("spark.stage.maxConsecutiveAttempts"), "1");
  EXPECT_EQ(c.count("spark.task.resource.gpu.amount"), 0u);
}

TEST(SparkPlan, ProcessesPerTaskTakeThatManyCpus) {
  auto p = dtrain::spark::plan(4, false, 2, {});
  EXPECT_EQ(p.tasks, 2);
  EXPECT_EQ(p.processes_per_task, 2);
  EXPECT_EQ(conf_of(p).at("spark.task.cpus"), "2");
}

TEST(SparkPlan, GpuAmountSizesTasksAsTorchDistributor) {
  // TorchDistributor: ceil(num_processes / spark.task.resource.gpu.amount) tasks.
  auto p = dtrain::spark::plan(8, true, 0, {"spark.task.resource.gpu.amount=2"});
  EXPECT_EQ(p.tasks, 4);
  EXPECT_EQ(p.processes_per_task, 2);
  auto c = conf_of(p);
  EXPECT_EQ(c.at("spark.task.resource.gpu.amount"), "2");
  EXPECT_EQ(c.count("spark.task.cpus"), 0u);
}

TEST(SparkPlan, GpuWithoutAmountAsksOneGpuPerProcess) {
  auto p = dtrain::spark::plan(2, true, 0, {});
  EXPECT_EQ(p.tasks, 2);
  EXPECT_EQ(conf_of(p).at("spark.task.resource.gpu.amount"), "1");
  auto q = dtrain::spark::plan(4, true, 4, {});
  EXPECT_EQ(q.tasks, 1);
  EXPECT_EQ(conf_of(q).at("spark.task.resource.gpu.amount"), "4");
}

TEST(SparkPlan, BadInputIsAUsageErrorThatSaysWhat) {
  EXPECT_THROW(dtrain::spark::plan(0, false, 0, {}), dtrain::UsageError);
  EXPECT_THROW(dtrain::spark::plan(2, false, -1, {}), dtrain::UsageError);
  EXPECT_THROW(dtrain::spark::plan(2, false, 0, {"novalue"}), dtrain::UsageError);
  EXPECT_THROW(dtrain::spark::plan(2, true, 0, {"spark.task.resource.gpu.amount=0.5"}),
               dtrain::UsageError);
  try {
    dtrain::spark::plan(3, false, 2, {});
    FAIL() << "3 processes in tasks of 2 must be refused";
  } catch (const dtrain::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of the processes each Spark task runs (2)"),
              std::string::npos)
        << e.what();
  }
}

TEST(SparkPlan, UserConfWins) {
  auto c = conf_of(
      dtrain::spark::plan(2, false, 0, {"spark.task.maxFailures=4", "spark.executor.memory=2g"}));
  EXPECT_EQ(c.at("spark.task.maxFailures"), "4");
  EXPECT_EQ(c.at("spark.executor.memory"), "2g");
}

TEST(SparkSubmit, CommandLine) {
  ::setenv("PYSPARK_PYTHON", "python3", 1);
  auto p = dtrain::spark::plan(4, false, 2, {});
  auto c = dtrain::spark::submit_command({"spark://127.0.0.1:7077", "/bin/true", "10.0.0.1", 5}, p);
  ASSERT_GE(c.argv.size(), 8u);
  EXPECT_EQ(c.argv[0], "/bin/true");
  EXPECT_EQ(c.argv[1], "--master");
  EXPECT_EQ(c.argv[2], "spark://127.0.0.1:7077");
  EXPECT_EQ(c.argv.back(), "--");
  const std::string joined = [&] {
    std::string s;
    for (const auto& a : c.argv) s += a + " ";
    return s;
  }();
  EXPECT_NE(joined.find("--conf spark.driver.host=10.0.0.1"), std::string::npos) << joined;
  EXPECT_NE(joined.find("spark.py --tasks 2 --slot-timeout 5 --"), std::string::npos) << joined;
  EXPECT_THROW(dtrain::spark::submit_command({"", "/bin/true", "", 5}, p), dtrain::UsageError);
  EXPECT_THROW(
      dtrain::spark::submit_command({"spark://h:1", "/nonexistent/spark-submit", "", 5}, p),
      dtrain::UsageError);
}

TEST(SparkSubmit, LoopbackMaster) {
  EXPECT_TRUE(dtrain::spark::master_is_loopback("spark://127.0.0.1:7077"));
  EXPECT_TRUE(dtrain::spark::master_is_loopback("spark://localhost:7077"));
  EXPECT_TRUE(dtrain::spark::master_is_loopback("spark://[::1]:7077"));
  EXPECT_FALSE(dtrain::spark::master_is_loopback("spark://10.1.2.3:7077"));
  EXPECT_FALSE(dtrain::spark::master_is_loopback("spark://sparkhead:7077"));
}

// The kept application: what cannot start fails before anything is started, and no
// application is kept then (the cluster test, spark_test.sh, runs the real one).
TEST(SparkApp, BadSubmitIsAUsageErrorAndKeepsNothing) {
  auto p = dtrain::spark::plan(2, false, 1, {});
  try {
    dtrain::spark::app_job_command(
        {.master = "spark://h:7077", .spark_submit = "/nonexistent/spark-submit"}, p,
        std::chrono::seconds(60), std::chrono::seconds(10));
    FAIL() << "expected UsageError";
  } catch (const dtrain::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("spark-submit"), std::string::npos) << e.what();
  }
  EXPECT_THROW(dtrain::spark::app_job_command({.master = ""}, p, std::chrono::seconds(60),
                                              std::chrono::seconds(10)),
               dtrain::UsageError);
  EXPECT_EQ(dtrain::spark::app_id(), "");
  dtrain::spark::stop_app();  // nothing to stop: a no-op
}

// `dtrain launch --spark-master`'s own value check names the command typed.
TEST(SparkCli, ValueErrorsNameTheCommandTyped) {
  for (const std::string command : {"run", "launch"}) {
    std::vector<std::string> args{"dtrain", command, "--spark-master", "local", "--nnodes",
                                  "0",      "prog"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    try {
      dtrain::spark::exec_cli_if_requested(static_cast<int>(argv.size()), argv.data());
      ADD_FAILURE() << "no refusal";
    } catch (const dtrain::UsageError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("dtrain " + command +
                                                " --spark-master: --nnodes must be a whole "
                                                "number >= 1",
                                            0),
                0u)
          << e.what();
    }
  }
}

}  // namespace
