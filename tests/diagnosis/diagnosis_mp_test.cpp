// Collective diagnosis across real processes under the real `dtrain run`
// (tests/diagnosis/diagnosis_worker.cpp): DETAIL mode's mismatch error on every rank, the
// stall report naming a rank that skipped a collective, and the flight recorder in the
// launcher's failure summary when a rank is SIGKILLed. Does not load libtorch itself.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "launcher/subprocess.h"
#include "support/paths.h"

namespace {

using namespace std::chrono_literals;
using dtrain::test::Process;
using dtrain::test::RunOptions;
using dtrain::test::RunResult;

const std::string kWorker = DIAGNOSIS_WORKER_BIN;

RunResult run_job(const std::string& mode, const std::vector<std::string>& env) {
  RunOptions ro;
  ro.env = env;
  ro.unset = {"RANK",         "WORLD_SIZE",          "LOCAL_RANK",
              "MASTER_ADDR",  "MASTER_PORT",         "TORCHELASTIC_USE_AGENT_STORE",
              "DTRAIN_DEBUG", "DTRAIN_STALL_TIMEOUT"};
  auto p =
      Process::start({DTRAIN_BIN, "run", "--nproc-per-node", "2", kWorker, "--mode", mode}, ro);
  return p.finish(60s);
}

std::string describe(const RunResult& r) {
  return "exit " + std::to_string(r.exit_code) + " after " + std::to_string(r.elapsed) +
         " s\n--- stdout\n" + r.out + "--- stderr\n" + r.err;
}

size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) ++n;
  return n;
}

bool has(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

TEST(DiagnosisUnderRun, DetailMismatchRaisesOnEveryRankNamingRanksAndFingerprints) {
  RunResult r = run_job("mismatch", {"DTRAIN_DEBUG=detail"});
  const std::string all = r.out + r.err;
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  for (int rank : {0, 1}) {
    EXPECT_TRUE(has(
        all, "diagnosis_worker rank " + std::to_string(rank) +
                 ": CollectiveMismatchError: collective mismatch at #4 of group g1 (seen by rank " +
                 std::to_string(rank) +
                 " of 2): rank 0 called all_reduce float32 [4] but rank 1 "
                 "called broadcast float32 [4]"))
        << describe(r);
  }
  EXPECT_FALSE(has(all, "went through")) << describe(r);
}

TEST(DiagnosisUnderRun, SkippedCollectiveGetsOneStallReportNamingTheRank) {
  RunResult r = run_job("skip", {"DTRAIN_STALL_TIMEOUT=1"});
  const std::string all = r.out + r.err;
  EXPECT_EQ(r.exit_code, 3) << describe(r);
  // One report (the failure summary repeats it from rank 0's stderr tail, unprefixed).
  EXPECT_EQ(count(all, "]:dtrain: stall report"), 1u) << describe(r);
  EXPECT_TRUE(has(
      all, "dtrain: stall report (group g1, rank 0 of 2): all_reduce #4 float32 [4] has waited"))
      << describe(r);
  EXPECT_TRUE(has(all, "not entered by 1 rank(s): 1")) << describe(r);
  EXPECT_TRUE(has(all, "rank 1: last completed all_reduce #3 float32 [4] at")) << describe(r);
  // Rank 1's exit broke the group: rank 0's error ends with its flight recorder, and the
  // failure summary shows what both ranks last published.
  EXPECT_TRUE(has(all, "recent collectives of this rank (flight recorder, oldest first):"))
      << describe(r);
  EXPECT_TRUE(
      has(all, "recent collectives (each rank's flight recorder, as it last published it):"))
      << describe(r);
}

TEST(DiagnosisUnderRun, FailureSummaryShowsTheFlightRecorderWhenAPeerIsKilled) {
  RunResult r = run_job("die", {"DTRAIN_STALL_TIMEOUT=1"});
  EXPECT_EQ(r.exit_code, 137) << describe(r);
  const auto at =
      r.err.find("recent collectives (each rank's flight recorder, as it last published it):");
  ASSERT_NE(at, std::string::npos) << describe(r);
  const std::string section = r.err.substr(at);
  EXPECT_TRUE(has(r.err, "SIGKILL")) << describe(r);
  EXPECT_TRUE(has(section, "group g1:")) << section;
  const auto rank1 = section.find("rank 1 (published ");
  ASSERT_NE(rank1, std::string::npos) << section;
  EXPECT_TRUE(has(section.substr(rank1), "#3 all_reduce float32 [4] completed at")) << section;
  const auto rank0 = section.find("rank 0 (published ");
  ASSERT_NE(rank0, std::string::npos) << section;
  EXPECT_TRUE(has(section.substr(rank0, rank1 - rank0), "#4 all_reduce float32 [4] ")) << section;
}

}  // namespace
