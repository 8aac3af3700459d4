// The Distributor end to end: this test binary is the driver, and (re-executed by the
// launcher) its own workers: main() calls dtrain::init first, as a user's program does.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <thread>

#include "dtrain/dtrain.h"
#include "support/distributor_processes.h"
#include "support/paths.h"
#include "support/scoped_env.h"

pid_t probe_constructor_pid();  // tests/launcher/preload_probe.cpp

namespace {

using namespace std::chrono_literals;

std::vector<int> distributor_workers() { return dtrain::test::distributor_processes(); }

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : -1;
}

// ---- functions run by the workers -------------------------------------------------------

int my_rank() { return env_int("RANK"); }

std::map<std::string, int> worker_identity() {
  return {{"rank", env_int("RANK")},
          {"world_size", env_int("WORLD_SIZE")},
          {"local_rank", env_int("LOCAL_RANK")},
          {"pid", static_cast<int>(::getpid())}};
}

double all_reduce_sum(double scale) {
  auto pg = dtrain::init_process_group();
  auto t = torch::full({4}, scale * (pg->rank() + 1), torch::kFloat64);
  dtrain::all_reduce(t);
  return t[0].item<double>();
}

// Whether this worker was forked from the launcher's fork server: the libraries it links were
// initialised there, so preload_probe's constructor ran in another process (the server).
bool forked_from_a_fork_server() { return probe_constructor_pid() != ::getpid(); }

// A BLAS product big enough for OpenBLAS to use its threads.
std::pair<bool, double> matmul_in_worker() {
  auto a = torch::ones({512, 512}, torch::kFloat64);
  return {forked_from_a_fork_server(), torch::mm(a, a).sum().item<double>()};
}

struct Report {
  std::string text;
  std::vector<double> values;
  void serialize(dtrain::Encoder& out) const {
    out.put(text);
    out.put(values);
  }
  static Report deserialize(dtrain::Decoder& in) {
    Report r;
    r.text = in.get<std::string>();
    r.values = in.get<std::vector<double>>();
    return r;
  }
};

Report echo_everything(double lr, bool flag, const std::string& name, std::vector<int> ints,
                       const std::map<std::string, double>& table, torch::Tensor tensor,
                       Report in) {
  Report out;
  out.text = name + (flag ? ":yes:" : ":no:") + in.text;
  out.values.push_back(lr);
  for (int i : ints) out.values.push_back(i);
  for (const auto& [k, v] : table) out.values.push_back(v);
  out.values.push_back(tensor.sum().item<double>());
  out.values.push_back(static_cast<double>(tensor.numel()));
  for (double v : in.values) out.values.push_back(v);
  return out;
}

torch::Tensor big_tensor(int64_t mib) {
  // mib MiB of distinct float32 values: the bit patterns 0, 1, 2, ... (no NaN below 2^31).
  return torch::arange(mib * 1024 * 1024 / 4, torch::kInt32).view(torch::kFloat32);
}

dtrain::StateDict train_one_step(double lr) {
  // One intra-op thread on both sides (the test and the workers, which the launcher gives
  // OMP_NUM_THREADS=1): libtorch 2.x's CPU kernels sum in thread-count-dependent order, and
  // the comparison below is bitwise.
  at::set_num_threads(1);
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3));
  torch::optim::SGD opt(model->parameters(), lr);
  auto loss = model->forward(torch::ones({8, 4})).pow(2).sum();
  loss.backward();
  opt.step();
  return dtrain::state_dict(*model);
}

int throws_on_rank_one(int) {
  if (my_rank() == 1) throw std::invalid_argument("bad batch size 0 on rank 1");
  std::this_thread::sleep_for(30s);  // the failure of rank 1 must stop this rank
  return 0;
}

int aborts_on_rank_one() {
  if (my_rank() == 1) {
    std::fprintf(stderr, "about to abort\n");
    std::abort();
  }
  std::this_thread::sleep_for(30s);
  return 0;
}

int exits_three() {
  std::fflush(nullptr);
  std::exit(3);
}

int sleeps(int seconds) {
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  return 1;
}

void returns_nothing() {}

int nested_run() {
  dtrain::Distributor inner({.num_processes = 1});
  return inner.run(my_rank);
}

// ---- tests -----------------------------------------------------------------------------

