// NaN and infinite metrics across a killed and resumed search (tuner_state.json), against the
// same search uninterrupted and against Ray Tune's Tuner on the same trainable
// (tests/tune/ray_nan_resume_peer.py, the venv's Ray 2.60; it must be there: the test fails,
// not skips, without it).
//
// The search (tests/tune/nan_resume_program.cpp): x in [1, 2, 3] one trial at a time, ASHA
// (max_t 4, grace 1, rf 2: rungs at 4, 2, 1), curves x=1: 10, NaN, 1, 1; x=2: 10, 1, 1, inf;
// x=3: NaN, 5, 5, 5. The driver is SIGKILLed while x=3 runs its second iteration, after its
// NaN at the first; the resumed driver starts ASHA afresh, as Ray's Tuner.restore does (no
// scheduler state is saved: x=3 meets empty rungs and runs to max_t, as it does uninterrupted),
// and runs x=3 on from its checkpoint. Where the NaNs come back as NaN:
//  - best trial, scope "all": Ray's running max of x=1 is max(NaN, 10) = NaN, then 1: so x=3 (5)
//    is the best; with the NaN lost x=1's max would be 10. Scope "last": x=2's inf is never the
//    best (Ray's filter_nan_and_inf), so x=3 again.
// And the state file's reader and writer (src/tune/state_json.h) on their own.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>

#include "dtrain/error.h"
#include "launcher/subprocess.h"
#include "support/paths.h"
#include "tune/state_files.h"
#include "tune/state_json.h"

namespace fs = std::filesystem;
using dtrain::test::last_line_json;
using dtrain::test::Process;
using dtrain::test::read_state;
using dtrain::test::read_text;
using dtrain::tune::Config;

namespace {}  // namespace

TEST(TuneNanResume, NanAndInfinitySurviveAResumeAsRayTunesStateKeepsThem) {
  const fs::path dir =
      fs::temp_directory_path() / ("dtrain-tune-nan-resume-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);

  // Ray's side runs while dtrain's does (both mostly wait on 2 cores).
  dtrain::test::RunResult peer;
  std::thread ray([&] {
    peer = dtrain::test::run_command(
        {dtrain::test::venv_python(),
         dtrain::test::source_dir() + "/tests/tune/ray_nan_resume_peer.py",
         (dir / "ray.json").string()},
        {.timeout = std::chrono::seconds(240)});
  });
  // Joined however the test ends (a failed ASSERT returns early); the peer has its timeout.
  struct Join {
    std::thread& t;
    ~Join() {
      if (t.joinable()) t.join();
    }
  } join_ray{ray};

  auto plain =
      dtrain::test::run_command({TUNE_NAN_RESUME_PROGRAM, (dir / "plain").string(), "plain"},
                                {.timeout = std::chrono::seconds(120)});
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const Config uninterrupted = last_line_json(plain.out);

  // Kill the driver while x=3 (trial index 2) holds at its second iteration, its NaN saved.
  const fs::path state = dir / "killed" / "tune" / "tuner_state.json";
  Process driver = Process::start({TUNE_NAN_RESUME_PROGRAM, (dir / "killed").string(), "hold"});
  Config killed;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  for (;;) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline)
        << "x=3 did not report its first result in 90 s:\n"
        << driver.err();
    driver.pump(std::chrono::milliseconds(50));
    ASSERT_FALSE(driver.exited()) << "the driver ended before it was killed:\n" << driver.err();
    killed = read_state(state);
    if (killed.is_null()) continue;
    const Config& t = killed.at("trials").at(2);
    if (t.at("status") == "RUNNING" && t.at("history").size() == 1) break;
  }
  driver.signal(SIGKILL);
  driver.finish(std::chrono::seconds(30));
  // Saved as Ray's experiment state spells them (and Python's json.load reads them back).
  const std::string text = read_text(state);
  EXPECT_NE(text.find("\"score\": NaN"), std::string::npos);
  EXPECT_NE(text.find("\"score\": Infinity"), std::string::npos);
  EXPECT_EQ(text.find("\"score\": null"), std::string::npos) << text.substr(0, 2000);
  const Config& x1 = killed.at("trials").at(0).at("history");
  ASSERT_EQ(x1.size(), 4u);
  const Config& nan = x1.at(1).at("score");
  EXPECT_TRUE(nan.is_number_float() && std::isnan(nan.get<double>())) << nan.dump();
  const Config& x2 = killed.at("trials").at(1).at("history");
  ASSERT_EQ(x2.size(), 4u);
  EXPECT_EQ(x2.at(3).at("score"), Config(std::numeric_limits<double>::infinity()))
      << x2.at(3).dump();
  std::this_thread::sleep_for(std::chrono::seconds(1));  // the killed driver's trial goes too

  auto resumed =
      dtrain::test::run_command({TUNE_NAN_RESUME_PROGRAM, (dir / "killed").string(), "resume"},
                                {.timeout = std::chrono::seconds(120)});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  const Config after = last_line_json(resumed.out);

  const Config expect = Config::parse(R"({"trials": [
      [0, "TERMINATED", 4, [10.0, "nan", 1.0, 1.0]],
      [1, "TERMINATED", 4, [10.0, 1.0, 1.0, "inf"]],
      [2, "TERMINATED", 4, ["nan", 5.0, 5.0, 5.0]]], "order": [0, 1, 2], "best_last": 3,
      "best_all": 3})");
  EXPECT_EQ(uninterrupted, expect);
  for (const char* key : {"trials", "best_last", "best_all"})
    EXPECT_EQ(after.at(key), uninterrupted.at(key)) << key;
  // The resumed grid in the order Ray's Tuner.restore re-adds the trials: the most recent last
  // result first (x=3's first, then x=2's and x=1's).
  EXPECT_EQ(after.at("order"), Config::parse("[2, 1, 0]"));
  // x=3 ran twice: from scratch, then on from its checkpoint at iteration 1.
  const Config final_state = read_state(state);
  ASSERT_FALSE(final_state.is_null());
  const Config& x3 = final_state.at("trials").at(0);
  EXPECT_TRUE(x3.at("id").get<std::string>().ends_with("_00002")) << x3.at("id");
  EXPECT_EQ(x3.at("runs"), 2);

  // The resumed search's state read by Python's json, as Ray's Tuner.restore reads its own.
  auto py = dtrain::test::run_command({dtrain::test::venv_python(), "-c",
                                       "import json, sys; s = json.load(open(sys.argv[1])); "
                                       "print(json.dumps([[repr(h['score']) for h in t['history']] "
                                       "for t in sorted(s['trials'], key=lambda t: t['id'])]))",
                                       state.string()},
                                      {.timeout = std::chrono::seconds(60)});
  ASSERT_EQ(py.exit_code, 0) << py.err;
  EXPECT_EQ(last_line_json(py.out),
            Config::parse(R"([["10.0", "nan", "1.0", "1.0"], ["10.0", "1.0", "1.0", "inf"],
                              ["nan", "5.0", "5.0", "5.0"]])"));

  ray.join();
  ASSERT_EQ(peer.exit_code, 0) << "Ray Tune peer failed (the venv's ray[tune] is required):\n"
                               << peer.err.substr(peer.err.size() > 3000 ? peer.err.size() - 3000
                                                                         : 0);
  const Config ray_out = Config::parse(read_text(dir / "ray.json"));
  EXPECT_EQ(ray_out.at("trials"), after.at("trials"));
  EXPECT_EQ(ray_out.at("best_last"), after.at("best_last"));
  EXPECT_EQ(ray_out.at("best_all"), after.at("best_all"));
  // Ray's own experiment state holds the same tokens, read back as the numbers.
  EXPECT_EQ(ray_out.at("state_tokens"), Config::parse(R"(["Infinity", "NaN"])"));
  EXPECT_EQ(ray_out.at("state_last_scores"), Config::parse(R"([1.0, "inf", 5.0])"));
  fs::remove_all(dir);
}

