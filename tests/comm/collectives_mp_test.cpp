// Collectives across real processes (tests/comm/collective_worker.cpp): under the real
// `dtrain run`, with tcp:// and file:// init and no launcher, and with a rank that SIGKILLs
// itself in the middle of a job; on the default backend ("auto": shared memory, since all
// ranks are local) and on plain Gloo. The worker checks the results itself; this test checks
// exit codes and what the workers printed. It does not load libtorch.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "launcher/subprocess.h"
#include "support/free_port.h"
#include "support/paths.h"

namespace {

using namespace std::chrono_literals;
using dtrain::test::finish_all;
using dtrain::test::Process;
using dtrain::test::RunOptions;
using dtrain::test::RunResult;

const std::string kWorker = COLLECTIVE_WORKER_BIN;

// A port that was free a moment ago (bound to port 0, then released); rank 0's TCPStore
// binds it again.
int free_port() { return dtrain::test::free_port(INADDR_LOOPBACK); }

std::string describe(const RunResult& r) {
  return "exit " + std::to_string(r.exit_code) + (r.timed_out ? " (timed out)" : "") + " after " +
         std::to_string(r.elapsed) + " s\n--- stdout\n" + r.out + "--- stderr\n" + r.err;
}

// Segment names in /dev/shm (the shared-memory backend's are "dtrain-<pid>-<random>").
std::set<std::string> shm_names() {
  std::set<std::string> out;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d)) {
      if (std::string(e->d_name).rfind("dtrain-", 0) == 0) out.insert(e->d_name);
    }
    ::closedir(d);
  }
  return out;
}

// Names in /dev/shm now and not in `before` whose creator (the <pid> of the name) has exited:
// what a job left behind. A segment of a test running beside this one is named only while its
// creating process sets it up, and that process is alive then.
std::vector<std::string> leaked_shm_names(const std::set<std::string>& before) {
  std::vector<std::string> out;
  for (const auto& name : shm_names()) {
    if (before.count(name)) continue;
    const size_t dash = name.find('-', 7);
    const pid_t pid = dash == std::string::npos ? 0 : std::atoi(name.substr(7, dash - 7).c_str());
    if (pid > 0 && (::kill(pid, 0) == 0 || errno != ESRCH)) continue;  // alive: not ours
    out.push_back(name);
  }
  return out;
}