TEST(Distributor, ReturnsRankZerosResultWithTheWorkerEnvironment) {
  dtrain::Distributor d({.num_processes = 2});
  auto id = d.run(worker_identity);
  EXPECT_EQ(id.at("rank"), 0);
  EXPECT_EQ(id.at("world_size"), 2);
  EXPECT_EQ(id.at("local_rank"), 0);
  EXPECT_NE(id.at("pid"), static_cast<int>(::getpid()));
  EXPECT_TRUE(distributor_workers().empty());
}

TEST(Distributor, RunAllReturnsEveryRanksResultInRankOrder) {
  dtrain::Distributor d({.num_processes = 3});
  auto ids = d.run_all(worker_identity);
  ASSERT_EQ(ids.size(), 3u);
  std::set<int> pids;
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(ids[r].at("rank"), r);
    EXPECT_EQ(ids[r].at("world_size"), 3);
    pids.insert(ids[r].at("pid"));
  }
  EXPECT_EQ(pids.size(), 3u);
}

TEST(Distributor, ProcessGroupJustWorksInsideTheFunction) {
  dtrain::Distributor d({.num_processes = 2});
  // (1 + 2) * 1.5: both ranks' contributions, summed by a real Gloo all_reduce.
  EXPECT_DOUBLE_EQ(d.run(all_reduce_sum, 1.5), 4.5);
  // A capture-less lambda works too, and arguments convert to the parameter types.
  EXPECT_EQ(d.run([](int a, long b) { return a * b + my_rank(); }, 6, 7), 42);
  d.run(returns_nothing);
}

TEST(Distributor, ArgumentsAndResultsOfEverySupportedKindRoundTrip) {
  dtrain::Distributor d({.num_processes = 2});
  auto tensor = torch::arange(1000, torch::kFloat64);
  Report r = d.run(echo_everything, 1e-3, true, std::string("mlp"), std::vector<int>{1, 2, 3},
                   std::map<std::string, double>{{"a", 0.5}, {"b", 0.25}}, tensor,
                   Report{"in", {7.0, 8.0}});
  EXPECT_EQ(r.text, "mlp:yes:in");
  std::vector<double> expected{1e-3, 1, 2, 3, 0.5, 0.25, 499500.0, 1000.0, 7.0, 8.0};
  EXPECT_EQ(r.values, expected);
}

TEST(Distributor, A256MegabyteTensorComesBack) {
  dtrain::Distributor d({.num_processes = 2});
  auto t = d.run(big_tensor, int64_t{256});
  ASSERT_EQ(t.numel() * t.element_size(), 256LL * 1024 * 1024);
  EXPECT_TRUE(torch::equal(t.view(torch::kInt32), big_tensor(256).view(torch::kInt32)));
}

TEST(Distributor, AStateDictComesBackAndLoadsIntoAFreshModel) {
  dtrain::Distributor d({.num_processes = 2});
  dtrain::StateDict sd = d.run(train_one_step, 0.1);
  EXPECT_TRUE(sd.contains("0.weight"));
  EXPECT_TRUE(sd.contains("1.running_mean"));
  torch::nn::Sequential fresh(torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3));
  dtrain::load_state_dict(*fresh, sd);
  auto here = train_one_step(0.1);
  for (const auto& item : here) {
    EXPECT_TRUE(torch::equal(item.value(), dtrain::state_dict(*fresh)[item.key()])) << item.key();
  }
}

TEST(Distributor, WorkersAreForkedFromAForkServerAndOpenBlasThreadsSurviveIt) {
  // With OMP_NUM_THREADS=2 OpenBLAS starts a thread pool while libtorch loads, in the fork
  // server; it stops the pool for fork() and each worker starts its own on first use.
  for (const char* threads : {"1", "2"}) {
    SCOPED_TRACE(std::string("OMP_NUM_THREADS=") + threads);
    dtrain::Distributor d({.num_processes = 2, .env = {{"OMP_NUM_THREADS", threads}}});
    auto results = d.run_all(matmul_in_worker);
    ASSERT_EQ(results.size(), 2u);
    for (const auto& [forked, sum] : results) {
      EXPECT_TRUE(forked)
          << "a libtorch worker with 2 processes per node starts from the fork server";
      EXPECT_EQ(sum, 512.0 * 512.0 * 512.0);
    }
  }
}

