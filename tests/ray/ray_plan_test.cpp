// The Ray engine's placement plan, the Ray driver's command line and the kept driver's failure
// to start, without a cluster (tests/ray/ray_test.sh runs the real one).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "core/driver_service.h"
#include "dtrain/error.h"
#include "dtrain/ray.h"
#include "ray/ray_driver.h"

namespace {

namespace ray = dtrain::ray;

std::string what(const std::function<void()>& f) {
  try {
    f();
  } catch (const dtrain::UsageError& e) {
    return e.what();
  }
  return "(no UsageError)";
}

TEST(RayPlan, BundlesOfProcesses) {
  auto p = ray::plan(4, false, 2, 1, -1, "STRICT_SPREAD");
  EXPECT_EQ(p.bundles, 2);
  EXPECT_EQ(p.per_bundle, 2);
  EXPECT_EQ(p.cpus, 1);
  EXPECT_EQ(p.gpus, 0);  // -1: as use_gpu says
  EXPECT_EQ(p.strategy, "STRICT_SPREAD");
  auto q = ray::plan(4, true, 1, 2, -1, "PACK");  // Ray Train's shape: a bundle per worker
  EXPECT_EQ(q.bundles, 4);
  EXPECT_EQ(q.gpus, 1);
  EXPECT_EQ(q.cpus, 2);
}

TEST(RayPlan, BadInputIsAUsageErrorNamingTheField) {
  EXPECT_NE(what([] { ray::plan(0, false, 1, 1, 0, "PACK"); }).find("num_processes"),
            std::string::npos);
  EXPECT_NE(what([] { ray::plan(4, false, 3, 1, 0, "PACK"); }).find("processes_per_bundle is 3"),
            std::string::npos);
  EXPECT_NE(what([] { ray::plan(4, false, 1, 1, 0, "pack"); }).find("ray.strategy is 'pack'"),
            std::string::npos);
  EXPECT_NE(what([] { ray::plan(4, false, 1, 0, 0, "PACK"); }).find("not both 0"),
            std::string::npos);
  EXPECT_NE(what([] { ray::plan(4, false, 1, -1, 0, "PACK"); }).find("must be >= 0"),
            std::string::npos);
  EXPECT_NE(what([] { ray::plan(4, true, 1, 1, 0, "PACK"); }).find("use_gpu"), std::string::npos);
}

TEST(RayDriver, AddressFromTheOptionsElseRayAddress) {
  ::unsetenv("RAY_ADDRESS");
  EXPECT_EQ(ray::address("ray://head:10001"), "ray://head:10001");
  EXPECT_NE(what([] { ray::address(""); }).find("RAY_ADDRESS"), std::string::npos);
  ::setenv("RAY_ADDRESS", "head:6379", 1);
  EXPECT_EQ(ray::address(""), "head:6379");
  ::unsetenv("RAY_ADDRESS");
}

TEST(RayDriver, PythonMustBeExecutable) {
  EXPECT_NE(what([] { ray::python("/nonexistent/python"); }).find("ray.python"), std::string::npos);
  EXPECT_EQ(ray::python("/bin/sh"), "/bin/sh");
}

TEST(RayDriver, DirectCommandCarriesThePlan) {
  ray::Driver d;
  d.address = "head:6379";
  d.python = "/usr/bin/python3";
  d.placement_timeout = std::chrono::seconds(7);
  d.term_timeout = std::chrono::milliseconds(2500);
  d.driver_host = "10.0.0.5";
  const auto c = ray::direct_command(ray::plan(4, false, 2, 0.5, 0, "SPREAD"), d);
  ASSERT_GE(c.size(), 4u);
  EXPECT_EQ(c[0], "/usr/bin/python3");
  EXPECT_NE(c[2].find("dtrain/ray.py"), std::string::npos);
  EXPECT_EQ(c.back(), "--");
  auto after = [&](const std::string& flag) {
    auto it = std::find(c.begin(), c.end(), flag);
    return it == c.end() || it + 1 == c.end() ? std::string("(missing)") : *(it + 1);
  };
  EXPECT_EQ(after("--address"), "head:6379");
  EXPECT_EQ(after("--bundles"), "2");
  EXPECT_EQ(after("--per-bundle"), "2");
  EXPECT_EQ(after("--cpus"), "0.5");
  EXPECT_EQ(after("--gpus"), "0");
  EXPECT_EQ(after("--strategy"), "SPREAD");
  EXPECT_EQ(after("--placement-timeout"), "7");
  EXPECT_EQ(after("--term-timeout"), "2.5");
  EXPECT_EQ(after("--driver-host"), "10.0.0.5");
}

TEST(RayDriver, ExitStatusOfTooFewResourcesIsExplained) {
  EXPECT_NE(ray::explain_exit(76).value_or("").find("cannot hold"), std::string::npos);
  EXPECT_FALSE(ray::explain_exit(1));
}

// A driver whose Python cannot connect (no ray there) fails with its output and keeps nothing.
TEST(RayKeptDriver, ADriverThatCannotStartIsAnErrorAndKeepsNothing) {
  ray::Driver d;
  d.address = "127.0.0.1:1";
  d.python = "/bin/false";
  EXPECT_THROW(ray::kept_command(ray::plan(2, false, 1, 1, 0, "PACK"), d, std::chrono::seconds(60),
                                 std::chrono::seconds(20)),
               dtrain::Error);
  EXPECT_EQ(ray::kept_driver(), "");
  ray::stop_kept_driver();  // nothing to stop: a no-op
}

// `dtrain run`'s engine flags are read up to PROGRAM: the program's own --ray-address (a
// Distributor driver's, run by an agent on a Ray node) is its argument, not the launcher's.
TEST(RayCli, EngineFlagsAreReadUpToTheProgramOnly) {
  auto scan = [](std::vector<std::string> args) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    return dtrain::detail::scan_run_flags(static_cast<int>(argv.size()), argv.data(),
                                          {"--ray-address", "--ray-strategy"}, "--ray-address");
  };
  EXPECT_FALSE(scan({"dtrain", "run", "--nnodes", "2", "--nproc-per-node", "2", "--env=K=V",
                     "--no-python", "./prog", "--ray-address", "h:6379"}));
  EXPECT_FALSE(
      scan({"dtrain", "run", "--nproc-per-node", "2", "--", "prog", "--ray-address", "h:6379"}));
  const auto f = scan({"dtrain", "run", "--ray-address=a:1", "--nnodes", "2", "-H", "n1:1",
                       "--ray-strategy", "PACK", "prog", "--ray-address", "b:2"});
  ASSERT_TRUE(f);
  EXPECT_EQ(f->value("--ray-address"), "a:1");
  EXPECT_EQ(f->value("--ray-strategy"), "PACK");
  EXPECT_EQ(f->rest, (std::vector<std::string>{"--nnodes", "2", "-H", "n1:1", "prog",
                                               "--ray-address", "b:2"}));
}