// Starts `world` workers with the given init method and extra arguments, without a launcher.
std::vector<Process> start_without_launcher(int world, const std::string& init,
                                            const std::vector<std::string>& extra) {
  std::vector<Process> procs;
  RunOptions ro;
  // Nothing from a surrounding launcher may leak in (tcp:// and file:// do not read it,
  // but a stray RANK would make the test depend on where it runs).
  ro.unset = {"RANK",        "WORLD_SIZE",  "LOCAL_RANK",
              "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE"};
  procs.reserve(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> argv = {kWorker,
                                     "--init",
                                     init,
                                     "--rank",
                                     std::to_string(r),
                                     "--world-size",
                                     std::to_string(world)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    procs.push_back(Process::start(argv, ro));
  }
  return procs;
}

// Starts them and waits for all of them to exit.
std::vector<RunResult> run_without_launcher(int world, const std::string& init,
                                            const std::vector<std::string>& extra,
                                            std::chrono::milliseconds timeout) {
  auto procs = start_without_launcher(world, init, extra);
  std::vector<Process*> ptrs;
  for (auto& p : procs) ptrs.push_back(&p);
  return finish_all(ptrs, timeout);
}

// What a surviving rank of the die/stall modes printed: the error type and how long the
// all_reduce took to fail. Checks the message names the all_reduce and the rank.
struct Failure {
  std::string type;
  int ms = -1;
};
Failure survivor_failure(const RunResult& res, int rank) {
  std::regex failed("collective_worker rank " + std::to_string(rank) +
                    ": (TimeoutError|NetworkError) after ([0-9]+) ms: all_reduce \\(rank " +
                    std::to_string(rank) +
                    " of 3\\) (timed out after 3000 ms: a peer rank may have died|failed: lost the "
                    "connection to a peer rank)");
  std::smatch m;
  if (!std::regex_search(res.out, m, failed)) return {};
  return {m[1].str(), std::stoi(m[2])};
}

void expect_all_passed(const std::vector<RunResult>& results) {
  const int world = static_cast<int>(results.size());
  for (int r = 0; r < world; ++r) {
    const auto& res = results[static_cast<size_t>(r)];
    EXPECT_EQ(res.exit_code, 0) << "rank " << r << ": " << describe(res);
    std::string line =
        "collective_worker rank " + std::to_string(r) + " of " + std::to_string(world) + ": all ";
    EXPECT_NE(res.out.find(line), std::string::npos) << "rank " << r << ": " << describe(res);
  }
}

void expect_every_collective_under_dtrain_run(const std::string& backend,
                                              std::vector<std::string> flags = {}) {
  const auto shm_before = shm_names();
  std::vector<std::string> argv{DTRAIN_BIN, "run", "--nproc-per-node", "3"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.insert(argv.end(), {kWorker, "--mode", "all", "--backend", backend});
  auto res = dtrain::test::run_command(argv, RunOptions{{}, {}, 45s});
  ASSERT_EQ(res.exit_code, 0) << describe(res);
  // The launcher prefixes each rank's lines; every rank must report its checks passed.
  for (int r = 0; r < 3; ++r) {
    std::regex passed("collective_worker rank " + std::to_string(r) +
                      " of 3: all ([0-9]+) checks passed");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(res.out, m, passed)) << "rank " << r << ": " << describe(res);
    // About 80 at 3 ranks; far fewer would mean the worker skipped parts.
    EXPECT_GE(std::stoi(m[1]), 60) << "suspiciously few checks on rank " << r;
    const std::string chosen = backend == "gloo" ? "gloo" : "shm";  // auto: all ranks are local
    EXPECT_NE(res.out.find("collective_worker rank " + std::to_string(r) + ": backend " + chosen),
              std::string::npos)
        << describe(res);
  }
  for (const auto& name : leaked_shm_names(shm_before))
    ADD_FAILURE() << "left in /dev/shm: " << name;
}

TEST(CollectivesMultiProcess, EveryCollectiveUnderDtrainRunWith3Processes) {
  expect_every_collective_under_dtrain_run("auto");
}

TEST(CollectivesMultiProcess, EveryCollectiveUnderDtrainRunWith3ProcessesOnGloo) {
  expect_every_collective_under_dtrain_run("gloo");
}

// The job's store admits only clients with the token: the workers' init_process_group
// connects with it (store/token_store.h) instead of c10d's TCPStore, and Gloo meets over it.
TEST(CollectivesMultiProcess, EveryCollectiveOnGlooWhenTheStoreNeedsAToken) {
  expect_every_collective_under_dtrain_run("gloo", {"--store-token", "collectives-secret"});
}

TEST(CollectivesMultiProcess, TcpInitWithoutLauncher) {
  const std::string init = "tcp://127.0.0.1:" + std::to_string(free_port());
  expect_all_passed(run_without_launcher(3, init, {"--mode", "all"}, 45s));
}

TEST(CollectivesMultiProcess, FileInitWithoutLauncher) {
  const std::string path = "/tmp/dtrain_collectives_mp_" + std::to_string(::getpid());
  std::remove(path.c_str());  // a FileStore file must not be reused
  expect_all_passed(run_without_launcher(3, "file://" + path, {"--mode", "all"}, 45s));
  std::remove(path.c_str());
}

// Rank `die` SIGKILLs itself just before an all_reduce that the others enter with a 3 s
// timeout. Nobody tears the survivors down (no launcher): they must fail by themselves with
// a dtrain error naming the all_reduce, and exit non-zero within ~2x the timeout. Nothing
// may be left in /dev/shm.
void expect_survivors_fail(const std::string& backend, int die) {
  const int timeout_ms = 3000;
  const auto shm_before = shm_names();
  const std::string init = "tcp://127.0.0.1:" + std::to_string(free_port());
  auto results = run_without_launcher(3, init,
                                      {"--mode", "die", "--timeout-ms", std::to_string(timeout_ms),
                                       "--die-rank", std::to_string(die), "--backend", backend},
                                      40s);
  ASSERT_EQ(results.size(), 3u);
  const auto& dead = results[static_cast<size_t>(die)];
  EXPECT_EQ(dead.exit_code, 128 + 9) << "rank " << die << ": " << describe(dead);
  EXPECT_NE(dead.out.find("SIGKILLing myself"), std::string::npos) << describe(dead);
  for (int r = 0; r < 3; ++r) {
    if (r == die) continue;
    const auto& res = results[static_cast<size_t>(r)];
    SCOPED_TRACE("rank " + std::to_string(r) + ": " + describe(res));
    EXPECT_NE(res.out.find("backend " + backend), std::string::npos);
    EXPECT_FALSE(res.timed_out);
    EXPECT_EQ(res.exit_code, 3);
    Failure f = survivor_failure(res, r);
    ASSERT_NE(f.ms, -1) << "no dtrain error naming the all_reduce was printed";
    EXPECT_LE(f.ms, 2 * timeout_ms) << "the all_reduce took too long to fail";
    // And the process itself is gone soon after (no hang while leaving the group). All
    // were started at the same moment as the dead rank, which died right after the barrier.
    EXPECT_LE(res.elapsed - dead.elapsed, 2.0 * timeout_ms / 1000.0)
        << "exited " << res.elapsed - dead.elapsed << " s after rank " << die << " died";
    std::printf("%s, rank %d: %s after %d ms; exited %.2f s after rank %d died\n", backend.c_str(),
                r, f.type.c_str(), f.ms, res.elapsed - dead.elapsed, die);
  }
  for (const auto& name : leaked_shm_names(shm_before))
    ADD_FAILURE() << "left in /dev/shm: " << name;
}

TEST(CollectivesMultiProcess, RankKilledMidCollectiveMakesTheOthersFailNotHang) {
  expect_survivors_fail("gloo", 1);
}

// The shared-memory backend notices a dead peer through its pidfd (within ~50 ms), not
// by a timeout; rank 0 created the segment, so both the creator and a mapper die here.
TEST(CollectivesMultiProcess, ShmRankKilledMidCollectiveMakesTheOthersFailFast) {
  expect_survivors_fail("shm", 1);
}

TEST(CollectivesMultiProcess, ShmSegmentCreatorKilledMidCollective) {
  expect_survivors_fail("shm", 0);
}

// Rank 1 stays alive and connected but never calls the all_reduce: ranks 0 and 2 time out
// after 3 s and exit right away, although Gloo's thread is still blocked in the collective
// (destroying the group would wait for it; dtrain keeps a timed-out group alive instead).
TEST(CollectivesMultiProcess, StalledRankMakesTheOthersTimeOutAndExit) {
  const int timeout_ms = 3000;
  const std::string init = "tcp://127.0.0.1:" + std::to_string(free_port());
  auto procs = start_without_launcher(
      3, init, {"--mode", "stall", "--timeout-ms", std::to_string(timeout_ms)});
  ASSERT_TRUE(procs[1].wait_for(
      [](const std::string& out, const std::string&) {
        return out.find("stalling") != std::string::npos;
      },
      30s))
      << procs[1].out() << procs[1].err();
  const auto stalled_at = std::chrono::steady_clock::now();
  auto results = finish_all({&procs[0], &procs[2]}, 30s);
  const double after =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - stalled_at).count();
  EXPECT_FALSE(procs[1].exited()) << "the stalled rank should still be running: " << procs[1].err();
  procs[1].kill_group();
  bool some_timeout = false;
  for (size_t i = 0; i < results.size(); ++i) {
    const int r = i == 0 ? 0 : 2;
    const auto& res = results[i];
    SCOPED_TRACE("rank " + std::to_string(r) + ": " + describe(res));
    EXPECT_EQ(res.exit_code, 3);
    Failure f = survivor_failure(res, r);
    ASSERT_NE(f.ms, -1) << "no dtrain error naming the all_reduce was printed";
    // The first to time out is a TimeoutError; its exit may reach the other as a lost
    // connection just before its own timeout.
    some_timeout = some_timeout || f.type == "TimeoutError";
    EXPECT_GE(f.ms, timeout_ms - 100);
    EXPECT_LE(f.ms, 2 * timeout_ms);
    std::printf("rank %d: %s after %d ms\n", r, f.type.c_str(), f.ms);
  }
  EXPECT_TRUE(some_timeout);
  EXPECT_LE(after, 2.0 * timeout_ms / 1000.0)
      << "the survivors took " << after << " s to exit after rank 1 stalled";
}

}  // namespace
