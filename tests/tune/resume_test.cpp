// A search whose driver is SIGKILLed mid-search resumes from storage_path: finished trials
// are not run again, interrupted ones restart from their latest checkpoint.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "launcher/subprocess.h"
#include "support/paths.h"

namespace fs = std::filesystem;
using dtrain::test::Process;

namespace {

nlohmann::json read_state(const fs::path& p) {
  std::ifstream in(p);
  if (!in) return nullptr;
  try {
    return nlohmann::json::parse(in);
  } catch (...) {
    return nullptr;  // being replaced; try again
  }
}

std::vector<std::string> lines(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::string> out;
  std::string l;
  while (std::getline(in, l)) out.push_back(l);
  return out;
}

}  // namespace

TEST(TuneResume, KilledDriverResumesWithoutRerunningFinishedTrials) {
  const fs::path dir =
      fs::temp_directory_path() / ("dtrain-tune-resume-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const fs::path state = dir / "tune" / "tuner_state.json";

  Process driver = Process::start({TUNE_DRIVER_PROGRAM, dir.string()});
  // Wait until two trials finished and others are under way, then kill the driver.
  std::set<std::string> finished_before;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool ready = false;
  while (!ready && std::chrono::steady_clock::now() < deadline) {
    driver.pump(std::chrono::milliseconds(50));
    ASSERT_FALSE(driver.exited()) << "the driver ended before it was killed:\n" << driver.err();
    auto s = read_state(state);
    if (s.is_null()) continue;
    int running_with_reports = 0;
    finished_before.clear();
    for (const auto& t : s["trials"]) {
      if (t["status"] == "TERMINATED") finished_before.insert(t["id"].get<std::string>());
      if (t["status"] == "RUNNING" && !t["history"].empty()) ++running_with_reports;
    }
    ready = finished_before.size() >= 2 && running_with_reports >= 1;
  }
  ASSERT_TRUE(ready) << "the search did not get far enough in 60 s:\n" << driver.err();
  driver.signal(SIGKILL);
  driver.finish(std::chrono::seconds(30));
  // What the killed driver's state says was finished (it may have got one more in).
  auto killed = read_state(state);
  ASSERT_FALSE(killed.is_null());
  finished_before.clear();
  std::set<std::string> interrupted;
  for (const auto& t : killed["trials"]) {
    if (t["status"] == "TERMINATED") finished_before.insert(t["id"].get<std::string>());
    // Interrupted after a checkpoint: must restart from it.
    if (t["status"] == "RUNNING" && !t["history"].empty())
      interrupted.insert(t["id"].get<std::string>());
  }
  ASSERT_GE(finished_before.size(), 2u);
  // The killed driver's trials stop too (the launcher dies with its driver).
  std::this_thread::sleep_for(std::chrono::seconds(1));

  auto resumed = dtrain::test::run_command({TUNE_DRIVER_PROGRAM, dir.string(), "--resume"},
                                           {.timeout = std::chrono::seconds(90)});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("done: 6 trials, best x=6"), std::string::npos) << resumed.out;

  auto final_state = read_state(state);
  ASSERT_FALSE(final_state.is_null());
  // Ray's names survive the kill: one experiment id (the 5 hex characters of every trial id),
  // the same before and after; trials made after the resume are named as the first ones.
  const std::string experiment_id = killed["experiment_id"];
  EXPECT_EQ(final_state["experiment_id"], experiment_id);
  ASSERT_EQ(experiment_id.size(), 5u);
  ASSERT_EQ(final_state["trials"].size(), 6u);
  // The resumed search lists the killed one's trials as Ray's Tuner.restore re-adds them: the
  // most recent last result first (the driver's sequence numbers), those without one after, in
  // the search's order; the trials made after the resume follow.
  auto last_seq = [](const nlohmann::json& t) {
    std::int64_t last = -1;
    for (const char* key : {"history_seq", "rewound_seq"})
      for (const auto& s : t[key]) last = std::max(last, s.get<std::int64_t>());
    return last;
  };
  std::vector<nlohmann::json> requeued(killed["trials"].begin(), killed["trials"].end());
  std::stable_sort(requeued.begin(), requeued.end(),
                   [&](const auto& a, const auto& b) { return last_seq(a) > last_seq(b); });
  ASSERT_LE(requeued.size(), 6u);
  for (std::size_t i = 0; i < requeued.size(); ++i)
    EXPECT_EQ(final_state["trials"][i]["id"], requeued[i]["id"]) << "place " << i;
  std::vector<nlohmann::json> by_id(final_state["trials"].begin(), final_state["trials"].end());
  std::sort(by_id.begin(), by_id.end(), [](const auto& a, const auto& b) {
    return a["id"].template get<std::string>() < b["id"].template get<std::string>();
  });
  for (std::size_t i = 0; i < 6; ++i) {
    const auto& t = by_id[i];
    char id[32];
    std::snprintf(id, sizeof id, "%s_%05zu", experiment_id.c_str(), i);
    EXPECT_EQ(t["id"], id);
    EXPECT_EQ(t["history"].back()["trial_id"], id);
    const std::string name = fs::path(t["dir"].get<std::string>()).filename().string();
    const std::string x = std::to_string(i + 1);
    EXPECT_EQ(
        name.rfind("train_fn_" + std::string(id) + "_" + std::to_string(i) + "_x=" + x + "_", 0),
        0u)
        << name;
  }
  for (const auto& t : final_state["trials"]) {
    const std::string id = t["id"];
    EXPECT_EQ(t["status"], "TERMINATED") << id;
    // Every iteration reported once, in order, across the kill.
    ASSERT_EQ(t["history"].size(), 4u) << id;
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(t["history"][i]["training_iteration"].get<int>(), i + 1) << id;
    const auto runs = lines(fs::path(t["dir"].get<std::string>()) / "runs.log");
    if (finished_before.count(id)) {
      EXPECT_EQ(runs.size(), 1u) << id << " finished before the kill but ran again";
    }
    if (interrupted.count(id)) {
      ASSERT_EQ(runs.size(), 2u) << id;
      EXPECT_NE(runs[1], "run 1") << id << " restarted from scratch, not from its checkpoint";
    }
  }
  fs::remove_all(dir);
}
