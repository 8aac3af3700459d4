// `dtrain deepspeed` against DeepSpeed's own `deepspeed` launcher (the venv's DeepSpeed 0.19.8,
// on its CPU accelerator: DS_ACCELERATOR=cpu), in the same test, on the same workers: a Python
// script and a C++ program that print their argv and environment as one JSON line. Each test
// runs one flag set through both launchers and requires the same ranks, the same argv and the
// same variables set (names and values), masking only what is random per launch (named where it
// is masked). Bad input: exit 2 and one line naming what was wrong; where DeepSpeed has a
// message for it, the same words.
//
// DeepSpeed's launcher imports deepspeed (and torch) twice per launch - 18-25 s on the 2-core
// development VM under a load of 6-7 (2026-11-30) - so each test launches it once (twice for
// the two-node case, at the same time).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "dtrain/error.h"
#include "launch/cpu_binding.h"
#include "launch/deepspeed_worker.h"
#include "launcher/subprocess.h"
#include "support/free_port.h"
#include "support/paths.h"

extern char** environ;

namespace dtrain::test {
namespace {

using namespace std::chrono_literals;
using Args = std::vector<std::string>;
using nlohmann::json;

const std::string kDtrain = DTRAIN_BIN;
const std::string kCppWorker = DS_ENV_WORKER_BIN;
const std::string kTorchWorker = CLUSTER_WORKER_BIN;  // libtorch: init_process_group, all-reduce

std::string script_dir() { return std::string(DTRAIN_SOURCE_DIR) + "/tests/launcher"; }
std::string script() { return script_dir() + "/ds_show_env.py"; }
std::string deepspeed_bin() {
  return std::filesystem::path(DTRAIN_VENV_PYTHON).parent_path().string() + "/deepspeed";
}

bool contains(const std::string& s, const std::string& sub) {
  return s.find(sub) != std::string::npos;
}

// What a launcher's workers reported, by rank, and the environment it ran in.
struct Launch {
  RunResult result;
  std::map<int, json> by_rank;
  RunOptions options;
};

// Both launchers' workers get this environment (and the test's own).
RunOptions worker_env(std::vector<std::string> extra = {}) {
  RunOptions o;
  o.env = {"DS_ACCELERATOR=cpu", std::string("DTRAIN_PYTHON=") + DTRAIN_VENV_PYTHON,
           "PYTHONPATH=" + script_dir()};
  o.env.insert(o.env.end(), extra.begin(), extra.end());
  o.unset = {"CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS"};
  // A hang guard, not a time limit: DeepSpeed's launcher imports deepspeed twice per launch,
  // 18-25 s a launch on the 2-core development VM under a load of 6-7 (2026-11-30), over a
  // minute while it also builds.
  o.timeout = 170s;
  return o;
}

// A fresh folder for one launch's workers to write their JSON lines to (DS_TEST_OUT).
std::string out_dir() {
  static int n = 0;
  const auto d = std::filesystem::temp_directory_path() /
                 ("ds-launcher-out-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

// The workers' rank<R>.json files of `dir` (then removed), by rank.
std::map<int, json> read_workers(const std::string& dir) {
  std::map<int, json> by_rank;
  for (auto& f : std::filesystem::directory_iterator(dir)) {
    if (f.path().extension() != ".json") continue;
    std::ifstream in(f.path());
    json j = json::parse(in, nullptr, false);
    if (!j.is_discarded() && j.contains("env"))
      by_rank[std::stoi(j["env"].value("RANK", "-1"))] = j;
  }
  std::filesystem::remove_all(dir);
  return by_rank;
}

// Runs `argv`; the workers write what they saw to a folder of their own (DeepSpeed's workers
// share its stdout unprefixed, where two ranks' long lines may interleave).
Launch launch(const Args& argv, const RunOptions& options) {
  Launch l;
  l.options = options;
  const std::string dir = out_dir();
  l.options.env.push_back("DS_TEST_OUT=" + dir);
  l.result = Process::start(argv, l.options).finish(options.timeout);
  l.by_rank = read_workers(dir);
  return l;
}

Launch deepspeed(const Args& flags, const RunOptions& options) {
  Args argv = {deepspeed_bin()};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return launch(argv, options);
}

Launch dtrain(const Args& flags, const RunOptions& options) {
  Args argv = {kDtrain, "deepspeed"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return launch(argv, options);
}

// The variables a worker got that the test's environment (plus `options`) did not hold with
// the same value, and those it lost.
std::map<std::string, std::string> set_by_launcher(const json& env, const RunOptions& options,
                                                   std::set<std::string>* removed) {
  std::map<std::string, std::string> base;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    base[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
  }
  for (const auto& kv : options.env) base[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
  for (const auto& n : options.unset) base.erase(n);
  std::map<std::string, std::string> set;
  for (auto& [k, v] : env.items()) {
    // Masked: the shell's last-command variable, and MLflow's telemetry session id, which
    // DeepSpeed's launcher gets by importing mlflow and which is random per launch.
    if (k == "_" || k == "_MLFLOW_TELEMETRY_SESSION_ID") continue;
    auto it = base.find(k);
    if (it == base.end() || it->second != v.get<std::string>()) set[k] = v.get<std::string>();
  }
  for (auto& [k, v] : base)
    if (!env.contains(k) && k != "_") removed->insert(k);
  return set;
}

std::string show(const std::map<std::string, std::string>& m) {
  std::string s;
  for (auto& [k, v] : m) s += k + "=" + v + " ";
  return s;
}

// The same ranks, argv and variables from both launchers.
void expect_same_workers(const Launch& ds, const Launch& dt, size_t ranks) {
  ASSERT_EQ(ds.result.exit_code, 0) << ds.result.err;
  ASSERT_EQ(dt.result.exit_code, 0) << dt.result.err;
  ASSERT_EQ(ds.by_rank.size(), ranks) << ds.result.out << ds.result.err;
  ASSERT_EQ(dt.by_rank.size(), ranks) << dt.result.out << dt.result.err;
  for (auto& [rank, d] : ds.by_rank) {
    ASSERT_TRUE(dt.by_rank.count(rank)) << "dtrain has no rank " << rank << ": " << dt.result.out;
    const json& t = dt.by_rank.at(rank);
    EXPECT_EQ(d["argv"], t["argv"]) << "rank " << rank;
    std::set<std::string> ds_removed, dt_removed;
    auto ds_set = set_by_launcher(d["env"], ds.options, &ds_removed);
    auto dt_set = set_by_launcher(t["env"], dt.options, &dt_removed);
    EXPECT_EQ(ds_set, dt_set) << "rank " << rank << "\n deepspeed: " << show(ds_set)
                              << "\n dtrain:    " << show(dt_set);
    EXPECT_EQ(ds_removed, dt_removed) << "rank " << rank;
  }
}

class DeepSpeedLauncher : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(deepspeed_bin()))
      GTEST_FAIL() << deepspeed_bin() << " is missing: run scripts/setup.sh (the venv)";
    dir_ = std::filesystem::temp_directory_path() /
           ("ds-launcher-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string hostfile(const std::string& text) {
    const std::string path = (dir_ / "hostfile").string();
    std::ofstream(path) << text;
    return path;
  }
  std::filesystem::path dir_;
};

TEST_F(DeepSpeedLauncher, NumGpusTwoPythonScriptGetsDeepSpeedsEnvironmentAndArgv) {
  RunOptions o = worker_env();
  const Args flags = {"--num_gpus", "2", script(), "--deepspeed", "--lr", "0.1"};
  Launch ds = deepspeed(flags, o), dt = dtrain(flags, o);
  expect_same_workers(ds, dt, 2);
  // What the comparison covered, spelled out once.
  const json& e = dt.by_rank.at(1)["env"];
  EXPECT_EQ(e.value("LOCAL_RANK", ""), "1");
  EXPECT_EQ(e.value("LOCAL_SIZE", ""), "2");
  EXPECT_EQ(e.value("CROSS_RANK", ""), "0");
  EXPECT_EQ(e.value("CUDA_VISIBLE_DEVICES", ""), "0,1");
  EXPECT_EQ(e.value("MASTER_PORT", ""), "29500");
  EXPECT_FALSE(e.contains("TORCHELASTIC_RUN_ID"));
  EXPECT_EQ(dt.by_rank.at(1)["argv"],
            json::array({script(), "--local_rank=1", "--deepspeed", "--lr", "0.1"}));
}

TEST_F(DeepSpeedLauncher, CppWorkerWithNoPythonAndMasterPort) {
  RunOptions o = worker_env();
  const Args flags = {"--num_accelerators",        "2",        "--no_python", "--master_port",
                      std::to_string(free_port()), kCppWorker, "a",           "--beta=c"};
  Launch ds = deepspeed(flags, o), dt = dtrain(flags, o);
  expect_same_workers(ds, dt, 2);
  // Without --no_python DeepSpeed would hand the executable to python; dtrain runs it.
  Args bare = {"--num_gpus", "2", "--master_port", flags[4], kCppWorker, "a", "--beta=c"};
  Launch direct = dtrain(bare, o);
  expect_same_workers(ds, direct, 2);
  // Forked from one loaded copy (what auto picks for a libtorch program; this worker does not
  // link libtorch, so it is asked for): each worker still gets its own --local_rank=N and
  // DeepSpeed's variables, as the shim gives them.
  Args forked = {"--start-method", "forkserver"};
  forked.insert(forked.end(), flags.begin(), flags.end());
  Launch fs = dtrain(forked, o);
  expect_same_workers(ds, fs, 2);
  for (auto& [rank, j] : fs.by_rank) EXPECT_TRUE(j.value("from_fork_server", false)) << rank;
  for (auto& [rank, j] : dt.by_rank) EXPECT_FALSE(j.value("from_fork_server", true)) << rank;
  for (auto& [rank, j] : ds.by_rank) EXPECT_FALSE(j.value("from_fork_server", true)) << rank;
}

TEST_F(DeepSpeedLauncher, IncludeSlotsOfAHostfileNamingLocalhost) {
  RunOptions o = worker_env();
  // --no_ssh_check and --master_addr keep DeepSpeed from asking localhost over ssh (a one-host
  // hostfile runs locally in both launchers).
  const Args flags = {"-H",
                      hostfile("# the pool\nlocalhost slots=4\n\n"),
                      "--include",
                      "localhost:1,3",
                      "--no_ssh_check",
                      "--master_addr",
                      "127.0.0.1",
                      kCppWorker};
  Args with_no_python = flags;
  with_no_python.insert(with_no_python.end() - 1, "--no_python");
  Launch ds = deepspeed(with_no_python, o), dt = dtrain(with_no_python, o);
  expect_same_workers(ds, dt, 2);
  EXPECT_EQ(dt.by_rank.at(0)["env"].value("CUDA_VISIBLE_DEVICES", ""), "1,3");
  EXPECT_EQ(dt.by_rank.at(1)["argv"][1], "--local_rank=1");
}

TEST_F(DeepSpeedLauncher, ExcludeASlotWithNoLocalRank) {
  RunOptions o = worker_env();
  const Args flags = {"-H",
                      hostfile("localhost slots=3\n"),
                      "--exclude",
                      "localhost:0",
                      "--no_ssh_check",
                      "--master_addr",
                      "127.0.0.1",
                      "--no_local_rank",
                      script(),
                      "x"};
  Launch ds = deepspeed(flags, o), dt = dtrain(flags, o);
  expect_same_workers(ds, dt, 2);
  EXPECT_EQ(dt.by_rank.at(0)["env"].value("CUDA_VISIBLE_DEVICES", ""), "1,2");
  EXPECT_EQ(dt.by_rank.at(0)["argv"], json::array({script(), "x"}));
}

TEST_F(DeepSpeedLauncher, ModuleRunsPythonDashM) {
  RunOptions o = worker_env();
  const Args flags = {"--num_gpus", "2", "--module", "ds_show_env", "--epochs", "3"};
  Launch ds = deepspeed(flags, o), dt = dtrain(flags, o);
  expect_same_workers(ds, dt, 2);
  EXPECT_EQ(dt.by_rank.at(0)["argv"][0], script());  // python -m gives the module's path
}

TEST_F(DeepSpeedLauncher, EachRankLogFilesAreNamedAsDeepSpeedNamesThem) {
  RunOptions o = worker_env();
  const std::string ds_dir = (dir_ / "ds").string(), dt_dir = (dir_ / "dt").string();
  auto flags = [&](const std::string& d) {
    return Args{"--num_gpus", "2", "--enable_each_rank_log", d, script()};
  };
  Launch ds = deepspeed(flags(ds_dir), o), dt = dtrain(flags(dt_dir), o);
  ASSERT_EQ(ds.result.exit_code, 0) << ds.result.err;
  ASSERT_EQ(dt.result.exit_code, 0) << dt.result.err;
  // <YYYYmmddHHMMSS>_rank<R>.log: the time stamp (the launch's start) is masked.
  auto names = [](const std::string& d) {
    std::set<std::string> n;
    std::map<int, json> by_rank;
    for (auto& f : std::filesystem::directory_iterator(d)) {
      const std::string name = f.path().filename().string();
      n.insert(std::regex_replace(name, std::regex("^[0-9]{14}_"), "STAMP_"));
      std::ifstream in(f.path());
      std::string line;
      std::getline(in, line);
      json j = json::parse(line, nullptr, false);
      if (!j.is_discarded()) by_rank[std::stoi(j["env"].value("RANK", "-1"))] = j;
    }
    return std::make_pair(n, by_rank);
  };
  auto [ds_names, ds_ranks] = names(ds_dir);
  auto [dt_names, dt_ranks] = names(dt_dir);
  EXPECT_EQ(ds_names, (std::set<std::string>{"STAMP_rank0.log", "STAMP_rank1.log"}));
  EXPECT_EQ(ds_names, dt_names);
  // The workers' output went to the files (what they hold is what the workers saw), not to the
  // console.
  EXPECT_FALSE(contains(dt.result.out, "\"argv\"")) << dt.result.out;
  EXPECT_EQ(ds_ranks, ds.by_rank);
  EXPECT_EQ(dt_ranks, dt.by_rank);
  expect_same_workers(ds, dt, 2);
  // A C++ program forked from the fork server: no shim runs, the agent writes each rank's
  // bytes to the same files.
  const std::string fs_dir = (dir_ / "fs").string();
  Launch fs = dtrain({"--start-method", "forkserver", "--num_gpus", "2", "--enable_each_rank_log",
                      fs_dir, "--no_python", kCppWorker},
                     o);
  ASSERT_EQ(fs.result.exit_code, 0) << fs.result.err;
  auto [fs_names, fs_ranks] = names(fs_dir);
  EXPECT_EQ(fs_names, ds_names);
  EXPECT_FALSE(contains(fs.result.out, "\"argv\"")) << fs.result.out;
  EXPECT_EQ(fs_ranks, fs.by_rank);
  ASSERT_EQ(fs_ranks.size(), 2u);
  for (auto& [rank, j] : fs_ranks) EXPECT_TRUE(j.value("from_fork_server", false)) << rank;
}

void expect_two_nodes(const Launch& ds, const Launch& dt, const std::string& port);

// Two nodes started by hand (--no_ssh --node_rank K), both on loopback: one launcher per
// "node", as a job script runs the same line on each host. dtrain's two agents meet (their
// store); DeepSpeed's launchers never talk to each other, so its node 1 alone gives what
// DeepSpeed's workers there see (one DeepSpeed launch: two at once took 55 s on the busy
// 2-core development VM, 2026-11-30). The hosts hold 2 and 3 slots: DeepSpeed's LOCAL_RANK is
// RANK % LOCAL_SIZE, so node 1's ranks 2,3,4 get LOCAL_RANK 2,0,1, not their place on the host.
TEST_F(DeepSpeedLauncher, TwoNodesStartedByHandWithNoSshAndNodeRank) {
  RunOptions o = worker_env();
  const std::string hf = hostfile("localhost slots=2\n127.0.0.1 slots=3\n");
  const std::string port = std::to_string(free_port());
  auto flags = [&](int rank) {
    return Args{"-H",
                hf,
                "--no_ssh",
                "--node_rank",
                std::to_string(rank),
                "--master_addr",
                "127.0.0.1",
                "--master_port",
                port,
                "--no_python",
                kCppWorker};
  };
  Launch ds = deepspeed(flags(1), o);
  Launch dt;
  dt.options = o;
  const std::string dir = out_dir();
  dt.options.env.push_back("DS_TEST_OUT=" + dir);
  // Both nodes once with each worker spawned through the shim, once forked from a fork server
  // (the agent then gives each worker what the shim would).
  for (const std::string method : {"spawn", "forkserver"}) {
    SCOPED_TRACE("--start-method " + method);
    auto node = [&](int rank) {
      Args argv = {kDtrain, "deepspeed", "--start-method", method};
      for (const auto& a : flags(rank)) argv.push_back(a);
      return Process::start(argv, dt.options);
    };
    Process n0 = node(0), n1 = node(1);
    auto results = finish_all({&n0, &n1}, o.timeout);
    dt.result = {};
    for (auto& r : results) {
      EXPECT_EQ(r.exit_code, 0) << r.err;
      dt.result.out += r.out;
      dt.result.err += r.err;
    }
    dt.result.exit_code = results[0].exit_code | results[1].exit_code;
    dt.by_rank = read_workers(dir);
    std::filesystem::create_directories(dir);  // for the next round
    ASSERT_EQ(dt.by_rank.size(), 5u) << dt.result.out << dt.result.err;
    for (auto& [rank, j] : dt.by_rank)
      EXPECT_EQ(j.value("from_fork_server", false), method == "forkserver") << rank;
    expect_two_nodes(ds, dt, port);
  }
  std::filesystem::remove_all(dir);
}

void expect_two_nodes(const Launch& ds, const Launch& dt, const std::string& port) {
  // Node 1 (ranks 2, 3, 4) against DeepSpeed's node 1.
  Launch dt_node1 = dt;
  dt_node1.by_rank = {{2, dt.by_rank.at(2)}, {3, dt.by_rank.at(3)}, {4, dt.by_rank.at(4)}};
  expect_same_workers(ds, dt_node1, 3);
  for (int r : {2, 3, 4}) {
    const json& e = dt.by_rank.at(r)["env"];
    const std::string local = std::to_string(r % 3);
    EXPECT_EQ(e.value("LOCAL_RANK", ""), local) << "rank " << r;
    EXPECT_EQ(dt.by_rank.at(r)["argv"][1], "--local_rank=" + local) << "rank " << r;
    EXPECT_EQ(e.value("CROSS_RANK", ""), "1");
    EXPECT_EQ(e.value("CROSS_SIZE", ""), "2");
    EXPECT_EQ(e.value("LOCAL_SIZE", ""), "3");
    EXPECT_EQ(e.value("WORLD_SIZE", ""), "5");
    EXPECT_EQ(e.value("CUDA_VISIBLE_DEVICES", ""), "0,1,2");
  }
  // Node 0: ranks 0 and 1, as DeepSpeed's launch.py numbers them.
  for (int r : {0, 1}) {
    const json& n0e = dt.by_rank.at(r)["env"];
    EXPECT_EQ(n0e.value("LOCAL_RANK", ""), std::to_string(r));
    EXPECT_EQ(n0e.value("CROSS_RANK", ""), "0");
    EXPECT_EQ(n0e.value("LOCAL_SIZE", ""), "2");
    EXPECT_EQ(n0e.value("WORLD_SIZE", ""), "5");
    EXPECT_EQ(n0e.value("CUDA_VISIBLE_DEVICES", ""), "0,1");
    EXPECT_EQ(n0e.value("MASTER_PORT", ""), port);
    EXPECT_EQ(dt.by_rank.at(r)["argv"][1], "--local_rank=" + std::to_string(r));
  }
}

// The lines of `out` that start with `tag` once dtrain's "[defaultR]:" prefix is dropped, sorted.
std::vector<std::string> tagged_lines(const std::string& out, const std::string& tag) {
  std::vector<std::string> lines;
  std::stringstream ss(out);
  for (std::string line; std::getline(ss, line);) {
    const auto at = line.find(tag);
    if (at != std::string::npos) lines.push_back(line.substr(at));
  }
  std::sort(lines.begin(), lines.end());
  return lines;
}

// Real process groups: a PyTorch script joins a Gloo group with env:// (rank 0 hosts the store
// at MASTER_PORT, as under DeepSpeed) and all-reduces, under both launchers; and a dtrain C++
// worker does the same under `dtrain deepspeed`.
TEST_F(DeepSpeedLauncher, PyTorchAndDtrainProcessGroupsFormOnDeepSpeedsEnvironment) {
  RunOptions o = worker_env();
  const std::string script_path = script_dir() + "/ds_allreduce.py";
  Launch ds =
      deepspeed({"--num_gpus", "2", "--master_port", std::to_string(free_port()), script_path}, o);
  Launch dt =
      dtrain({"--num_gpus", "2", "--master_port", std::to_string(free_port()), script_path}, o);
  ASSERT_EQ(ds.result.exit_code, 0) << ds.result.err;
  ASSERT_EQ(dt.result.exit_code, 0) << dt.result.err;
  const std::vector<std::string> want = {
      "ds_allreduce rank=0 world=2 local_rank=0 sum=3 expected=3",
      "ds_allreduce rank=1 world=2 local_rank=1 sum=3 expected=3"};
  EXPECT_EQ(tagged_lines(ds.result.out, "ds_allreduce "), want) << ds.result.out;
  EXPECT_EQ(tagged_lines(dt.result.out, "ds_allreduce "), want) << dt.result.out;
  Launch cpp = dtrain({"--num_gpus", "2", "--no_local_rank", "--master_port",
                       std::to_string(free_port()), kTorchWorker},
                      o);
  ASSERT_EQ(cpp.result.exit_code, 0) << cpp.result.err;
  auto lines = tagged_lines(cpp.result.out, "cluster_worker ");
  ASSERT_EQ(lines.size(), 2u) << cpp.result.out;
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(contains(lines[r], "rank=" + std::to_string(r) + " world=2 local_rank=" +
                                       std::to_string(r) + " local_world=2"))
        << lines[r];
    EXPECT_TRUE(contains(lines[r], "sum=3 expected=3")) << lines[r];
  }
}

// DeepSpeed's own get_numactl_cmd (deepspeed/utils/numa.py in the venv, tests/launcher/
// ds_numactl.py) for each case: [cores_per_rank, ["numactl", ...]] or {"error": ...}; plus its
// count of physical cores and whether numactl is installed.
json deepspeed_numactl(const json& cases) {
  RunOptions o;
  o.timeout = 60s;
  RunResult r =
      Process::start({DTRAIN_VENV_PYTHON, script_dir() + "/ds_numactl.py", cases.dump()}, o)
          .finish(o.timeout);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return json::parse(r.out, nullptr, false);
}

json dtrain_numactl(const std::string& list, int procs, int local_rank,
                    const std::vector<std::vector<int>>& numa) {
  try {
    const auto b = launch::ds_numactl(list, procs, local_rank, numa, launch::physical_core_count());
    return json::array({b.cores_per_rank, b.command()});
  } catch (const UsageError& e) {
    return json{{"error", e.what()}};
  }
}

// --bind_cores_to_rank: which cores each LOCAL_RANK gets and the memory node it is bound to, as
// DeepSpeed's own function computes them, for this machine and for NUMA layouts DeepSpeed
// reads from `numactl --hardware` (two sockets, fake NUMA, flat HBM; given to both).
TEST_F(DeepSpeedLauncher, BindCoresToRankIsDeepSpeedsNumactlCommandPerLocalRank) {
  using Layout = std::vector<std::vector<int>>;
  const Layout machine = launch::numa_node_cpus();
  const Layout two_sockets = {{0, 1, 2, 3}, {4, 5, 6, 7}};
  const Layout fake = {{0, 1, 2, 3}, {0, 1, 2, 3}, {4, 5, 6, 7}, {4, 5, 6, 7}};
  const Layout flat_hbm = {{0, 1, 2, 3}, {4, 5, 6, 7}, {}, {}};
  struct Case {
    std::string list;  // "" : none (DeepSpeed's None)
    int procs, local_rank;
    const Layout* numa;  // nullptr: this machine's
  };
  const int cores = launch::physical_core_count();
  std::vector<Case> cases = {
      {"", 1, 0, nullptr},
      {"", cores, cores - 1, nullptr},
      {"", cores + 1, 0, nullptr},
      {"0-7", 2, 1, &two_sockets},
      {"2-5", 2, 1, &two_sockets},
      {"0-7", 4, 3, &fake},
      {"0-7", 2, 0, &flat_hbm},
      {"4-7", 2, 1, &flat_hbm},
      {"0,2-3,5", 2, 1, &two_sockets},
      {"0-3,6", 3, 2, &two_sockets},
      {"3-1", 1, 0, &two_sockets},
      {"0-1", 3, 0, &two_sockets},
  };
  json in = json::array();
  for (const auto& c : cases) {
    // numactl missing (as on the development VM): numa.py finds no node; it is given the one
    // dtrain reads from sysfs, so both compute from the same layout.
    in.push_back({{"list", c.list.empty() ? json(nullptr) : json(c.list)},
                  {"procs", c.procs},
                  {"local_rank", c.local_rank},
                  {"numa", c.numa ? json(*c.numa) : json(machine)}});
  }
  const json ds = deepspeed_numactl(in);
  ASSERT_TRUE(ds.is_object() && ds["cases"].size() == cases.size()) << ds.dump();
  EXPECT_EQ(ds["physical_cores"].get<int>(), cores) << "psutil.cpu_count(logical=False)";
  for (size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    const json dt = dtrain_numactl(c.list, c.procs, c.local_rank, c.numa ? *c.numa : machine);
    SCOPED_TRACE("case " + std::to_string(k) + ": list '" + c.list + "', " +
                 std::to_string(c.procs) + " local ranks, local rank " +
                 std::to_string(c.local_rank));
    const json& want = ds["cases"][k];
    if (want.is_object()) {  // DeepSpeed raises: dtrain refuses, with its words where it has them
      ASSERT_TRUE(dt.is_object()) << "DeepSpeed: " << want.dump() << " dtrain: " << dt.dump();
      if (contains(want["error"].get<std::string>(), "At least one core")) {
        EXPECT_TRUE(contains(dt["error"].get<std::string>(), "At least one core")) << dt.dump();
      }
    } else {
      EXPECT_EQ(dt, want);
    }
  }
  // A host whose slots do not start at a multiple of its own count: node 1 of "0,1,2/0,1" holds
  // ranks 3 and 4, LOCAL_RANK 1 and 0, so its first worker gets local rank 1's cores.
  if (cores >= 2) {
    launch::DsExec e;
    e.world = {{0, 1, 2}, {0, 1}};
    e.bind_cores = true;
    e.no_python = true;
    e.program = "prog";
    const launch::DsWorker w = launch::ds_worker(e, 1, 0);
    EXPECT_EQ(w.local_rank, 1);
    ASSERT_TRUE(w.binding.has_value());
    const json want = deepspeed_numactl(json::array(
        {{{"list", nullptr}, {"procs", 2}, {"local_rank", 1}, {"numa", machine}}}))["cases"][0];
    EXPECT_EQ(json::array({w.binding->cores_per_rank, w.binding->command()}), want);
  }
}

// The workers run where DeepSpeed's numactl would put them - spawned through the shim and
// forked from the fork server alike - with OMP_NUM_THREADS = cores per rank; the other
// variables and argv are the same as without binding (numactl changes neither).
TEST_F(DeepSpeedLauncher, BoundWorkersRunOnDeepSpeedsCoresSpawnedOrForked) {
  const int procs = std::min(2, launch::physical_core_count());
  ASSERT_GE(procs, 1);
  json in = json::array();
  for (int lr = 0; lr < procs; ++lr)
    in.push_back({{"list", nullptr},
                  {"procs", procs},
                  {"local_rank", lr},
                  {"numa", launch::numa_node_cpus()}});
  const json ds = deepspeed_numactl(in);
  ASSERT_TRUE(ds.is_object()) << ds.dump();
  RunOptions o = worker_env();
  for (const std::string method : {"spawn", "forkserver"}) {
    SCOPED_TRACE("--start-method " + method);
    Launch dt = dtrain({"--start-method", method, "--bind_cores_to_rank", "--num_gpus",
                        std::to_string(procs), "--no_python", kCppWorker},
                       o);
    ASSERT_EQ(dt.result.exit_code, 0) << dt.result.err;
    ASSERT_EQ(dt.by_rank.size(), static_cast<size_t>(procs)) << dt.result.out;
    for (auto& [rank, j] : dt.by_rank) {
      const int lr = std::stoi(j["env"].value("LOCAL_RANK", "-1"));
      const json& want = ds["cases"][lr];  // [cores, ["numactl", ("-m", N,) "-C", LIST]]
      const auto cmd = want[1].get<std::vector<std::string>>();
      json cpus = json::array();
      for (int c : launch::parse_cpu_list("-C", cmd.back())) cpus.push_back(c);
      EXPECT_EQ(j["cpus"], cpus) << "rank " << rank;
      EXPECT_EQ(j["env"].value("OMP_NUM_THREADS", ""), std::to_string(want[0].get<int>()));
      const auto m = std::find(cmd.begin(), cmd.end(), "-m");
      if (m != cmd.end()) {  // numactl -m N: MPOL_BIND (2) to node N
        EXPECT_EQ(j["mem_policy"], 2) << "rank " << rank;
        EXPECT_EQ(j["mem_nodes"], json::array({std::stoi(*(m + 1))})) << "rank " << rank;
      } else {
        EXPECT_EQ(j["mem_policy"], 0) << "rank " << rank;  // MPOL_DEFAULT
      }
      EXPECT_EQ(j.value("from_fork_server", false), method == "forkserver");
    }
  }
  // DeepSpeed refuses KMP_AFFINITY with binding; so does dtrain, before anything starts.
  Launch kmp = dtrain({"--bind_cores_to_rank", "--num_gpus", "1", "--no_python", kCppWorker},
                      worker_env({"KMP_AFFINITY=compact"}));
  EXPECT_EQ(kmp.result.exit_code, 2) << kmp.result.err;
  EXPECT_TRUE(contains(kmp.result.err, "Environment variable KMP_AFFINITY conflicts with numactl"))
      << kmp.result.err;
  EXPECT_TRUE(kmp.by_rank.empty());
}

// The shell's OMP_NUM_THREADS gives way to the share's size with binding, as under DeepSpeed:
// its own runner and launch.py, run by ds_record.py with a recording Popen (no worker starts
// there), against what dtrain's workers get.
TEST_F(DeepSpeedLauncher, BindingSetsOmpNumThreadsOverTheShellsAsDeepSpeedDoes) {
  const std::string procs = std::to_string(std::min(2, launch::physical_core_count()));
  RunOptions o = worker_env({"OMP_NUM_THREADS=7"});
  o.unset = {"CUDA_VISIBLE_DEVICES"};
  const Args flags = {"--bind_cores_to_rank", "--num_gpus", procs, "--no_python", kCppWorker};
  Args argv = {DTRAIN_VENV_PYTHON, script_dir() + "/ds_record.py"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  const RunResult r = Process::start(argv, o).finish(o.timeout);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const size_t at = r.out.find("record ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const json ds = json::parse(r.out.substr(at + 7, r.out.find('\n', at) - at - 7), nullptr, false);
  ASSERT_TRUE(ds.contains("ok")) << r.out;
  ASSERT_EQ(ds["ok"].size(), static_cast<size_t>(std::stoi(procs))) << r.out;
  Launch dt = dtrain(flags, o);
  ASSERT_EQ(dt.result.exit_code, 0) << dt.result.err;
  ASSERT_EQ(dt.by_rank.size(), ds["ok"].size()) << dt.result.out;
  for (const auto& w : ds["ok"]) {
    const int rank = std::stoi(w["env"].value("RANK", "-1"));
    ASSERT_TRUE(dt.by_rank.count(rank)) << rank;
    EXPECT_NE(w["env"].value("OMP_NUM_THREADS", ""), "7");
    EXPECT_EQ(dt.by_rank[rank]["env"].value("OMP_NUM_THREADS", ""),
              w["env"].value("OMP_NUM_THREADS", ""))
        << "rank " << rank;
  }
}

bool alive(int pid) { return ::kill(pid, 0) == 0; }

TEST_F(DeepSpeedLauncher, AFailingWorkerEndsTheJobWithItsExitCodeAndNoOrphans) {
  RunOptions o = worker_env({"DS_TEST_FAIL_RANK=1"});
  const Args flags = {"--num_gpus", "2", script()};
  Launch ds = deepspeed(flags, o), dt = dtrain(flags, o);
  EXPECT_EQ(ds.result.exit_code, 3) << ds.result.err;
  EXPECT_EQ(dt.result.exit_code, ds.result.exit_code) << dt.result.err;
  for (const Launch* l : {&ds, &dt}) {
    ASSERT_EQ(l->by_rank.size(), 2u) << l->result.out;
    for (auto& [rank, j] : l->by_rank) {
      const int pid = j["pid"].get<int>();
      // Reaped by its launcher (a zombie would still answer kill 0 only until then).
      EXPECT_FALSE(alive(pid)) << "rank " << rank << " (pid " << pid << ") outlived "
                               << (l == &ds ? "deepspeed" : "dtrain deepspeed");
      if (alive(pid)) ::kill(pid, SIGKILL);
    }
  }
}

// Bad input: exit 2, nothing started, one line that says what was wrong - in DeepSpeed's words
// where DeepSpeed has them (checked against the real launcher's message).
TEST_F(DeepSpeedLauncher, BadHostfilesAndFiltersGetDeepSpeedsMessages) {
  RunOptions o = worker_env();
  struct Case {
    std::string hostfile;
    Args flags;
    std::string message;  // DeepSpeed's
  };
  const std::vector<Case> cases = {
      {"localhost slots=2\nworker-1 slots=x\n",
       {},
       "Hostfile contains a bad entry: worker-1 slots=x"},
      {"localhost slots=2\n", {"--include", "nosuch:0"}, "Hostname 'nosuch' not found in hostfile"},
  };
  for (const auto& c : cases) {
    Args flags = {"-H", hostfile(c.hostfile), "--no_ssh_check", "--master_addr", "127.0.0.1"};
    flags.insert(flags.end(), c.flags.begin(), c.flags.end());
    flags.push_back(script());
    Launch ds = deepspeed(flags, o), dt = dtrain(flags, o);
    EXPECT_NE(ds.result.exit_code, 0);
    EXPECT_TRUE(contains(ds.result.err, c.message)) << "deepspeed: " << ds.result.err;
    EXPECT_EQ(dt.result.exit_code, 2) << dt.result.err;
    EXPECT_TRUE(contains(dt.result.err, "dtrain deepspeed: error: ")) << dt.result.err;
    EXPECT_TRUE(contains(dt.result.err, c.message)) << "dtrain: " << dt.result.err;
    EXPECT_FALSE(contains(dt.result.err, "Traceback")) << dt.result.err;
    EXPECT_TRUE(dt.by_rank.empty()) << dt.result.out;
  }
}

// `--FLAG=` (argparse's empty string) for every flag of DeepSpeed's runner: DeepSpeed's own
// runner.main and launch.py main, run by ds_empty_values.py with a recording Popen (no worker
// starts there), say whether it goes on and with which workers. dtrain deepspeed goes on with the
// same workers (argv and variables) or, where DeepSpeed stops, exits 2 with one line naming the
// flag, starting nothing. One node: the flags read only across nodes are checked as one node has
// them (launcher.md's table names what dtrain does with them across nodes).
TEST_F(DeepSpeedLauncher, EmptyFlagValuesAsDeepSpeedTakesThem) {
  RunOptions o = worker_env();
  o.timeout = 120s;
  RunResult r =
      Process::start({DTRAIN_VENV_PYTHON, script_dir() + "/ds_empty_values.py", kCppWorker, "a"}, o)
          .finish(o.timeout);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  int flags = 0, stops = 0, spaced = 0, spaced_stops = 0;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    // "empty FLAG": `FLAG=`; "space FLAG": `FLAG ''` (a flag that takes a value).
    const bool is_space = line.rfind("space ", 0) == 0;
    if (line.rfind("empty ", 0) != 0 && !is_space) continue;
    const size_t space = line.find(' ', 6);
    const std::string flag = line.substr(6, space - 6);
    const json want = json::parse(line.substr(space + 1), nullptr, false);
    ASSERT_TRUE(want.is_object()) << line;
    SCOPED_TRACE(flag + (is_space ? " ''" : "=") + ": DeepSpeed " + want.dump().substr(0, 300));
    ++(is_space ? spaced : flags);
    Args args = {"--num_gpus", "2", "--no_python", kCppWorker, "a"};
    if (is_space)
      args.insert(args.begin(), {flag, ""});
    else
      args.insert(args.begin(), flag + "=");
    Launch dt = dtrain(args, o);
    if (want.contains("error")) {
      ++(is_space ? spaced_stops : stops);
      EXPECT_EQ(dt.result.exit_code, 2) << dt.result.err;
      const std::string first = dt.result.err.substr(0, dt.result.err.find('\n'));
      EXPECT_TRUE(contains(first, "dtrain deepspeed: error: " + flag)) << dt.result.err;
      EXPECT_TRUE(dt.by_rank.empty()) << dt.result.out;
      continue;
    }
    Launch ds;  // what DeepSpeed's launch.py would have started
    ds.options = o;
    ds.result.exit_code = 0;
    for (const auto& w : want["ok"]) {
      json worker = {{"argv", w["argv"]}, {"env", w["env"]}};
      ds.by_rank[std::stoi(w["env"].value("RANK", "-1"))] = worker;
    }
    expect_same_workers(ds, dt, 2);
  }
  // DeepSpeed 0.19.8's runner: 30 option strings besides -h/--help, 18 of which stop on "";
  // 20 take a value, 8 of which stop on `FLAG ''`.
  EXPECT_EQ(flags, 30) << r.out;
  EXPECT_EQ(stops, 18) << r.out;
  EXPECT_EQ(spaced, 20) << r.out;
  EXPECT_EQ(spaced_stops, 8) << r.out;
}

TEST_F(DeepSpeedLauncher, BadFlagsAreNamedWithExitTwoAndNothingStarted) {
  RunOptions o = worker_env();
  const std::string hf = hostfile("localhost slots=2\n# worker-1 slots=4\n");
  struct Case {
    Args flags;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"-H", hf, "--include", "localhost:7"}, "No slot '7' specified on host 'localhost'"},
      {{"-H", hf, "--include", "localhost", "--exclude", "localhost:1"},
       "--include and --exclude are mutually exclusive"},
      {{"-H", hf, "--include", "localhost:0", "--num_gpus", "1"},
       "Cannot specify num_nodes/gpus with include/exclude"},
      {{"-H", hf, "--include", "localhost:a"}, "bad slot 'a' in 'localhost:a'"},
      {{"-H", (dir_ / "missing").string()}, "-H " + (dir_ / "missing").string() + ": no such file"},
      {{"--num_nodes", "2"}, "Num nodes is >1 but no extra nodes available via hostfile"},
      {{"--module", "--no_python"},
       "Don't use both the '--no_python' flag and the '--module' flag at the same time."},
      {{"--autotuning", "tune"}, "--autotuning tune: DeepSpeed's autotuner is not part of"},
      {{"--launcher", "openmpi"},
       "--launcher openmpi: dtrain deepspeed starts other nodes over ssh"},
      {{"--launcher_args", "-x"}, "--launcher_args: pdsh's arguments do not apply"},
      {{"--node_rank", "1"}, "--node_rank 1 is only read with --no_ssh"},
      {{"-H", hf, "--no_ssh", "--node_rank", "3"},
       "Launching training without ssh, but --node_rank is not set correctly"},
      {{"--num_gpus", "two"}, "--num_gpus: got 'two', expected an integer"},
      {{"--elastic_training"}, "unknown option '--elastic_training'"},
      {{"--enable_each_rank_log", hf},
       "--enable_each_rank_log " + hf + " should not be a file, it should be a directory."},
  };
  for (const auto& c : cases) {
    Args flags = c.flags;
    flags.push_back(script());
    Launch dt = dtrain(flags, o);
    EXPECT_EQ(dt.result.exit_code, 2) << dt.result.err;
    EXPECT_TRUE(contains(dt.result.err, "dtrain deepspeed: error: " + c.message)) << dt.result.err;
    EXPECT_TRUE(dt.by_rank.empty()) << dt.result.out;
  }
  // Without a hostfile the slots are this node's devices (99 is none on any machine).
  Launch local = dtrain({"--include", "localhost:99", script()}, o);
  EXPECT_EQ(local.result.exit_code, 2);
  EXPECT_TRUE(
      contains(local.result.err, "No slot '99' specified on host 'localhost' (its slots: 0"))
      << local.result.err;
  EXPECT_TRUE(contains(local.result.err,
                       "; without a hostfile this node has one slot per device, as DeepSpeed "
                       "counts them (here "))
      << local.result.err;
  Launch none = dtrain({"--num_gpus", "1"}, o);
  EXPECT_EQ(none.result.exit_code, 2);
  EXPECT_TRUE(contains(none.result.err, "dtrain deepspeed: error: missing PROGRAM: give the "))
      << none.result.err;
  // PROGRAM that is not there.
  Launch dt = dtrain({"--num_gpus", "1", (dir_ / "nosuch.py").string()}, o);
  EXPECT_EQ(dt.result.exit_code, 2);
  EXPECT_TRUE(contains(dt.result.err, "no such script")) << dt.result.err;
}

TEST_F(DeepSpeedLauncher, SavePidWritesTheLaunchersPidWhileTheJobRuns) {
  RunOptions o = worker_env();
  Process p = Process::start({kDtrain, "deepspeed", "--save_pid", "--num_gpus", "1", script()}, o);
  const std::string pid = std::to_string(p.pid());
  RunResult r = p.finish(30s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "launcher pid: " + pid + "\n")) << r.out;
  // The worker (a child of the launcher) read /tmp/<launcher pid>.deepspeed while it ran.
  EXPECT_TRUE(contains(r.out, "\"saved_pid\": \"" + pid + "\"")) << r.out;
  EXPECT_FALSE(std::filesystem::exists("/tmp/" + pid + ".deepspeed")) << "left behind";
}

}  // namespace
}  // namespace dtrain::test
