// hvd::elastic end to end (real processes, the real launcher):
//   - `dtrain horovodrun --min-np 2 --max-np 3 --host-discovery-script` on three local
//     "hosts"; rank 1 SIGKILLs itself; its host's agent leaves, the two survivors restart at
//     size 2 from the last commit (model, momentum, fields) and finish; the final parameters
//     equal a one-process replay of 4 steps at size 3 and 4 at size 2.
//   - bad elastic flags and bad discovery output: a clear error, no process started.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include "horovod/hvd_elastic_common.h"
#include "launcher/subprocess.h"
#include "support/paths.h"

namespace {

using dtrain::test::run_command;
using namespace std::chrono_literals;
using namespace hvd_elastic_test;
namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    std::string t = (fs::temp_directory_path() / "hvd_elastic_XXXXXX").string();
    path = ::mkdtemp(t.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::string script(const fs::path& dir, const std::string& name, const std::string& body,
                   bool executable = true) {
  auto p = dir / name;
  std::ofstream(p) << "#!/bin/sh\n" << body;
  ::chmod(p.c_str(), executable ? 0755 : 0644);
  return p.string();
}

// The job's in-memory commit directories; with `driver_err`, only those of the job that driver
// ran (its run id), so a test running beside another elastic test sees its own only.
std::set<std::string> hvd_memory_dirs(const std::string& driver_err = "") {
  std::string run_id;
  std::smatch m;
  if (std::regex_search(driver_err, m, std::regex("job (hvd-elastic-[0-9]+-[0-9]+)")))
    run_id = m[1];
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator("/dev/shm")) {
    const std::string name = e.path().filename().string();
    if (name.rfind("dtrain-hvd-elastic-", 0) != 0) continue;
    if (!driver_err.empty() &&
        (run_id.empty() || name.find("-" + run_id + "-") == std::string::npos))
      continue;
    out.insert(e.path().string());
  }
  return out;
}

// The expected parameters: steps [0, switch_at) averaged over `before` ranks, then over `after`.
std::vector<torch::Tensor> replay(int switch_at = 4, int before = 3, int after = 2) {
  auto model = make_model();
  auto sgd = make_optimizer(model);
  for (int step = 0; step < kSteps; ++step) {
    const int size = step < switch_at ? before : after;
    std::vector<torch::Tensor> grads;
    for (auto& p : model->parameters()) grads.push_back(torch::zeros_like(p));
    for (int r = 0; r < size; ++r) {
      sgd.zero_grad();
      loss(model, step, r).backward();
      auto ps = model->parameters();
      for (size_t i = 0; i < ps.size(); ++i) grads[i] += ps[i].grad();
    }
    auto ps = model->parameters();
    for (size_t i = 0; i < ps.size(); ++i) ps[i].mutable_grad() = grads[i] / size;
    sgd.step();
  }
  std::vector<torch::Tensor> out;
  for (auto& p : model->parameters()) out.push_back(p.detach().clone());
  return out;
}

TEST(HvdElastic, AKilledWorkersHostLeavesAndTheSurvivorsGoOnFromTheLastCommitAtTheSmallerSize) {
  TempDir dir;
  auto hosts =
      script(dir.path, "hosts.sh", "echo localhost:1\necho 127.0.0.1:1\necho 127.0.0.2:1\n");
  auto out = (dir.path / "final.pt").string();
  auto r = run_command({DTRAIN_BIN, "horovodrun", "--min-np", "2", "--max-np", "3",
                        "--host-discovery-script", hosts, HVD_ELASTIC_WORKER_BIN, out, "1"},
                       {.timeout = 150s});
  std::printf("elastic run: %.1f s\n", r.elapsed);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  // First attempt: 3 ranks commit steps 2 and 4 (the kill comes before step 5).
  std::smatch m;
  std::string commit4;
  for (int k = 0; k < 3; ++k) {
    std::regex re("commit rank=" + std::to_string(k) + " size=3 step=4 sum=(\\S+)");
    ASSERT_TRUE(std::regex_search(r.out, m, re)) << r.out;
    if (k == 0) commit4 = m[1];
    EXPECT_EQ(m[1], commit4) << "replicas differ at the commit";
  }
  EXPECT_EQ(r.out.find("size=3 step=6"), std::string::npos) << "a size-3 commit after the kill:\n"
                                                            << r.out;
  // The agent of the victim's host left; the driver blacklisted it.
  EXPECT_NE(r.err.find("leaving the job: a worker of this node failed"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("is blacklisted"), std::string::npos) << r.err;
  // The survivors: size 2, from the memory commit of step 4 (the job's 2nd commit), the committed
  // parameters exactly, the reset callback called; then they finish.
  for (int k = 0; k < 2; ++k) {
    std::regex re("start rank=" + std::to_string(k) +
                  " size=2 attempt=[1-9][0-9]* step=4 sum=(\\S+) resets=1 "
                  "from=memory:\\S+/hvd_elastic_2\\.pt");
    ASSERT_TRUE(std::regex_search(r.out, m, re)) << r.out;
    EXPECT_EQ(m[1], commit4);
    EXPECT_NE(r.out.find("commit rank=" + std::to_string(k) + " size=2 step=8"), std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("done rank=" + std::to_string(k) + " size=2"), std::string::npos) << r.out;
  }
  EXPECT_EQ(r.out.find("done rank=2"), std::string::npos) << r.out;
  // Nothing is left behind: every worker and agent is gone, and the memory commits too.
  std::vector<pid_t> pids;
  std::regex pid_re("(?:pid=|pid )([0-9]+)");
  for (const std::string* text : {&r.out, &r.err}) {
    for (auto it = std::sregex_iterator(text->begin(), text->end(), pid_re);
         it != std::sregex_iterator(); ++it) {
      pids.push_back(std::stoi((*it)[1]));
    }
  }
  EXPECT_GE(pids.size(), 3u + 2u + 3u) << "3 + 2 workers and 3 agents: " << r.out << r.err;
  EXPECT_TRUE(dtrain::test::wait_dead(pids, 10s));
  ASSERT_NE(r.err.find("job hvd-elastic-"), std::string::npos)
      << r.err;  // the run id the check below needs
  EXPECT_EQ(hvd_memory_dirs(r.err), std::set<std::string>{})
      << "the job's in-memory commits were left";
  // Values: momentum and parameters came back, and the last 4 steps ran at size 2.
  std::vector<torch::Tensor> got;
  torch::load(got, out);
  auto want = replay();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    double diff = (got[i] - want[i]).abs().max().item<double>();
    EXPECT_LE(diff, 1e-9) << "parameter " << i << "\n got " << got[i] << "\n want " << want[i];
  }
}

// Horovod's Adasum optimizer, replayed: each rank steps its own SGD (its own momentum buffer)
// on its own gradient; the deltas are combined per tensor with
// a' = (1 - a.b / (2|a|^2)) a + (1 - a.b / (2|b|^2)) b and added to the common start.
TEST(HvdAdasumOptimizer, TwoRanksEqualTheAdasumOfTheirLocalSgdStepsWithOwnMomentum) {
  TempDir dir;
  auto out = (dir.path / "adasum").string();
  auto r = run_command(
      {DTRAIN_BIN, "run", "--nproc-per-node", "2", HVD_ELASTIC_WORKER_BIN, "adasum", out},
      {.timeout = 120s});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;

  auto model = make_model();
  const double lr = 0.05, momentum = 0.9;
  std::vector<std::vector<torch::Tensor>> bufs(2);
  double gap_to_mean = 0;  // how far Adasum's combination is from the plain mean of the deltas
  for (int step = 0; step < kAdasumSteps; ++step) {
    std::vector<std::vector<torch::Tensor>> delta(2);
    for (int rank = 0; rank < 2; ++rank) {
      for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
      loss(model, step, rank).backward();
      auto ps = model->parameters();
      for (size_t i = 0; i < ps.size(); ++i) {
        auto g = ps[i].grad().detach();
        if (step == 0)
          bufs[rank].push_back(g.clone());
        else
          bufs[rank][i] = bufs[rank][i] * momentum + g;
        delta[rank].push_back(-lr * bufs[rank][i]);
      }
    }
    torch::NoGradGuard no_grad;
    auto ps = model->parameters();
    for (size_t i = 0; i < ps.size(); ++i) {
      auto a = delta[0][i].reshape({-1}), b = delta[1][i].reshape({-1});
      double dot = a.dot(b).item<double>(), na = a.dot(a).item<double>(),
             nb = b.dot(b).item<double>();
      auto combined = a * (1 - dot / (2 * na)) + b * (1 - dot / (2 * nb));
      gap_to_mean = std::max(gap_to_mean, (combined - (a + b) / 2).abs().max().item<double>());
      ps[i].add_(combined.view(ps[i].sizes()));
    }
  }
  // Adasum's combination is not the mean here, so matching it is not matching Average.
  std::printf("Adasum vs the mean of the deltas: max gap %g\n", gap_to_mean);
  EXPECT_GT(gap_to_mean, 1e-4);
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<torch::Tensor> got;
    torch::load(got, out + "." + std::to_string(rank));
    auto want = model->parameters();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      double diff = (got[i] - want[i]).abs().max().item<double>();
      EXPECT_LE(diff, 1e-10) << "rank " << rank << " parameter " << i << "\n got " << got[i]
                             << "\n want " << want[i];
    }
  }
}

