// Collective diagnosis with ranks as threads (tests/support/thread_group.h): the flight
// recorder's records, DETAIL mode's cross-rank check, and the stall report. The same
// behaviour across real processes under `dtrain run`: diagnosis_mp_test.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "dtrain/collectives.h"
#include "dtrain/debug.h"
#include "dtrain/flight_recorder.h"
#include "support/thread_group.h"

namespace {

using namespace std::chrono_literals;
using dtrain::CollectiveMismatchError;
using dtrain::CollectiveState;
using dtrain::DebugLevel;
using dtrain::ProcessGroup;
using dtrain::test::run_ranks;

dtrain::AllReduceOptions on(const std::shared_ptr<ProcessGroup>& g) {
  dtrain::AllReduceOptions o;
  o.group = g;
  return o;
}

TEST(FlightRecorder, RecordsEveryCollectiveInOrderWithItsFingerprint) {
  run_ranks(2, [](std::shared_ptr<ProcessGroup> g) {
    auto t = torch::ones({4, 3});
    dtrain::all_reduce(t, on(g));
    dtrain::BroadcastOptions b;
    b.group = g;
    auto i = torch::zeros({5}, torch::kInt64);
    dtrain::broadcast(i, b);
    auto w = dtrain::all_reduce_async(t, on(g));
    { auto unwaited = dtrain::all_reduce_async(t, on(g)); }  // destroyed without wait()
    w.wait();
    dtrain::CollectiveOptions c;
    c.group = g;
    dtrain::barrier(c);

    auto records = dtrain::recent_collectives(*g);
    ASSERT_EQ(records.size(), 5u);
    for (size_t k = 0; k < records.size(); ++k) {
      EXPECT_EQ(records[k].seq, k + 1);
      EXPECT_EQ(records[k].rank, g->rank());
      EXPECT_GT(records[k].start_time, 0);
    }
    EXPECT_EQ(records[0].op, "all_reduce");
    EXPECT_EQ(records[0].dtype, "float32");
    EXPECT_EQ(records[0].shapes, "[4, 3]");
    EXPECT_EQ(records[0].state, CollectiveState::kCompleted);
    EXPECT_GE(records[0].end_time, records[0].start_time);
    EXPECT_EQ(records[1].op, "broadcast");
    EXPECT_EQ(records[1].dtype, "int64");
    EXPECT_EQ(records[1].shapes, "[5]");
    EXPECT_EQ(records[2].state, CollectiveState::kCompleted);
    EXPECT_EQ(records[3].state, CollectiveState::kUnwaited);
    EXPECT_EQ(records[4].op, "barrier");
    EXPECT_EQ(records[4].shapes, "[]");
    EXPECT_NE(dtrain::format_recent_collectives(*g).find("#2 broadcast int64 [5] completed at"),
              std::string::npos);
  });
}

TEST(FlightRecorder, OffRecordsNothing) {
  run_ranks(2, [](std::shared_ptr<ProcessGroup> g) {
    dtrain::set_debug_level(*g, DebugLevel::kOff);
    auto t = torch::ones({2});
    dtrain::all_reduce(t, on(g));
    EXPECT_TRUE(dtrain::recent_collectives(*g).empty());
    EXPECT_EQ(t[0].item<float>(), 2.0f);
  });
}

TEST(Detail, MismatchedOpRaisesOnEveryRankNamingBothSides) {
  run_ranks(2, [](std::shared_ptr<ProcessGroup> g) {
    dtrain::set_debug_level(*g, DebugLevel::kDetail);
    auto t = torch::ones({4});
    dtrain::all_reduce(t, on(g));  // #1 agrees
    std::string what;
    try {
      if (g->rank() == 1) {
        dtrain::BroadcastOptions b;
        b.group = g;
        dtrain::broadcast(t, b);
      } else {
        dtrain::all_reduce(t, on(g));
      }
    } catch (const CollectiveMismatchError& e) {
      what = e.what();
    }
    ASSERT_FALSE(what.empty()) << "rank " << g->rank() << " did not raise";
    EXPECT_NE(what.find("collective mismatch at #2"), std::string::npos) << what;
    EXPECT_NE(what.find("rank 0 called all_reduce float32 [4]"), std::string::npos) << what;
    EXPECT_NE(what.find("rank 1 called broadcast float32 [4]"), std::string::npos) << what;
    EXPECT_NE(what.find("seen by rank " + std::to_string(g->rank())), std::string::npos) << what;
    auto records = dtrain::recent_collectives(*g);
    EXPECT_EQ(records.back().state, CollectiveState::kFailed);
    // Nothing was sent: the group still works.
    auto u = torch::ones({3});
    dtrain::all_reduce(u, on(g));
    EXPECT_EQ(u[0].item<float>(), 2.0f);
  });
}

TEST(Detail, MismatchedShapeNamesTheOddRankFirst) {
  run_ranks(3, [](std::shared_ptr<ProcessGroup> g) {
    dtrain::set_debug_level(*g, DebugLevel::kDetail);
    auto t = torch::ones({g->rank() == 2 ? 5 : 4});
    try {
      dtrain::all_reduce(t, on(g));
      ADD_FAILURE() << "rank " << g->rank() << " did not raise";
    } catch (const CollectiveMismatchError& e) {
      EXPECT_NE(std::string(e.what()).find(
                    "rank 2 called all_reduce float32 [5] but ranks 0, 1 called all_reduce "
                    "float32 [4]"),
                std::string::npos)
          << e.what();
    }
  });
}

TEST(Detail, AgreeingRanksPassAndGetCorrectResults) {
  run_ranks(3, [](std::shared_ptr<ProcessGroup> g) {
    dtrain::set_debug_level(*g, DebugLevel::kDetail);
    for (int i = 0; i < 20; ++i) {
      auto t = torch::full({8}, static_cast<float>(g->rank() + i));
      dtrain::all_reduce(t, on(g));
      EXPECT_EQ(t[0].item<float>(), static_cast<float>(3 * i + 3));
    }
  });
}

TEST(StallReport, NamesTheRankThatHasNotEnteredAndWhatItLastCompleted) {
  run_ranks(2, [](std::shared_ptr<ProcessGroup> g) {
    dtrain::set_stall_timeout(*g, 300ms);
    auto t = torch::ones({4});
    dtrain::all_reduce(t, on(g));
    dtrain::all_reduce(t, on(g));
    if (g->rank() == 1) std::this_thread::sleep_for(1500ms);  // rank 1 is late for #3
    dtrain::all_reduce(t, on(g));
    EXPECT_EQ(t[0].item<float>(), 8.0f);
    if (g->rank() == 1) {
      EXPECT_FALSE(dtrain::last_stall_report(*g).has_value());
      return;
    }
    auto report = dtrain::last_stall_report(*g);
    ASSERT_TRUE(report.has_value());
    EXPECT_NE(
        report->find("stall report (group g1, rank 0 of 2): all_reduce #3 float32 [4] has waited"),
        std::string::npos)
        << *report;
    EXPECT_NE(report->find("not entered by 1 rank(s): 1\n"), std::string::npos) << *report;
    EXPECT_NE(report->find("rank 1: last completed all_reduce #2 float32 [4] at"),
              std::string::npos)
        << *report;
    EXPECT_NE(report->find("entered by: 0\n"), std::string::npos) << *report;
  });
}

TEST(Debug, ParsesLevelsAndRejectsOthers) {
  EXPECT_EQ(dtrain::parse_debug_level("DETAIL", "x"), DebugLevel::kDetail);
  EXPECT_EQ(dtrain::parse_debug_level("off", "x"), DebugLevel::kOff);
  EXPECT_EQ(dtrain::parse_debug_level("Info", "x"), DebugLevel::kInfo);
  try {
    dtrain::parse_debug_level("verbose", "DTRAIN_DEBUG");
    FAIL() << "accepted 'verbose'";
  } catch (const dtrain::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("DTRAIN_DEBUG='verbose' is not a debug level; use off"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