TEST(Distributor, AWorkerExceptionBecomesWorkerErrorWithRankTypeMessageAndStderr) {
  dtrain::Distributor d({.num_processes = 2});
  auto start = std::chrono::steady_clock::now();
  try {
    d.run(throws_on_rank_one, 0);
    FAIL() << "run returned";
  } catch (const dtrain::WorkerError& e) {
    EXPECT_EQ(e.rank(), 1);
    EXPECT_EQ(e.exception_type(), "std::invalid_argument");
    EXPECT_EQ(e.exception_message(), "bad batch size 0 on rank 1");
    EXPECT_EQ(e.exit_code(), 1);
    std::string tail;
    for (const auto& l : e.stderr_tail()) tail += l + "\n";
    EXPECT_NE(tail.find("bad batch size 0 on rank 1"), std::string::npos) << tail;
    EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
  }
  // Rank 0 was sleeping 30 s: it was stopped, not waited for.
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);
  EXPECT_TRUE(distributor_workers().empty());
}

TEST(Distributor, ACrashingWorkerGivesItsSignal) {
  dtrain::Distributor d({.num_processes = 2});
  try {
    d.run(aborts_on_rank_one);
    FAIL() << "run returned";
  } catch (const dtrain::WorkerError& e) {
    EXPECT_EQ(e.rank(), 1);
    EXPECT_EQ(e.signal(), SIGABRT);
    EXPECT_EQ(e.exit_code(), 128 + SIGABRT);
    EXPECT_TRUE(e.exception_type().empty());
    EXPECT_NE(std::string(e.what()).find("SIGABRT"), std::string::npos) << e.what();
    ASSERT_FALSE(e.stderr_tail().empty());
    EXPECT_NE(e.stderr_tail().front().find("about to abort"), std::string::npos);
  }
  EXPECT_TRUE(distributor_workers().empty());
}

TEST(Distributor, AFunctionThatExitsGivesItsExitCode) {
  dtrain::Distributor d({.num_processes = 1});
  try {
    d.run(exits_three);
    FAIL() << "run returned";
  } catch (const dtrain::WorkerError& e) {
    EXPECT_EQ(e.rank(), 0);
    EXPECT_EQ(e.exit_code(), 3);
  }
}

TEST(Distributor, ATimeoutStopsTheWorkersAndThrowsTimeoutError) {
  dtrain::Distributor d({.num_processes = 2, .timeout = 1500ms, .term_timeout = 1s});
  auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(d.run(sleeps, 60), dtrain::TimeoutError);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 15s);
  EXPECT_TRUE(distributor_workers().empty());
}

TEST(Distributor, RunsInTurnAndConcurrentlyFromTwoThreadsDoNotInterfere) {
  dtrain::Distributor a({.num_processes = 2});
  dtrain::Distributor b({.num_processes = 2});
  EXPECT_DOUBLE_EQ(a.run(all_reduce_sum, 1.0), 3.0);
  EXPECT_DOUBLE_EQ(b.run(all_reduce_sum, 2.0), 6.0);
  double ra = 0, rb = 0;
  std::string ea, eb;
  std::thread ta([&] {
    try {
      ra = a.run(all_reduce_sum, 10.0);
    } catch (const std::exception& e) {
      ea = e.what();
    }
  });
  std::thread tb([&] {
    try {
      rb = b.run(all_reduce_sum, 100.0);
    } catch (const std::exception& e) {
      eb = e.what();
    }
  });
  ta.join();
  tb.join();
  EXPECT_EQ(ea, "");
  EXPECT_EQ(eb, "");
  EXPECT_DOUBLE_EQ(ra, 30.0);
  EXPECT_DOUBLE_EQ(rb, 300.0);
  EXPECT_TRUE(distributor_workers().empty());
}

TEST(Distributor, NestedRunInsideAWorkerIsAClearError) {
  dtrain::Distributor d({.num_processes = 1});
  try {
    d.run(nested_run);
    FAIL() << "run returned";
  } catch (const dtrain::WorkerError& e) {
    EXPECT_EQ(e.exception_type(), "dtrain::UsageError");
    EXPECT_NE(e.exception_message().find("nested"), std::string::npos) << e.what();
  }
}

