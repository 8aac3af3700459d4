// The Distributor from a whole driver process: forgetting dtrain::init, and a driver killed
// mid-run (its workers must not outlive it).
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
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

// The workers re-execute the driver with its own arguments, as they are: `dtrain run`
// substitutes torchrun's ${local_rank} (and makes `$$` one `$`) in a program's arguments, so
// the Distributor escapes them.
TEST(DistributorDriver, WorkersGetTheDriversArgumentsAsTheyAre) {
  auto r = dtrain::test::run_command(
      {DRIVER_PROGRAM, "--argv", "a$$b", "${local_rank}", "$local_rank", "$", "x$"},
      {.timeout = 120s});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
}

// The temporary directories of the driver `pid` (/tmp/dtrain-distributor-<pid>-XXXXXX).
std::vector<std::string> driver_temp_dirs(pid_t pid) {
  const std::string stem = "dtrain-distributor-" + std::to_string(pid) + "-";
  std::vector<std::string> dirs;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(std::filesystem::temp_directory_path(), ec), end;
       !ec && it != end; it.increment(ec)) {
    if (it->path().filename().string().rfind(stem, 0) == 0) dirs.push_back(it->path().string());
  }
  return dirs;
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
  // The killed driver could not remove its temporary directory; the next driver on the host does.
  ASSERT_EQ(driver_temp_dirs(p.pid()).size(), 1u)
      << "the killed driver made one temporary directory";
  auto r = dtrain::test::run_command({DRIVER_PROGRAM, "--one"}, {.timeout = 60s});
  EXPECT_EQ(r.exit_code, 1) << "one() returns 1 on rank 0; the driver returns it\n" << r.err;
  EXPECT_TRUE(driver_temp_dirs(p.pid()).empty()) << "the killed driver's directory outlived it";
}

}  // namespace