// The state file's text: non-finite numbers written and read as Python's json does them, at
// any depth; strings that hold the same letters stay strings; what dtrain never writes is a
// UsageError naming the file.
TEST(TuneStateJson, NonFiniteNumbersRoundTripAndBadTextIsRefused) {
  using dtrain::tune::detail::dump_state_json;
  using dtrain::tune::detail::parse_state_json;
  const double inf = std::numeric_limits<double>::infinity();
  Config v = {{"a", std::numeric_limits<double>::quiet_NaN()},
              {"b", Config::array({1, inf, nullptr, -inf, 0.1})},
              {"NaN", "NaN Infinity -Infinity null \"quoted\" \\"},
              {"nested", {{"null", nullptr}, {"x", Config::array({Config::object(), -inf})}}},
              {"empty", Config::array()}};
  const std::string text = dump_state_json(v);
  EXPECT_NE(text.find("\"a\": NaN,"), std::string::npos) << text;
  EXPECT_NE(text.find("  Infinity,"), std::string::npos) << text;
  EXPECT_NE(text.find("  -Infinity"), std::string::npos) << text;
  const Config back = parse_state_json(text, "state.json");
  EXPECT_TRUE(std::isnan(back.at("a").get<double>()));
  EXPECT_EQ(back.at("b").at(1).get<double>(), inf);
  EXPECT_TRUE(back.at("b").at(2).is_null());
  EXPECT_EQ(back.at("b").at(3).get<double>(), -inf);
  EXPECT_EQ(back.at("b").at(4).get<double>(), 0.1);
  EXPECT_EQ(back.at("NaN"), v.at("NaN"));
  EXPECT_TRUE(back.at("nested").at("null").is_null());
  EXPECT_EQ(back.at("nested").at("x").at(1).get<double>(), -inf);
  EXPECT_EQ(back.at("empty"), Config::array());
  // Finite values give what nlohmann's own dump(1) gave before (strict JSON, same layout).
  Config finite = v;
  finite.erase("a");
  finite.erase("b");
  finite["nested"]["x"][1] = 2.5;
  EXPECT_EQ(dump_state_json(finite), finite.dump(1));

  try {
    parse_state_json(R"({"a": NaN, "b": 1, "a": null})", "/s/tuner_state.json");
    ADD_FAILURE() << "a key given twice was accepted";
  } catch (const dtrain::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("/s/tuner_state.json has the key \"a\" twice"),
              std::string::npos)
        << e.what();
  }
  try {
    parse_state_json(R"({"a": nan})", "/s/tuner_state.json");
    ADD_FAILURE() << "lower-case nan was accepted";
  } catch (const dtrain::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("/s/tuner_state.json is not the JSON"), std::string::npos)
        << e.what();
  }
}
