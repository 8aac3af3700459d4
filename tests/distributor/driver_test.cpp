// The Distributor from a whole driver process: forgetting dtrain::init, and a driver killed
// mid-run (its workers must not outlive it).
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <thread>

#include "launcher/subprocess.h"
#include "support/distributor_processes.h"
#include "support/paths.h"

namespace {

using namespace std::chrono_literals;

int workers_alive() { return static_cast<int>(dtrain::test::distributor_processes().size()); }

TEST(DistributorDriver, ForgettingInitIsAClearErrorAndStartsNothing) {
  auto r = dtrain::test::run_command({DRIVER_PROGRAM, "--no-init"}, {.timeout = 60s});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_NE(r.err.find("dtrain::init(argc, argv)"), std::string::npos) << r.err;
  EXPECT_EQ(workers_alive(), 0);
}

TEST(DistributorDriver, KillingTheDriverStopsItsWorkers) {
  auto p = dtrain::test::Process::start({DRIVER_PROGRAM, "--sleep-workers"});
  ASSERT_TRUE(p.wait_for(
      [](const std::string& out, const std::string&) {
        return out.find("[default0]:worker ready") != std::string::npos &&
               out.find("[default1]:worker ready") != std::string::npos;
      },
      60s))
      << p.out() << p.err();
  EXPECT_GE(workers_alive(), 2);  // the workers, and the launcher that carries the variable too
  p.signal(SIGKILL);              // the driver only: the launcher and workers are in its group
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (workers_alive() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(workers_alive(), 0);
  p.kill_group();
}

}  // namespace
