// The launcher against real clients nobody here wrote: an unchanged PyTorch DDP script under
// `dtrain run`, PyTorch's @record error files, and a dtrain C++ worker under PyTorch's own
// torchrun. python3-torch is a required component: without it these tests fail.
#include <gtest/gtest.h>
#include <unistd.h>

#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "launcher/subprocess.h"

namespace {

using dtrain::test::run_command;
using dtrain::test::RunOptions;
using namespace std::chrono_literals;

const std::string kPython = "/usr/bin/python3";
const std::string kInterop = std::string(DTRAIN_SOURCE_DIR) + "/tests/interop";

void require_python_torch() {
  auto r = run_command({kPython, "-c", "import torch, torch.distributed; print(torch.__version__)"},
                       {.timeout = 60s});
  ASSERT_EQ(r.exit_code, 0) << "Debian's python3-torch is required at " << kPython
                            << " (apt-get install python3-torch; scripts/setup.sh does it): "
                            << r.err;
}

RunOptions python_env() { return {.env = {"DTRAIN_PYTHON=" + kPython}, .timeout = 180s}; }

// Lines "[defaultN]:{json}" -> json by rank.
std::map<int, nlohmann::json> json_lines(const std::string& out) {
  std::map<int, nlohmann::json> by_rank;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    auto brace = line.find("]:{");
    if (brace == std::string::npos) continue;
    auto j = nlohmann::json::parse(line.substr(brace + 2));
    by_rank[j.at("rank").get<int>()] = j;
  }
  return by_rank;
}

TEST(LauncherInterop, UnchangedPytorchDdpScriptTrainsUnderDtrainRun) {
  require_python_torch();
  auto r = run_command({DTRAIN_BIN, "run", "--nproc-per-node", "2", kInterop + "/ddp_train.py"},
                       python_env());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto ranks = json_lines(r.out);
  ASSERT_EQ(ranks.size(), 2u) << r.out;
  EXPECT_EQ(ranks[0]["world_size"], 2);
  EXPECT_EQ(ranks[1]["local_rank"], 1);
  // DDP averaged the gradients of different data: both replicas must hold equal parameters.
  EXPECT_EQ(ranks[0]["digest"], ranks[1]["digest"]);
}

TEST(LauncherInterop, PythonModuleModeRunsTheSameScript) {
  require_python_torch();
  auto opts = python_env();
  opts.env.push_back("PYTHONPATH=" + kInterop);
  auto r = run_command({DTRAIN_BIN, "run", "--nproc_per_node", "2", "-m", "ddp_train"}, opts);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto ranks = json_lines(r.out);
  ASSERT_EQ(ranks.size(), 2u) << r.out;
  EXPECT_EQ(ranks[0]["digest"], ranks[1]["digest"]);
}

TEST(LauncherInterop, RecordErrorFileOfAFailingPythonWorkerIsInTheSummary) {
  require_python_torch();
  auto r = run_command({DTRAIN_BIN, "run", "--nproc-per-node", "2", kInterop + "/record_fail.py"},
                       python_env());
  EXPECT_EQ(r.exit_code, 1) << r.err;
  auto summary = r.err.find("root cause");
  ASSERT_NE(summary, std::string::npos) << r.err;
  std::string s = r.err.substr(summary);
  EXPECT_NE(s.find("rank       : 1"), std::string::npos) << s;
  EXPECT_NE(s.find("error file :"), std::string::npos) << s;
  EXPECT_NE(s.find("ValueError: rank 1 failed on purpose"), std::string::npos) << s;
  // Rank 0 was sleeping for 30 s: the launcher stopped it instead of waiting.
  EXPECT_LT(r.elapsed, 25.0);
}

// Under the torchrun of the PyTorch whose libtorch this build links (Debian's 1.13, or the
// venv's 2.x): each version's TCPStore client speaks its own torchrun's protocol.
TEST(LauncherInterop, DtrainCppWorkerRunsUnderTorchrun) {
  ASSERT_EQ(::access(DTRAIN_NATIVE_TORCHRUN, X_OK), 0)
      << "torchrun of PyTorch " << DTRAIN_TORCH_VERSION << " is required at " << DTRAIN_NATIVE_TORCHRUN
      << " (scripts/setup.sh installs it: python3-torch for 1.13, the venv for 2.x)";
  // Debian's torchrun on Python 3.11 crashes with its default --redirects 0 (IntFlag change).
  auto r = run_command({DTRAIN_NATIVE_TORCHRUN, "--nproc_per_node", "2", "--redirects", "9:1", "--tee",
                        "9:1", "--monitor_interval", "0.1", "--no_python", HELLO_WORKER_BIN},
                       {.timeout = 180s});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("hello from rank 0 of 2: all_reduce(rank + 1) = 3 (expected 3)"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("hello from rank 1 of 2: all_reduce(rank + 1) = 3 (expected 3)"), std::string::npos)
      << r.out;
}

TEST(LauncherInterop, DtrainCppWorkerRunsUnderDtrainRun) {
  auto r = run_command({DTRAIN_BIN, "run", "--nproc-per-node", "3", HELLO_WORKER_BIN}, {.timeout = 180s});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < 3; ++rank) {
    std::string line = "[default" + std::to_string(rank) + "]:hello from rank " + std::to_string(rank) +
                       " of 3: all_reduce(rank + 1) = 6 (expected 6)";
    EXPECT_NE(r.out.find(line), std::string::npos) << r.out;
  }
}

}  // namespace