// The discovery script lists a third host once rank 0 created a file: the driver starts its
// agent, the workers see it (check_host_updates) or are restarted first, and all three go on
// from the last commit at size 3.
TEST(HvdElastic, AHostTheScriptAddsJoinsAndTheJobGoesOnAtTheLargerSizeFromTheLastCommit) {
  TempDir dir;
  auto flag = (dir.path / "grow").string();
  auto hosts = script(
      dir.path, "hosts.sh",
      "echo localhost:1\necho 127.0.0.1:1\nif [ -f " + flag + " ]; then echo 127.0.0.2:1; fi\n");
  auto out = (dir.path / "final.pt").string();
  auto r =
      run_command({DTRAIN_BIN, "horovodrun", "--min-np", "2", "--max-np", "3",
                   "--host-discovery-script", hosts, HVD_ELASTIC_WORKER_BIN, "grow", out, flag},
                  {.timeout = 150s});
  std::printf("elastic run with a host added: %.1f s\n", r.elapsed);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("started the agent for 127.0.0.2"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("a new node is waiting to join the job"), std::string::npos) << r.err;
  // Where the size-3 workers started: the commit of step 2, or the one commit() made at
  // step 3 when it saw the host before the restart.
  std::smatch m;
  std::string resumed;
  for (int k = 0; k < 3; ++k) {
    std::regex re("start rank=" + std::to_string(k) +
                  " size=3 attempt=[1-9][0-9]* step=([23]) sum=\\S+ resets=1 from=memory:");
    ASSERT_TRUE(std::regex_search(r.out, m, re)) << r.out;
    if (k == 0) resumed = m[1];
    EXPECT_EQ(m[1], resumed);
    EXPECT_NE(r.out.find("done rank=" + std::to_string(k) + " size=3"), std::string::npos) << r.out;
  }
  std::printf("the size-3 workers resumed from the commit of step %s (%s)\n", resumed.c_str(),
              resumed == "3" ? "commit() saw the host first" : "the agent restarted them first");
  ASSERT_NE(r.err.find("job hvd-elastic-"), std::string::npos)
      << r.err;  // the run id the check below needs
  EXPECT_EQ(hvd_memory_dirs(r.err), std::set<std::string>{})
      << "the job's in-memory commits were left";
  std::vector<torch::Tensor> got;
  torch::load(got, out);
  auto want = replay(std::stoi(resumed), 2, 3);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_LE((got[i] - want[i]).abs().max().item<double>(), 1e-9) << "parameter " << i;
  }
}

