// Resume without user code (dtrain/elastic_state.h), on real processes under `dtrain run`:
// tests/elastic/elastic_train_worker.cpp trains with ElasticState and logs, per rank and
// attempt, the samples of every step and (rank 0) the loss.
//   - a worker SIGKILLed mid-epoch under --max-restarts (disk commits, then in-memory
//     commits): the job finishes, every sample of every epoch was trained on exactly once
//     (counting each attempt's steps up to the step the next attempt resumed from), at most
//     one commit interval was lost, and the loss after recovery equals the uninterrupted run's;
//   - three nodes (agents on loopback, --nnodes 2:3), one agent SIGKILLed: the two survivors
//     resume at world size 2, exactly once;
//   - two nodes of --nnodes 2:3, one killed: the job fails saying fewer than MIN remain;
//   - the ZeRO engine's partitioned state (stage 2 with disk commits, stage 3 in memory): a
//     2-rank job killed mid-epoch, started again on 1 rank, resumes from its commit and ends
//     with the parameters of an uninterrupted 2-rank run (same global batches);
//   - no worker process is left behind in any case.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "launcher/subprocess.h"
#include "support/free_port.h"
#include "support/paths.h"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using dtrain::test::Process;
using dtrain::test::RunOptions;
using dtrain::test::RunResult;

const std::string kWorker = ELASTIC_TRAIN_WORKER_BIN;
constexpr int64_t kSize = 240;
constexpr int64_t kBatch = 8;
constexpr int64_t kEpochs = 2;
constexpr int64_t kCommitEvery = 3;