TEST(Distributor, ExtraEnvironmentAndLogDirReachTheWorkers) {
  char tmpl[] = "/tmp/dtrain-distributor-logs-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  dtrain::Distributor d({.num_processes = 2, .log_dir = tmpl, .env = {{"MY_SETTING", "42"}}});
  // torchrun's PET_<OPTION> variables (a Kubeflow pod's) are for a `dtrain run` command line:
  // the Distributor's own job does not take them.
  dtrain::test::ScopedEnv env;
  env.set("PET_ROLE", "not_for_the_distributor");
  auto got = d.run_all(+[] {
    std::printf("hello from the worker\n");
    const char* role = std::getenv("ROLE_NAME");
    return role && std::string(role) == "default" ? env_int("MY_SETTING") : -1;
  });
  EXPECT_EQ(got, (std::vector<int>{42, 42}));
  // LOG_DIR/<run id>_<random>/attempt_0/1/stdout.log (torchrun's layout; local rank 1)
  bool found = false;
  for (const auto& e : std::filesystem::recursive_directory_iterator(tmpl)) {
    if (e.path().filename() == "stdout.log" && e.path().parent_path().filename() == "1" &&
        e.path().parent_path().parent_path().filename() == "attempt_0") {
      std::ifstream in(e.path());
      std::string text((std::istreambuf_iterator<char>(in)), {});
      found = text.find("hello from the worker") != std::string::npos;
    }
  }
  EXPECT_TRUE(found);
  std::filesystem::remove_all(tmpl);
}

// ---- program mode ----------------------------------------------------------------------

TEST(DistributorProgram, ACppBinaryRunsWithTheLauncherContract) {
  char tmpl[] = "/tmp/dtrain-distributor-touch-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  dtrain::Distributor d({.num_processes = 2});
  d.run(TEST_WORKER_BIN, {"--store-barrier", "--touch", std::string(tmpl) + "/ran"});
  EXPECT_TRUE(std::filesystem::exists(std::string(tmpl) + "/ran"));
  std::filesystem::remove_all(tmpl);
}

TEST(DistributorProgram, AFailingProgramThrowsWithRankExitCodeAndStderrTail) {
  dtrain::Distributor d({.num_processes = 2});
  try {
    d.run(TEST_WORKER_BIN, {"--lines", "3", "--exit-on-rank", "1", "7", "--sleep", "30"});
    FAIL() << "run returned";
  } catch (const dtrain::WorkerError& e) {
    EXPECT_EQ(e.rank(), 1);
    EXPECT_EQ(e.exit_code(), 7);
    ASSERT_EQ(e.stderr_tail().size(), 4u);
    EXPECT_EQ(e.stderr_tail().back(), "rank 1 exiting with 7 on purpose");
  }
  EXPECT_THROW(d.run("/nonexistent/program"), dtrain::UsageError);
}

TEST(DistributorProgram, APythonScriptRunsThroughPython) {
  char tmpl[] = "/tmp/dtrain-distributor-py-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string script = std::string(tmpl) + "/train.py";
  {
    std::ofstream out(script);
    out << "import os, sys\n"
           "import torch.distributed as dist\n"
           "dist.init_process_group('gloo')\n"
           "t = __import__('torch').ones(1) * (dist.get_rank() + 1)\n"
           "dist.all_reduce(t)\n"
           "assert t.item() == 3, t\n"
           "if sys.argv[1:] == ['--fail'] and dist.get_rank() == 1:\n"
           "    raise SystemExit('rank 1 refuses: ' + os.environ['LOCAL_RANK'])\n"
           "open(os.path.join(os.path.dirname(__file__), 'done_%d' % dist.get_rank()), 'w')\n";
  }
  dtrain::Distributor d({.num_processes = 2, .env = {{"DTRAIN_PYTHON", "/usr/bin/python3"}}});
  d.run(script);
  EXPECT_TRUE(std::filesystem::exists(std::string(tmpl) + "/done_0"));
  EXPECT_TRUE(std::filesystem::exists(std::string(tmpl) + "/done_1"));
  try {
    d.run(script, {"--fail"});
    FAIL() << "run returned";
  } catch (const dtrain::WorkerError& e) {
    EXPECT_EQ(e.rank(), 1);
    EXPECT_EQ(e.exit_code(), 1);
    ASSERT_FALSE(e.stderr_tail().empty());
    EXPECT_NE(e.stderr_tail().back().find("rank 1 refuses: 1"), std::string::npos);
  }
  std::filesystem::remove_all(tmpl);
}

// ---- options ----------------------------------------------------------------------------

