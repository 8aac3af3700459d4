// Elastic membership (`dtrain run --nnodes MIN:MAX --rdzv-backend c10d`), with several real
// agents on loopback, each its own `dtrain run` (as separate nodes would start them), and the
// libtorch-free test worker (tests/launcher/test_worker.cpp) printing its environment.
//   - a job starts with MIN nodes once the last call has passed;
//   - a node that arrives later is admitted at the next restart (WORLD_SIZE grows, the
//     restart count goes up, no failure is counted);
//   - a node whose agent is SIGKILLed: the survivors re-rendezvous and go on at the smaller size;
//   - below MIN: the job fails, saying so.
// Every process the tests start is killed (by process group) when its Process goes away.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "launcher/subprocess.h"
#include "support/free_port.h"
#include "support/paths.h"

namespace {

using namespace std::chrono_literals;
using dtrain::test::Process;
using dtrain::test::RunOptions;
using dtrain::test::RunResult;

const std::string kWorker = TEST_WORKER_BIN;

int free_port() { return dtrain::test::free_port(INADDR_LOOPBACK); }

bool has(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

std::string describe(const RunResult& r) {
  return "exit " + std::to_string(r.exit_code) + " after " + std::to_string(r.elapsed) +
         " s\n--- stdout\n" + r.out + "--- stderr\n" + r.err;
}

// One agent of job `id` on `port`: --nnodes `nnodes`, one worker running `program`.
std::unique_ptr<Process> agent(const std::string& nnodes, int port, const std::string& id,
                               const std::vector<std::string>& extra,
                               const std::vector<std::string>& program) {
  std::vector<std::string> argv = {
      DTRAIN_BIN,       "run",  "--nnodes",           nnodes,
      "--rdzv-backend", "c10d", "--rdzv-endpoint",    "127.0.0.1:" + std::to_string(port),
      "--rdzv-id",      id,     "--monitor-interval", "0.1"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.push_back(kWorker);
  argv.insert(argv.end(), program.begin(), program.end());
  RunOptions ro;
  ro.unset = {"RANK",        "WORLD_SIZE",  "LOCAL_RANK",
              "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT"};
  return std::make_unique<Process>(Process::start(argv, ro));
}

bool wait_out(Process& p, const std::string& needle, std::chrono::milliseconds timeout) {
  return p.wait_for([&](const std::string& out,
                        const std::string& err) { return has(out, needle) || has(err, needle); },
                    timeout);
}

TEST(Elastic, StartsWithMinNodesAfterTheLastCall) {
  const int port = free_port();
  auto a = agent("1:2", port, "min1",
                 {"--rdzv-conf", "last_call_timeout=0.5", "--rdzv-timeout", "20"}, {"--print-env"});
  RunResult r = a->finish(30s);
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_TRUE(
      has(r.err, "dtrain: round 0: 1 node(s) (--nnodes 1:2), world size 1, this node is node 0"))
      << describe(r);
  EXPECT_TRUE(has(r.out, "]:WORLD_SIZE=1\n")) << describe(r);
  EXPECT_TRUE(has(r.out, "]:TORCHELASTIC_RESTART_COUNT=0\n")) << describe(r);
  EXPECT_GE(r.elapsed, 0.5) << "the last call must be waited out";
}

TEST(Elastic, LateNodeIsAdmittedAtTheNextRestart) {
  const int port = free_port();
  const std::vector<std::string> extra = {"--rdzv-conf", "last_call_timeout=0.3", "--rdzv-timeout",
                                          "20"};
  const std::vector<std::string> program = {"--print-env", "--sleep", "2.5"};
  auto a = agent("1:2", port, "late", extra, program);
  ASSERT_TRUE(wait_out(*a, "]:TORCHELASTIC_RESTART_COUNT=0", 20s)) << a->err();
  auto b = agent("1:2", port, "late", extra, program);
  RunResult ra = a->finish(40s);
  RunResult rb = b->finish(40s);
  EXPECT_EQ(ra.exit_code, 0) << describe(ra);
  EXPECT_EQ(rb.exit_code, 0) << describe(rb);
  EXPECT_TRUE(has(ra.err, "restarting the workers for a membership change: a new node is waiting"))
      << describe(ra);
  for (const RunResult* r : {&ra, &rb}) {
    EXPECT_TRUE(has(r->err, "round 1: 2 node(s) (--nnodes 1:2), world size 2")) << describe(*r);
    EXPECT_TRUE(has(r->out, "]:WORLD_SIZE=2\n")) << describe(*r);
    EXPECT_TRUE(has(r->out, "]:TORCHELASTIC_RESTART_COUNT=1\n")) << describe(*r);
    EXPECT_FALSE(has(r->err, "job failed")) << describe(*r);
  }
  EXPECT_FALSE(has(rb.out, "]:TORCHELASTIC_RESTART_COUNT=0\n"))
      << "the late node never ran round 0";
}

// Two nodes; the agent that does not host the store (the second to start) is SIGKILLed, and
// its worker goes with it. The survivor notices the silent agent, meets the rendezvous again
// and runs on alone, at world size 1.
TEST(Elastic, SurvivorRestartsAtTheSmallerSizeWhenAnAgentIsKilled) {
  const int port = free_port();
  const std::vector<std::string> extra = {
      "--rdzv-conf",    "last_call_timeout=2,heartbeat_timeout=1.5",
      "--rdzv-timeout", "20",
      "--max-restarts", "1"};
  auto a = agent("1:2", port, "kill", extra, {"--print-env", "--sleep", "3"});
  std::this_thread::sleep_for(300ms);  // a binds the store's port first
  auto b = agent("1:2", port, "kill", extra, {"--print-env", "--sleep", "30"});
  ASSERT_TRUE(wait_out(*a, "]:WORLD_SIZE=2", 20s)) << a->err();
  ASSERT_TRUE(wait_out(*b, "]:WORLD_SIZE=2", 20s)) << b->err();
  b->signal(SIGKILL);
  RunResult rb = b->finish(10s);
  EXPECT_EQ(rb.exit_code, 137) << describe(rb);
  RunResult ra = a->finish(40s);
  EXPECT_EQ(ra.exit_code, 0) << describe(ra);
  const auto lost = ra.err.find("stopped responding");
  ASSERT_NE(lost, std::string::npos) << describe(ra);
  EXPECT_TRUE(
      has(ra.err.substr(lost), " 1 node(s) (--nnodes 1:2), world size 1, this node is node 0"))
      << describe(ra);
  EXPECT_TRUE(has(ra.out, "]:WORLD_SIZE=1\n")) << describe(ra);
  // Round 1 (or 2, if b was admitted late to round 1): a restart, as torchrun counts it.
  EXPECT_TRUE(has(ra.out, "]:TORCHELASTIC_RESTART_COUNT=1\n") ||
              has(ra.out, "]:TORCHELASTIC_RESTART_COUNT=2\n"))
      << describe(ra);
}

TEST(Elastic, FailsWithTheReasonWhenFewerThanMinRemain) {
  const int port = free_port();
  const std::vector<std::string> extra = {
      "--rdzv-conf",    "last_call_timeout=0.3,heartbeat_timeout=1.5",
      "--rdzv-timeout", "2",
      "--max-restarts", "3"};
  auto a = agent("2:3", port, "shrink", extra, {"--print-env", "--sleep", "30"});
  std::this_thread::sleep_for(300ms);  // a binds the store's port first
  auto b = agent("2:3", port, "shrink", extra, {"--print-env", "--sleep", "30"});
  ASSERT_TRUE(wait_out(*a, "]:WORLD_SIZE=2", 20s)) << a->err();
  ASSERT_TRUE(wait_out(*b, "]:WORLD_SIZE=2", 20s)) << b->err();
  b->signal(SIGKILL);
  RunResult rs = a->finish(40s);
  EXPECT_EQ(rs.exit_code, 1) << describe(rs);
  EXPECT_TRUE(
      has(rs.err,
          "round 1: only 1 node(s) joined within 2 s, fewer than the minimum 2 of --nnodes 2:3"))
      << describe(rs);
  EXPECT_LT(rs.elapsed, 30.0) << "must not wait for the workers' 30 s sleep";
}

}  // namespace