bool has(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

std::string describe(const RunResult& r) {
  return "exit " + std::to_string(r.exit_code) + " after " + std::to_string(r.elapsed) +
         " s\n--- stdout\n" + r.out + "--- stderr\n" + r.err;
}

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/dtrain-resume-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  explicit TempDir(std::nullptr_t) {}
  static const TempDir& none() {
    static const TempDir empty(nullptr);
    return empty;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// What one attempt (TORCHELASTIC_RESTART_COUNT) of a job logged, over all its ranks.
struct Attempt {
  int64_t resume_step = -1;
  int world = 0;
  int64_t last_step = 0;
  // step -> epoch and the samples of that step, over all ranks
  std::map<int64_t, std::pair<int64_t, std::vector<int64_t>>> steps;
  std::map<int64_t, double> loss;  // rank 0's
  std::vector<int> pids;
};

std::map<int, Attempt> read_logs(const fs::path& dir) {
  std::map<int, Attempt> attempts;
  for (const auto& entry : fs::directory_iterator(dir)) {
    int attempt = -1, rank = -1;
    if (std::sscanf(entry.path().filename().c_str(), "attempt%d_rank%d.log", &attempt, &rank) != 2)
      continue;
    Attempt& a = attempts[attempt];
    std::ifstream in(entry.path());
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      std::string kind;
      ls >> kind;
      if (kind == "pid") {
        int pid;
        ls >> pid;
        a.pids.push_back(pid);
      } else if (kind == "resume") {
        ls >> a.resume_step >> a.world;
      } else if (kind == "step") {
        int64_t step, epoch, idx;
        ls >> step >> epoch;
        auto& slot = a.steps[step];
        slot.first = epoch;
        while (ls >> idx) slot.second.push_back(idx);
        a.last_step = std::max(a.last_step, step);
      } else if (kind == "loss") {
        int64_t step;
        double loss;
        ls >> step >> loss;
        a.loss[step] = loss;
      }
    }
  }
  return attempts;
}

// Every sample of every epoch trained on exactly once: each attempt counts up to the step the
// next attempt resumed from (its later steps were lost with it). Returns a description of the
// first violation, or "".
std::string check_exactly_once(const std::map<int, Attempt>& attempts) {
  std::map<int64_t, std::vector<int64_t>> seen;  // epoch -> samples
  for (auto it = attempts.begin(); it != attempts.end(); ++it) {
    auto next = std::next(it);
    const int64_t cutoff = next == attempts.end() ? INT64_MAX : next->second.resume_step;
    for (const auto& [step, slot] : it->second.steps) {
      if (step > cutoff) continue;
      auto& s = seen[slot.first];
      s.insert(s.end(), slot.second.begin(), slot.second.end());
    }
  }
  for (int64_t epoch = 0; epoch < kEpochs; ++epoch) {
    auto s = seen[epoch];
    std::sort(s.begin(), s.end());
    std::map<int64_t, int> count;
    for (int64_t i : s) ++count[i];
    for (int64_t i = 0; i < kSize; ++i) {
      if (count[i] != 1) {
        return "epoch " + std::to_string(epoch) + ": sample " + std::to_string(i) + " trained on " +
               std::to_string(count[i]) + " times";
      }
    }
    if (static_cast<int64_t>(s.size()) != kSize)
      return "epoch " + std::to_string(epoch) + ": unexpected samples";
  }
  return "";
}

std::string summary(const std::map<int, Attempt>& attempts) {
  std::string out;
  for (const auto& [n, a] : attempts) {
    out += "attempt " + std::to_string(n) + ": resumed at step " + std::to_string(a.resume_step) +
           ", world " + std::to_string(a.world) + ", last step logged " +
           std::to_string(a.last_step) + "\n";
  }
  return out;
}

void expect_no_process_left(const std::map<int, Attempt>& attempts) {
  for (const auto& [n, a] : attempts) {
    std::vector<pid_t> pids(a.pids.begin(), a.pids.end());
    EXPECT_FALSE(pids.empty()) << "attempt " << n << " logged no pid";
    EXPECT_TRUE(dtrain::test::wait_dead(pids, 5s))
        << "a worker of attempt " << n << " is still running";
  }
}

std::vector<std::string> worker_args(const TempDir& logs, const TempDir& ckpt,
                                     const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {kWorker,
                                   "--size",
                                   std::to_string(kSize),
                                   "--batch",
                                   std::to_string(kBatch),
                                   "--epochs",
                                   std::to_string(kEpochs),
                                   "--commit-every",
                                   std::to_string(kCommitEvery),
                                   "--log-dir",
                                   logs.path.string()};
  if (!ckpt.path.empty()) argv.insert(argv.end(), {"--checkpoint-dir", ckpt.path.string()});
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

RunOptions clean_env() {
  RunOptions ro;
  ro.unset = {"RANK",        "WORLD_SIZE",  "LOCAL_RANK",
              "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT"};
  ro.timeout = 120s;
  return ro;
}

RunResult run_local(const std::vector<std::string>& launcher,
                    const std::vector<std::string>& worker) {
  std::vector<std::string> argv = {DTRAIN_BIN,           "run", "--nproc-per-node", "2",
                                   "--monitor-interval", "0.1"};
  argv.insert(argv.end(), launcher.begin(), launcher.end());
  argv.insert(argv.end(), worker.begin(), worker.end());
  Process p = Process::start(argv, clean_env());
  return p.finish(120s);
}

class KilledWorker : public ::testing::TestWithParam<bool> {};  // in-memory commits?

// 2 ranks, 15 steps an epoch, 2 epochs; rank 1 dies after step 20 (epoch 1, mid-epoch); the
// newest commit is step 18, so the restarted job resumes there, 48 samples into epoch 1.
TEST_P(KilledWorker, ResumesExactlyOnceAndContinuesTheLoss) {
  const bool in_memory = GetParam();
  TempDir ref_logs, ref_ckpt, logs, ckpt;
  RunResult ref = run_local({}, worker_args(ref_logs, ref_ckpt, {}));
  ASSERT_EQ(ref.exit_code, 0) << describe(ref);
  std::vector<std::string> extra = {"--kill-at-step", "20", "--kill-rank", "1"};
  if (in_memory) extra.push_back("--in-memory");
  RunResult r = run_local({"--max-restarts", "1"}, worker_args(logs, ckpt, extra));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_TRUE(has(r.err, "  rank       : 1 (local rank 1)\n"))
      << "the failure summary names the killed rank\n"
      << describe(r);
  EXPECT_TRUE(has(r.err, "  signal     : SIGKILL (9)")) << describe(r);
  EXPECT_TRUE(has(r.err, in_memory ? "resumed from memory:" : "resumed from disk:")) << describe(r);

  auto reference = read_logs(ref_logs.path);
  auto attempts = read_logs(logs.path);
  ASSERT_EQ(attempts.size(), 2u) << summary(attempts);
  const Attempt& first = attempts.at(0);
  const Attempt& second = attempts.at(1);
  EXPECT_EQ(first.resume_step, 0);
  EXPECT_EQ(second.resume_step, 18) << summary(attempts);
  EXPECT_EQ(second.world, 2);
  EXPECT_LE(first.last_step - second.resume_step, kCommitEvery)
      << "more than one commit interval lost\n"
      << summary(attempts);
  EXPECT_EQ(check_exactly_once(attempts), "") << summary(attempts);
  EXPECT_EQ(check_exactly_once(reference), "");

  // Same samples, parameters, Adam state, learning rate and dropout RNG: the same losses.
  ASSERT_EQ(reference.at(0).loss.size(), static_cast<size_t>(30));
  ASSERT_FALSE(second.loss.empty());
  for (const auto& [step, loss] : second.loss) {
    ASSERT_TRUE(reference.at(0).loss.count(step)) << step;
    EXPECT_NEAR(loss, reference.at(0).loss.at(step), 1e-6 * std::max(1.0, std::fabs(loss)))
        << "step " << step;
  }
  for (const auto& [step, loss] : first.loss) {
    EXPECT_NEAR(loss, reference.at(0).loss.at(step), 1e-6 * std::max(1.0, std::fabs(loss)))
        << "step " << step;
  }
  expect_no_process_left(attempts);
  expect_no_process_left(reference);
}

INSTANTIATE_TEST_SUITE_P(ElasticResume, KilledWorker, ::testing::Values(false, true),
                         [](const auto& info) {
                           return info.param ? std::string("InMemory") : std::string("Disk");
                         });

// name -> values, as the worker's --params-out writes them.
std::map<std::string, std::vector<double>> read_params(const fs::path& path) {
  std::map<std::string, std::vector<double>> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string name;
    ls >> name;
    for (double v; ls >> v;) out[name].push_back(v);
  }
  return out;
}

RunResult run_n(int nproc, const std::vector<std::string>& worker) {
  std::vector<std::string> argv = {
      DTRAIN_BIN, "run", "--nproc-per-node", std::to_string(nproc), "--monitor-interval", "0.1"};
  argv.insert(argv.end(), worker.begin(), worker.end());
  Process p = Process::start(argv, clean_env());
  return p.finish(120s);
}

class ZeroWorldChange : public ::testing::TestWithParam<int> {};  // the stage; 3: in-memory commits

// 2 ranks, global batch 8 (4 per rank; 8 on one rank), 30 steps an epoch; rank 1 dies after
// step 40, the newest commit is step 39; the job started again on one rank resumes there.
TEST_P(ZeroWorldChange, TwoRanksToOneResumesThePartitionedState) {
  const int stage = GetParam();
  const bool in_memory = stage == 3;
  TempDir ref_logs, ref_ckpt, logs1, logs2, ckpt, mem;
  const fs::path mem_dir = mem.path / "commits";
  std::vector<std::string> zero = {"--zero", std::to_string(stage)};
  auto with = [&](const TempDir& logs, std::vector<std::string> extra) {
    extra.insert(extra.end(), zero.begin(), zero.end());
    if (in_memory) extra.insert(extra.end(), {"--in-memory", "--memory-dir", mem_dir.string()});
    return worker_args(logs, in_memory ? TempDir::none() : ckpt, extra);
  };
  RunResult ref = run_n(2, worker_args(ref_logs, ref_ckpt,
                                       {"--zero", std::to_string(stage), "--params-out",
                                        (ref_logs.path / "params").string()}));
  ASSERT_EQ(ref.exit_code, 0) << describe(ref);
  RunResult killed = run_n(2, with(logs1, {"--kill-at-step", "40", "--kill-rank", "1"}));
  ASSERT_EQ(killed.exit_code, 137) << describe(killed);
  RunResult resumed =
      run_n(1, with(logs2, {"--resume-always", "--params-out", (logs2.path / "params").string()}));
  ASSERT_EQ(resumed.exit_code, 0) << describe(resumed);
  EXPECT_TRUE(
      has(resumed.err, std::string(in_memory ? "resumed from memory:" : "resumed from disk:")) &&
      has(resumed.err, "step 39 (committed at world size 2, now 1)"))
      << describe(resumed);

  std::map<int, Attempt> attempts = {{0, read_logs(logs1.path).at(0)},
                                     {1, read_logs(logs2.path).at(0)}};
  EXPECT_EQ(attempts.at(1).resume_step, 39) << summary(attempts);
  EXPECT_EQ(attempts.at(1).world, 1);
  EXPECT_EQ(check_exactly_once(attempts), "") << summary(attempts);
  // Same global batches, parameters, fp32 master and Adam moments: the same losses and the
  // same final parameters, up to the order of float sums (a 2-way reduce vs none).
  const auto reference = read_logs(ref_logs.path).at(0);
  for (const auto& [step, loss] : attempts.at(1).loss) {
    ASSERT_TRUE(reference.loss.count(step)) << step;
    EXPECT_NEAR(loss, reference.loss.at(step), 1e-5 * std::max(1.0, std::fabs(loss)))
        << "step " << step;
  }
  auto want = read_params(ref_logs.path / "params");
  auto got = read_params(logs2.path / "params");
  ASSERT_EQ(want.size(), 4u);  // two Linear layers' weights and biases
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  for (const auto& [name, values] : want) {
    ASSERT_EQ(got[name].size(), values.size()) << name;
    for (size_t i = 0; i < values.size(); ++i)
      worst = std::max(worst, std::fabs(got[name][i] - values[i]));
  }
  EXPECT_LT(worst, 1e-5) << "largest parameter difference from the uninterrupted run";
  ASSERT_TRUE(reference.loss.count(1) && reference.loss.count(60));
  EXPECT_LT(reference.loss.at(60), reference.loss.at(1)) << "the runs did not train";
  expect_no_process_left(attempts);
}

INSTANTIATE_TEST_SUITE_P(ElasticResume, ZeroWorldChange, ::testing::Values(2, 3),
                         [](const auto& info) {
                           return info.param == 3 ? std::string("Stage3InMemory")
                                                  : std::string("Stage2Disk");
                         });

// One agent of job `id` on loopback: --nnodes `nnodes`, one worker.
std::unique_ptr<Process> agent(const std::string& nnodes, int port, const std::string& id,
                               const std::vector<std::string>& extra,
                               const std::vector<std::string>& worker) {
  std::vector<std::string> argv = {
      DTRAIN_BIN,       "run",  "--nnodes",           nnodes,
      "--rdzv-backend", "c10d", "--rdzv-endpoint",    "127.0.0.1:" + std::to_string(port),
      "--rdzv-id",      id,     "--monitor-interval", "0.1"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.insert(argv.end(), worker.begin(), worker.end());
  return std::make_unique<Process>(Process::start(argv, clean_env()));
}

bool wait_out(Process& p, const std::string& needle, std::chrono::milliseconds timeout) {
  return p.wait_for([&](const std::string& out,
                        const std::string& err) { return has(out, needle) || has(err, needle); },
                    timeout);
}

TEST(ElasticResume, ShrinkFromThreeNodesToTwoKeepsExactlyOnce) {
  TempDir logs, ckpt;
  const int port = dtrain::test::free_port(INADDR_LOOPBACK);
  const std::vector<std::string> extra = {
      "--rdzv-conf",    "last_call_timeout=1,heartbeat_timeout=1.5",
      "--rdzv-timeout", "20",
      "--max-restarts", "1"};
  const auto worker = worker_args(logs, ckpt, {"--step-sleep", "0.15"});
  auto a = agent("2:3", port, "shrink3", extra, worker);
  std::this_thread::sleep_for(300ms);  // a binds the store's port first
  auto b = agent("2:3", port, "shrink3", extra, worker);
  auto c = agent("2:3", port, "shrink3", extra, worker);
  ASSERT_TRUE(wait_out(*a, "step 4 loss", 60s)) << a->err();
  ASSERT_TRUE(has(a->out(), "world 3")) << a->out();
  c->signal(SIGKILL);
  auto results = dtrain::test::finish_all({a.get(), b.get(), c.get()}, 90s);
  EXPECT_EQ(results[0].exit_code, 0) << describe(results[0]);
  EXPECT_EQ(results[1].exit_code, 0) << describe(results[1]);
  EXPECT_EQ(results[2].exit_code, 137) << describe(results[2]);
  auto attempts = read_logs(logs.path);
  ASSERT_GE(attempts.size(), 2u) << summary(attempts);
  EXPECT_EQ(attempts.begin()->second.world, 3) << summary(attempts);
  EXPECT_EQ(attempts.rbegin()->second.world, 2) << summary(attempts);
  EXPECT_GT(attempts.rbegin()->second.resume_step, 0) << summary(attempts);
  EXPECT_EQ(check_exactly_once(attempts), "") << summary(attempts);
  // Rank 0 of the new round is on whichever survivor joined it first.
  EXPECT_TRUE(has(results[0].err + results[1].err, "(committed at world size 3, now 2)"))
      << describe(results[0]) << describe(results[1]);
  expect_no_process_left(attempts);
}

TEST(ElasticResume, ShrinkBelowMinFailsWithTheReason) {
  TempDir logs, ckpt;
  const int port = dtrain::test::free_port(INADDR_LOOPBACK);
  const std::vector<std::string> extra = {
      "--rdzv-conf",    "last_call_timeout=0.3,heartbeat_timeout=1.5",
      "--rdzv-timeout", "2",
      "--max-restarts", "3"};
  const auto worker = worker_args(logs, ckpt, {"--step-sleep", "0.15"});
  auto a = agent("2:3", port, "below", extra, worker);
  std::this_thread::sleep_for(300ms);
  auto b = agent("2:3", port, "below", extra, worker);
  ASSERT_TRUE(wait_out(*a, "step 3 loss", 60s)) << a->err();
  b->signal(SIGKILL);
  auto results = dtrain::test::finish_all({a.get(), b.get()}, 60s);
  EXPECT_EQ(results[0].exit_code, 1) << describe(results[0]);
  EXPECT_TRUE(has(results[0].err,
                  "only 1 node(s) joined within 2 s, fewer than the minimum 2 of --nnodes 2:3"))
      << describe(results[0]);
  expect_no_process_left(read_logs(logs.path));
}

// The Fashion-MNIST example with --elastic under `dtrain run --nnodes 1:2 --max-restarts 1`:
// rank 1 crashes at step 35 of the epoch's 118 (batch 256 per rank); the restarted workers
// resume from the commit of step 30 by themselves and the epoch ends with exactly its 60000
// samples seen.
TEST(ElasticResume, FashionMnistExampleResumesAfterACrash) {
  TempDir ckpt;
  const int port = dtrain::test::free_port(INADDR_LOOPBACK);
  std::vector<std::string> argv = {DTRAIN_BIN,           "run",
                                   "--nnodes",           "1:2",
                                   "--nproc-per-node",   "2",
                                   "--max-restarts",     "1",
                                   "--rdzv-backend",     "c10d",
                                   "--rdzv-endpoint",    "127.0.0.1:" + std::to_string(port),
                                   "--rdzv-id",          "fmnist",
                                   "--rdzv-conf",        "last_call_timeout=0.3",
                                   "--monitor-interval", "0.1",
                                   FASHION_MNIST_BIN,    "--elastic",
                                   "--checkpoint-dir",   ckpt.path.string(),
                                   "--checkpoint-every", "10",
                                   "--epochs",           "1",
                                   "--crash-at-step",    "35",
                                   "--batch-size",       "256",
                                   "--log-every",        "0",
                                   "--no-eval"};
  Process p = Process::start(argv, clean_env());
  RunResult r = p.finish(180s);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_TRUE(has(r.err, "crashing on purpose on rank 1 at step 35")) << describe(r);
  EXPECT_TRUE(has(r.out, "resumed from disk:" + ckpt.path.string() +
                             "/elastic_30.pt: epoch 0, sample 15360 of 60000, "
                             "step 30 (committed at world size 2, now 2)") ||
              has(r.err, "resumed from disk:" + ckpt.path.string() +
                             "/elastic_30.pt: epoch 0, sample 15360 of 60000, "
                             "step 30 (committed at world size 2, now 2)"))
      << describe(r);
  EXPECT_TRUE(has(r.out, "\"samples_seen\":60000,\"steps\":118,")) << describe(r);
}

}  // namespace
