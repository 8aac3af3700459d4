// The progress display and the timeline: unit tests of the output, and the timeline of a real
// 2-process Fashion-MNIST run parsed as a Chrome trace.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "dtrain/progress.h"
#include "dtrain/timeline.h"
#include "launcher/subprocess.h"
#include "support/paths.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

std::string read_stream(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  return out;
}

TEST(Progress, PlainLinesEveryNStepsWithEpochStepLossRateAndEta) {
  std::FILE* f = std::tmpfile();
  {
    dtrain::Progress p({.epochs = 2,
                        .steps_per_epoch = 10,
                        .every_steps = 5,
                        .out = f,
                        .tty = 0,
                        .all_ranks = true});
    for (int s = 1; s <= 10; ++s) {
      std::this_thread::sleep_for(2ms);
      p.step(0, s, 64, 1.0 / s);
    }
    p.message("epoch 1 test accuracy 0.5000");
  }
  std::string out = read_stream(f);
  std::fclose(f);
  EXPECT_NE(out.find("epoch 1 step 5/10 loss 0.2000 samples/s "), std::string::npos) << out;
  EXPECT_NE(out.find("(epoch 1/2, 50%, ETA 0:00:"), std::string::npos) << out;
  EXPECT_NE(out.find("epoch 1 step 10/10 loss 0.1000"), std::string::npos) << out;
  EXPECT_NE(out.find("epoch 1 test accuracy 0.5000\n"), std::string::npos) << out;
  EXPECT_EQ(out.find('\r'), std::string::npos)
      << "no carriage returns when the output is not a terminal";
  // 2 periodic lines + the message + the final line.
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 4) << out;
}

TEST(Progress, TerminalRewritesOneLiveLine) {
  std::FILE* f = std::tmpfile();
  {
    dtrain::Progress p(
        {.epochs = 1, .steps_per_epoch = 3, .refresh = 0ms, .out = f, .tty = 1, .all_ranks = true});
    for (int s = 1; s <= 3; ++s) p.step(0, s, 10, 0.5);
  }
  std::string out = read_stream(f);
  std::fclose(f);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\r'), 4) << out;  // 3 redraws + the final line
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_NE(out.find("epoch 1 step 3/3 loss 0.5000"), std::string::npos) << out;
}

TEST(Progress, SilentOffRankZero) {
  setenv("RANK", "1", 1);
  std::FILE* f = std::tmpfile();
  {
    dtrain::Progress p({.epochs = 1, .steps_per_epoch = 2, .every_steps = 1, .out = f, .tty = 0});
    p.step(0, 1, 1, 1);
    p.message("x");
  }
  unsetenv("RANK");
  EXPECT_EQ(read_stream(f), "");
  std::fclose(f);
}

// Per (pid, tid): spans either nest or do not overlap. Returns a description of the first
// violation, or "".
std::string check_nesting(const json& events) {
  std::map<std::pair<int, int>, std::vector<std::pair<int64_t, int64_t>>> rows;
  for (const auto& e : events) {
    if (e["ph"] != "X") continue;
    int64_t ts = e["ts"], dur = e["dur"];
    if (dur < 0) return "negative duration: " + e.dump();
    rows[{e["pid"], e["tid"]}].emplace_back(ts, ts + dur);
  }
  for (auto& [key, spans] : rows) {
    std::sort(spans.begin(), spans.end(), [](auto a, auto b) {
      return a.first != b.first ? a.first < b.first : a.second > b.second;
    });
    std::vector<int64_t> open_ends;
    for (auto [b, e] : spans) {
      while (!open_ends.empty() && open_ends.back() <= b) open_ends.pop_back();
      if (!open_ends.empty() && e > open_ends.back()) {
        return "pid " + std::to_string(key.first) + " tid " + std::to_string(key.second) +
               ": span [" + std::to_string(b) + ", " + std::to_string(e) +
               "] overlaps one ending at " + std::to_string(open_ends.back());
      }
      open_ends.push_back(e);
    }
  }
  return "";
}

TEST(Timeline, SpansOnTwoThreadsNestAndLandInTheFile) {
  fs::path dir = fs::temp_directory_path() / ("dtrain_timeline_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string path = (dir / "trace.json").string();
  EXPECT_FALSE(dtrain::timeline::enabled());
  { dtrain::timeline::Span off("not recorded"); }
  dtrain::timeline::start(path, 0, 1);
  {
    dtrain::timeline::Span outer("outer");
    std::thread t([] {
      dtrain::timeline::Span a("worker", "comm", 4096, 3);
      std::this_thread::sleep_for(1ms);
    });
    { dtrain::timeline::Span inner("inner"); }
    t.join();
  }
  EXPECT_EQ(dtrain::timeline::stop(), path);
  EXPECT_FALSE(dtrain::timeline::enabled());
  std::ifstream in(path);
  json trace = json::parse(in);
  std::map<std::string, json> by_name;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "X") by_name[e["name"]] = e;
  }
  EXPECT_EQ(by_name.size(), 3u) << trace.dump(1);
  EXPECT_FALSE(by_name.count("not recorded"));
  EXPECT_EQ(by_name["worker"]["args"]["bytes"], 4096);
  EXPECT_EQ(by_name["worker"]["args"]["index"], 3);
  EXPECT_NE(by_name["worker"]["tid"], by_name["outer"]["tid"]);
  EXPECT_EQ(by_name["inner"]["tid"], by_name["outer"]["tid"]);
  EXPECT_EQ(check_nesting(trace["traceEvents"]), "");
  fs::remove_all(dir);
}