TEST(HvdElastic, BadFlagsAndBadDiscoveryOutputAreClearErrors) {
  TempDir dir;
  auto ok = script(dir.path, "ok.sh", "echo localhost:2\n");
  struct Case {
    std::vector<std::string> args;
    int code;
    std::string expect;
  };
  std::vector<Case> cases = {
      {{"--min-np", "2", HVD_ELASTIC_WORKER_BIN}, 2, "need --host-discovery-script SCRIPT"},
      {{"--min-np", "3", "--max-np", "2", "--host-discovery-script", ok, HVD_ELASTIC_WORKER_BIN},
       2,
       "--max-np 2 is below --min-np 3"},
      {{"-np", "5", "--min-np", "2", "--max-np", "3", "--host-discovery-script", ok,
        HVD_ELASTIC_WORKER_BIN},
       2,
       "-np 5 is outside --min-np 2 .. --max-np 3"},
      {{"--min-np", "0", "--host-discovery-script", ok, HVD_ELASTIC_WORKER_BIN},
       2,
       "--min-np: got '0', expected a positive integer"},
      {{"--min-np", "2", "-H", "localhost:2", "--host-discovery-script", ok,
        HVD_ELASTIC_WORKER_BIN},
       2,
       "-H/--hostfile and --host-discovery-script both given"},
      {{"--min-np", "2", "--host-discovery-script", ok}, 2, "missing PROGRAM"},
      {{"--min-np", "2", "--host-discovery-script", ok, "/nonexistent/prog"},
       2,
       "/nonexistent/prog"},
      {{"--min-np", "2", "--blacklist-cooldown-range", "1", "--host-discovery-script", ok,
        HVD_ELASTIC_WORKER_BIN},
       2,
       "--blacklist-cooldown-range: not built"},
      {{"--min-np", "2", "--host-discovery-script", (dir.path / "missing.sh").string(),
        HVD_ELASTIC_WORKER_BIN},
       2,
       "missing.sh: no such file"},
      {{"--min-np", "2", "--host-discovery-script",
        script(dir.path, "noexec.sh", "echo localhost:2\n", false), HVD_ELASTIC_WORKER_BIN},
       2,
       "noexec.sh: not executable"},
      {{"--min-np", "2", "--host-discovery-script",
        script(dir.path, "badslots.sh", "echo localhost:two\n"), HVD_ELASTIC_WORKER_BIN},
       2,
       "printed line 1 'localhost:two': the slots after ':' must be a positive integer"},
      {{"--min-np", "2", "--host-discovery-script",
        script(dir.path, "dup.sh", "echo localhost:1\necho localhost:1\n"), HVD_ELASTIC_WORKER_BIN},
       2,
       "host 'localhost' is listed twice"},
      {{"--min-np", "2", "--host-discovery-script",
        script(dir.path, "remote.sh", "echo gpu-node-17:4\n"), HVD_ELASTIC_WORKER_BIN},
       2,
       "'gpu-node-17' is unreachable over ssh"},
      {{"--min-np", "2", "--host-discovery-script",
        script(dir.path, "fails.sh", "echo oops >&2\nexit 3\n"), HVD_ELASTIC_WORKER_BIN},
       1,
       "exited with code 3; its stderr: oops"},
      {{"--min-np", "3", "--start-timeout", "1", "--host-discovery-script", ok,
        HVD_ELASTIC_WORKER_BIN},
       1,
       "lists 1 host(s) with 2 slot(s) after --start-timeout 1 s, but --min-np 3 needs that many"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> argv{DTRAIN_BIN, "horovodrun"};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    auto r = run_command(argv, {.timeout = 30s});
    EXPECT_EQ(r.exit_code, c.code) << c.expect << "\n" << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.expect << "\n" << r.err;
    EXPECT_EQ(r.err.find("started the agent"), std::string::npos) << r.err;
  }
}

}  // namespace
