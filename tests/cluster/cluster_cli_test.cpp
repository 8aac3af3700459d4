// The cluster flags of the real `dtrain` binary that need no engine, no root and no network:
// the local --dry-run plan, bad host files and flag combinations (exit code 2, nothing
// started), a missing --ifname. The engines themselves are in the scripts beside this file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "launcher/subprocess.h"
#include "support/paths.h"

namespace dtrain::test {
namespace {

const std::string kDtrain = DTRAIN_BIN;
const std::string kWorker = TEST_WORKER_BIN;

class ClusterCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        std::filesystem::temp_directory_path() / ("cluster_cli_test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    marker_ = (dir_ / "ran").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string file(const std::string& text) {
    std::string p = (dir_ / "hosts").string();
    std::ofstream(p) << text;
    return p;
  }
  // dtrain run FLAGS test_worker --touch MARKER, without any Slurm variables.
  RunResult run(std::vector<std::string> flags) {
    std::vector<std::string> argv = {kDtrain, "run"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), {kWorker, "--touch", marker_});
    RunOptions o;
    o.unset = {"SLURM_JOB_ID", "SLURM_JOBID", "SLURM_STEP_ID", "SLURM_STEPID"};
    o.timeout = std::chrono::seconds(30);
    return run_command(argv, o);
  }
  void expect_usage_error(const RunResult& r, const std::string& text) {
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find(text), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(marker_)) << "the program ran";
  }
  std::filesystem::path dir_;
  std::string marker_;
};

TEST_F(ClusterCli, LocalDryRunPrintsThePlanAndStartsNothing) {
  RunResult r = run({"--dry-run", "--nproc-per-node", "3"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("engine     : local"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("world size : 3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("master     : 127.0.0.1:29500, or a free port if it is taken"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("ranks 0-2"), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(marker_));
}

TEST_F(ClusterCli, BadHostFilesAreExitCode2) {
  expect_usage_error(run({"--hostfile", file("n1 slots=2\nn2 slots=-1\n")}),
                     "line 2: 'n2 slots=-1': slots must be a positive integer");
  expect_usage_error(run({"--hostfile", file("n1 slots=2\nn1\n")}), "host 'n1' appears twice");
  expect_usage_error(run({"--hostfile", file("# none\n")}), "no hosts in it");
  expect_usage_error(run({"--hostfile", (dir_ / "missing").string()}), "cannot read");
  expect_usage_error(run({"-H", "n1:2,n2:zero"}), "slots must be a positive integer");
}

TEST_F(ClusterCli, FlagCombinationsAreExitCode2) {
  expect_usage_error(run({"--ssh-port", "2222"}), "only apply with --hostfile or -H");
  expect_usage_error(run({"-H", "n1,n2", "--nnodes", "2"}),
                     "--nnodes cannot be combined with --hostfile");
  expect_usage_error(run({"-H", "n1,n2", "--hostfile", file("n1\n")}), "use one of them");
  expect_usage_error(run({"-H", "n1,n2", "--master-addr", "127.0.0.1"}), "loopback");
  expect_usage_error(run({"-H", "n1", "--ssh-port", "70000"}), "--ssh-port: got '70000'");
}

TEST_F(ClusterCli, MissingInterfaceIsNamed) {
  expect_usage_error(run({"--ifname", "nosuchif0"}), "has no network interface 'nosuchif0'");
}

TEST_F(ClusterCli, IfnameReachesTheWorkers) {
  std::vector<std::string> argv = {kDtrain, "run",   "--no-slurm",  "--ifname",
                                   "lo",    kWorker, "--print-var", "GLOO_SOCKET_IFNAME"};
  RunResult r = run_command(argv, {});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[default0]:GLOO_SOCKET_IFNAME=lo"), std::string::npos) << r.out;
}

// `dtrain run -- PROG` (documented; CLI11 alone rejected it under the subcommand), and "--"
// after PROGRAM stays one of PROGRAM's arguments.
TEST_F(ClusterCli, DoubleDashBeforeAndAfterProgram) {
  RunResult r = run_command(
      {kDtrain, "run", "--nproc-per-node", "2", "--", kWorker, "--print-var", "RANK"}, {});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[default1]:RANK=1"), std::string::npos) << r.out;
  r = run_command({kDtrain, "run", "/bin/echo", "a", "--", "b"}, {});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[default0]:a -- b"), std::string::npos) << r.out;
  r = run_command({kDtrain, "run", "--"}, {});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("missing PROGRAM after '--'"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace dtrain::test