// `dtrain launch` through a cluster engine: torch.distributed.launch's refusal of --no-python
// without --use-env comes before anything is submitted; the agents run `dtrain launch`.
TEST(RayCli, LaunchRefusesNoPythonWithoutUseEnvBeforeSubmitting) {
  auto scan = [](std::vector<std::string> args) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    return dtrain::detail::scan_run_flags(static_cast<int>(argv.size()), argv.data(),
                                          {"--ray-address"}, "--ray-address");
  };
  // Also after a flag's value (--nproc-per-node 2), which is not PROGRAM.
  for (const auto& args :
       {std::vector<std::string>{"dtrain", "launch", "--ray-address", "h:1", "--no-python",
                                 "/bin/true"},
        std::vector<std::string>{"dtrain", "launch", "--ray-address", "h:1", "--nproc-per-node",
                                 "2", "--no-python", "/bin/true"}}) {
    try {
      scan(args);
      ADD_FAILURE() << "no refusal";
    } catch (const dtrain::UsageError& e) {
      EXPECT_STREQ(e.what(),
                   "When using the '--no-python' flag, you must also set the '--use-env' flag.");
    }
  }
  const auto f = scan({"dtrain", "launch", "--ray-address", "h:1", "--no_python", "--use_env",
                       "/bin/true", "--no-python"});
  ASSERT_TRUE(f);
  EXPECT_EQ(f->command, "launch");
  // PROGRAM's own --no-python is its argument.
  EXPECT_TRUE(scan({"dtrain", "launch", "--ray-address", "h:1", "prog.py", "--no-python"}));
}

// The route's own value checks name the command typed: `dtrain launch --ray-address: ...` for
// `dtrain launch`, and a flag without its value is the typed command's error too.
TEST(RayCli, ValueErrorsNameTheCommandTyped) {
  auto refusal = [](std::vector<std::string> args) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    try {
      ray::exec_cli_if_requested(static_cast<int>(argv.size()), argv.data());
    } catch (const dtrain::UsageError& e) {
      return std::string(e.what());
    }
    return std::string("(no refusal)");
  };
  for (const std::string command : {"run", "launch"}) {
    EXPECT_EQ(
        refusal({"dtrain", command, "--ray-address", "h:1", "--nnodes", "x", "prog"}),
        "dtrain " + command + " --ray-address: --nnodes must be a whole number >= 1, got 'x'");
    EXPECT_EQ(refusal({"dtrain", command, "--ray-address", "h:1", "--ray-cpus", "-1", "prog"}),
              "dtrain " + command + " --ray-address: --ray-cpus must be a number >= 0, got '-1'");
    EXPECT_EQ(refusal({"dtrain", command, "--ray-address", "h:1", "--ray-strategy", "BAD", "prog"})
                  .rfind("dtrain " + command + " --ray-address: --ray-strategy is 'BAD'", 0),
              0u);
    EXPECT_EQ(refusal({"dtrain", command, "--ray-address"}),
              "dtrain " + command + ": --ray-address needs a value");
  }
}

}  // namespace