TEST(Timeline, AnOpsWaitsForPeersSplitItIntoWaitingAndTransferring) {
  fs::path dir =
      fs::temp_directory_path() / ("dtrain_timeline_split_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string path = (dir / "trace.json").string();
  dtrain::timeline::start(path, 0, 1);
  {
    dtrain::timeline::Span op("shm all_reduce", "comm", 1 << 20);
    std::this_thread::sleep_for(2ms);  // "transfer"
    {
      dtrain::timeline::Span wait(dtrain::timeline::kWaitForPeers, "comm");
      std::this_thread::sleep_for(3ms);
    }
    std::this_thread::sleep_for(2ms);
    {
      dtrain::timeline::Span wait(dtrain::timeline::kWaitForPeers, "comm");
      std::this_thread::sleep_for(3ms);
    }
  }
  { dtrain::timeline::Span plain("forward"); }
  dtrain::timeline::stop();
  std::ifstream in(path);
  json trace = json::parse(in);
  int64_t waits = 0;
  json op, plain;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    if (e["name"] == dtrain::timeline::kWaitForPeers) waits += e["dur"].get<int64_t>();
    if (e["name"] == "shm all_reduce") op = e;
    if (e["name"] == "forward") plain = e;
  }
  ASSERT_TRUE(op.is_object()) << trace.dump(1);
  const int64_t wait_us = op["args"]["wait_for_peers_us"], transfer_us = op["args"]["transfer_us"];
  EXPECT_EQ(wait_us, waits);
  EXPECT_GE(wait_us, 6000);
  EXPECT_GE(transfer_us, 4000);
  EXPECT_EQ(wait_us + transfer_us, op["dur"].get<int64_t>());
  EXPECT_FALSE(plain.contains("args")) << plain;  // no waits inside: no split
  fs::remove_all(dir);
}

TEST(Timeline, TwoRankTrainingRunMergesIntoOneTracePerRank) {
  fs::path dir = fs::temp_directory_path() / ("dtrain_timeline_run_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string path = (dir / "timeline.json").string();
  auto r = dtrain::test::run_command(
      {DTRAIN_BIN, "run", "--nproc-per-node", "2", FASHION_MNIST_BIN, "--epochs", "1",
       "--batch-size", "256", "--max-steps", "20", "--no-eval", "--log-every", "0"},
      {.env = {"DTRAIN_TIMELINE=" + path}, .timeout = 300s});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  ASSERT_TRUE(fs::exists(path)) << r.err;
  EXPECT_FALSE(fs::exists(path + ".rank0.json"));  // merged and removed
  EXPECT_FALSE(fs::exists(path + ".rank1.json"));
  std::ifstream in(path);
  json trace = json::parse(in);
  std::set<int> pids;
  std::map<std::string, int> count;  // rank 1's spans by name
  std::set<std::string> process_names;
  std::map<int, int> shm_all_reduces;  // by rank
  for (const auto& e : trace["traceEvents"]) {
    pids.insert(e["pid"].get<int>());
    if (e["ph"] == "M" && e["name"] == "process_name") process_names.insert(e["args"]["name"]);
    if (e["ph"] == "X" && e["pid"] == 1) ++count[e["name"]];
    if (e["ph"] == "X" && e["name"] == "ddp bucket all_reduce launch") {
      EXPECT_GT(e["args"]["bytes"].get<int64_t>(), 0);
    }
    // The shared-memory backend's ops (its own thread): waiting for peers vs transferring.
    if (e["ph"] == "X" && e["name"] == "shm all_reduce") {
      ++shm_all_reduces[e["pid"].get<int>()];
      const int64_t wait_us = e["args"]["wait_for_peers_us"],
                    transfer_us = e["args"]["transfer_us"];
      EXPECT_GT(e["args"]["bytes"].get<int64_t>(), 0);
      EXPECT_GE(wait_us, 0);
      EXPECT_GE(transfer_us, 0);
      EXPECT_EQ(wait_us + transfer_us, e["dur"].get<int64_t>());
    }
  }
  EXPECT_EQ(pids, (std::set<int>{0, 1}));
  EXPECT_EQ(process_names, (std::set<std::string>{"rank 0", "rank 1"}));
  EXPECT_EQ(count["forward"], 20);
  EXPECT_EQ(count["backward"], 20);
  EXPECT_EQ(count["optimizer step"], 20);
  EXPECT_EQ(count["data"], 20);
  EXPECT_GE(count["ddp bucket all_reduce launch"], 20);
  EXPECT_EQ(count["ddp bucket all_reduce launch"], count["ddp bucket wait"]);
  EXPECT_GE(shm_all_reduces[0], 20);  // every bucket, on the backend's thread of each rank
  EXPECT_GE(shm_all_reduces[1], 20);
  EXPECT_EQ(check_nesting(trace["traceEvents"]), "");
  // The picture of it (tools/timeline_render.py, matplotlib from the venv): written, not blank.
  std::string png = (dir / "timeline.png").string();
  auto render = dtrain::test::run_command(
      {DTRAIN_VENV_PYTHON, std::string(DTRAIN_SOURCE_DIR) + "/tools/timeline_render.py", path, png},
      {.timeout = 120s});
  ASSERT_EQ(render.exit_code, 0) << render.err;
  auto stats = dtrain::test::run_command(
      {DTRAIN_VENV_PYTHON, std::string(DTRAIN_SOURCE_DIR) + "/tests/tracking/image_stats.py", png},
      {.timeout = 60s});
  ASSERT_EQ(stats.exit_code, 0) << stats.err;
  json img = json::parse(stats.out);
  EXPECT_GT(img["colors"].get<int>(), 20) << img;
  EXPECT_GT(img["non_white"].get<double>(), 0.02) << img;
  fs::remove_all(dir);
}

}  // namespace