TEST(DistributorOptions, InvalidOptionsAreClearErrors) {
  EXPECT_THROW(dtrain::Distributor({.num_processes = 0}), dtrain::UsageError);
  EXPECT_THROW(dtrain::Distributor({.num_processes = -2}), dtrain::UsageError);
  try {
    dtrain::Distributor({.num_processes = 2, .use_gpu = true});
    FAIL();
  } catch (const dtrain::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("use_gpu"), std::string::npos);
  }
  EXPECT_THROW(dtrain::Distributor({.num_processes = 2, .local_mode = false}), dtrain::UsageError);
  // The MPI launcher starts the workers: nothing of dtrain's restarts them or keeps their logs.
  dtrain::DistributorOptions mpi{.num_processes = 2, .local_mode = false, .max_restarts = 1};
  mpi.cluster.engine = "mpi";
  try {
    dtrain::Distributor d(mpi);
    FAIL() << "max_restarts with engine mpi";
  } catch (const dtrain::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("max_restarts is 1, but engine \"mpi\""),
              std::string::npos)
        << e.what();
  }
  mpi.max_restarts = 0;
  mpi.log_dir = "/tmp/logs";
  try {
    dtrain::Distributor d(mpi);
    FAIL() << "log_dir with engine mpi";
  } catch (const dtrain::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("log_dir needs a dtrain agent"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(dtrain::Distributor({.num_processes = 2, .timeout = 0ms}), dtrain::UsageError);
  EXPECT_THROW(
      dtrain::Distributor({.num_processes = 2, .launcher = "/nonexistent/dtrain"}).run(my_rank),
      dtrain::UsageError);
}

TEST(DistributorOptions, DevicePlanGivesEachWorkerItsOwnGpu) {
  using dtrain::detail::plan_devices;
  auto cpu = plan_devices(4, true, false, {});
  EXPECT_EQ(cpu.num_processes, 4);
  EXPECT_EQ(cpu.cuda_visible_devices, "");
  auto fits = plan_devices(2, true, true, {"0", "1", "2"});
  EXPECT_EQ(fits.num_processes, 2);
  EXPECT_EQ(fits.cuda_visible_devices, "0,1");
  EXPECT_EQ(fits.warning, "");
  auto lowered = plan_devices(4, true, true, {"2", "5"});
  EXPECT_EQ(lowered.num_processes, 2);
  EXPECT_EQ(lowered.cuda_visible_devices, "2,5");
  EXPECT_NE(lowered.warning.find("using 2 process"), std::string::npos) << lowered.warning;
  auto remote = plan_devices(4, false, true, {});
  EXPECT_EQ(remote.num_processes, 4);  // cluster nodes have their own GPUs; the driver needs none
  EXPECT_EQ(remote.cuda_visible_devices, "");
  EXPECT_THROW(plan_devices(2, true, true, {}), dtrain::UsageError);
  EXPECT_THROW(plan_devices(0, true, false, {}), dtrain::UsageError);
}

// ---- elastic membership on the cluster engines (issue #15) -------------------------------

std::string elastic_error(const dtrain::DistributorOptions& o, int nodes) {
  try {
    dtrain::detail::plan_elastic(o, nodes);
  } catch (const dtrain::UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no UsageError";
  return "";
}

dtrain::DistributorOptions cluster(const std::string& engine, int min_nodes, int max_nodes) {
  dtrain::DistributorOptions o{.num_processes = 4, .local_mode = false};
  o.cluster.engine = engine;
  o.cluster.min_nodes = min_nodes;
  o.cluster.max_nodes = max_nodes;
  return o;
}

TEST(DistributorElastic, SshAndSlurmGetTheNnodesRangeAndC10d) {
  using dtrain::detail::plan_elastic;
  using V = std::vector<std::string>;
  EXPECT_FALSE(plan_elastic(cluster("ssh", 0, 0), 2).elastic);  // default: a fixed-size job
  EXPECT_FALSE(plan_elastic(cluster("ssh", 2, 2), 2).elastic);  // MIN == MAX: the same
  EXPECT_TRUE(plan_elastic(cluster("ssh", 2, 2), 2).run_args.empty());
  // ssh: the local launcher gets the range (it picks c10d and starts one agent per host).
  auto o = cluster("ssh", 1, 0);
  o.cluster.last_call = 2500ms;
  auto ssh = plan_elastic(o, 3);
  EXPECT_TRUE(ssh.elastic);
  EXPECT_EQ(ssh.min_nodes, 1);
  EXPECT_EQ(ssh.max_nodes, 3);  // 0: every host
  EXPECT_EQ(ssh.run_args, (V{"--nnodes", "1:3", "--rdzv-conf", "last_call_timeout=2.5"}));
  EXPECT_EQ(ssh.srun_nodes, "");
  // slurm: srun -N MAX, and each node's agent joins the c10d rendezvous.
  auto slurm = plan_elastic(cluster("slurm", 2, 4), 1);
  EXPECT_EQ(slurm.srun_nodes, "4");
  EXPECT_EQ(slurm.run_args, (V{"--nnodes", "2:4", "--rdzv-backend", "c10d", "--rdzv-conf",
                               "last_call_timeout=30"}));
  auto nodes = cluster("slurm", 1, 0);
  nodes.cluster.nodes = 3;
  EXPECT_EQ(plan_elastic(nodes, 3).srun_nodes, "3");  // max_nodes 0: `nodes`
  // A heartbeat timeout goes to every agent with the last call.
  o.cluster.heartbeat_timeout = 1500ms;
  EXPECT_EQ(plan_elastic(o, 3).run_args,
            (V{"--nnodes", "1:3", "--rdzv-conf", "last_call_timeout=2.5,heartbeat_timeout=1.5"}));
  o.cluster.heartbeat_timeout = -1ms;
  EXPECT_NE(elastic_error(o, 3).find("ClusterOptions::heartbeat_timeout must be >= 0"),
            std::string::npos);
}

TEST(DistributorElastic, BadRangesAndEnginesAreClearErrors) {
  EXPECT_NE(elastic_error(cluster("ssh", 3, 2), 2).find("min_nodes is more than max_nodes"),
            std::string::npos);
  EXPECT_NE(elastic_error(cluster("ssh", 3, 0), 2).find("(0: the engine's 2 node(s))"),
            std::string::npos);
  EXPECT_NE(elastic_error(cluster("ssh", 0, 2), 2).find("min_nodes must be at least 1"),
            std::string::npos);
  EXPECT_NE(elastic_error(cluster("ssh", -1, 2), 2).find("min_nodes must be at least 1"),
            std::string::npos);
  EXPECT_NE(elastic_error(cluster("slurm", 1, -2), 2).find("max_nodes must be >= min_nodes"),
            std::string::npos);
  EXPECT_NE(elastic_error(cluster("ssh", 1, 3), 2)
                .find("one agent on each of the 2 host(s), so max_nodes must be 2"),
            std::string::npos);
  EXPECT_NE(elastic_error(cluster("mpi", 1, 2), 1).find("engine \"mpi\" cannot run an elastic job"),
            std::string::npos);
  EXPECT_NE(
      elastic_error(cluster("spark", 1, 2), 1).find("engine \"spark\" cannot run an elastic job"),
      std::string::npos);
  auto nodes = cluster("slurm", 1, 4);
  nodes.cluster.nodes = 2;
  EXPECT_NE(elastic_error(nodes, 2).find("max_nodes replaces `nodes`"), std::string::npos);
  auto local = cluster("", 1, 2);
  local.local_mode = true;
  EXPECT_NE(elastic_error(local, 1).find("count the nodes of a cluster job (local_mode = false,"),
            std::string::npos);
  // Through the Distributor itself, before anything starts.
  EXPECT_THROW(dtrain::Distributor{local}, dtrain::UsageError);
  auto mpi = cluster("mpi", 1, 2);
  EXPECT_THROW(dtrain::Distributor{mpi}, dtrain::UsageError);
  auto ssh = cluster("ssh", 1, 3);
  ssh.cluster.hosts = "n1:2,n2:2";
  EXPECT_THROW(dtrain::Distributor{ssh}, dtrain::UsageError);
  ssh.cluster.max_nodes = 2;
  EXPECT_NO_THROW(dtrain::Distributor{ssh});
  auto uneven = cluster("slurm", 1, 3);  // 4 processes on up to 3 nodes
  try {
    dtrain::Distributor d(uneven);
    FAIL() << "4 processes over max_nodes 3";
  } catch (const dtrain::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of ClusterOptions::max_nodes (3)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace

int main(int argc, char** argv) {
  dtrain::init(argc, argv);  // a worker runs its function here and exits
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
