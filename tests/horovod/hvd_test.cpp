// dtrain::hvd end to end: real worker processes through the real launcher (hvd_worker.cpp).
//   - DistributedOptimizer on 2 and 3 ranks ends where DDP ends (float64, 1e-6 relative);
//     backward_passes_per_step = 2 equals DDP with 2-step accumulation; fp16 compression
//     stays close. (Each test is one job running every variant it compares: few processes.)
//   - every collective against values computed in the worker; named tensors submitted in
//     different orders pair correctly; the stall check names the missing ranks and stops.
//   - HorovodRunner(-2) returns rank 0's model, and a failing rank as WorkerError.
//   - `dtrain horovodrun -np 2` gives workers Horovod's variables; bad input exits 2.
//   - `--timeline-filename` writes one valid Chrome trace with Horovod's phases per tensor.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "dtrain/horovod.h"
#include "dtrain/horovod_runner.h"
#include "launcher/subprocess.h"
#include "support/paths.h"

namespace {

using dtrain::test::run_command;
using dtrain::test::RunOptions;
using namespace std::chrono_literals;

std::string temp_file(const std::string& tag) {
  return (std::filesystem::temp_directory_path() /
          ("hvd_" + tag + "_" + std::to_string(::getpid()) + ".pt"))
      .string();
}

std::vector<torch::Tensor> load(const std::string& path) {
  std::vector<torch::Tensor> params;
  if (std::filesystem::exists(path)) torch::load(params, path);
  std::filesystem::remove(path);
  return params;
}

// The parity runs of one job (hvd_worker parity): OUT.<tag> for each tag.
std::map<std::string, std::vector<torch::Tensor>> parity_runs(int nproc, bool extras) {
  auto out = temp_file("parity" + std::to_string(nproc));
  std::vector<std::string> argv{DTRAIN_BIN,     "run",    "--nproc-per-node", std::to_string(nproc),
                                HVD_WORKER_BIN, "parity", "--steps",          "10",
                                "--out",        out};
  if (extras) argv.push_back("--extras");
  auto r = run_command(argv, {.timeout = 120s});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  std::map<std::string, std::vector<torch::Tensor>> runs;
  for (const char* tag : {"ddp1", "hvd1", "ddp2", "hvd2", "fp16"})
    runs[tag] = load(out + "." + tag);
  return runs;
}

// The worst over tensors of max|a - b| / max|b|.
double max_relative_difference(const std::vector<torch::Tensor>& a,
                               const std::vector<torch::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    auto bd = b[i].to(torch::kFloat64);
    auto diff = (a[i].to(torch::kFloat64) - bd).abs().max().item<double>();
    worst = std::max(worst, diff / std::max(bd.abs().max().item<double>(), 1e-12));
  }
  return worst;
}

// 2 ranks: DistributedOptimizer equals DDP; backward_passes_per_step = 2 equals DDP with
// 2-step accumulation (no_sync); fp16 compression stays close (float32 model vs float64 DDP).
TEST(Parity, TwoRanksDistributedOptimizerEqualsDdpAlsoWithTwoBackwardPassesPerStep) {
  auto runs = parity_runs(2, true);
  ASSERT_FALSE(runs["ddp1"].empty());
  ASSERT_FALSE(runs["hvd1"].empty());
  double rel = max_relative_difference(runs["hvd1"], runs["ddp1"]);
  std::printf("hvd vs DDP on 2 ranks: max relative difference %g\n", rel);
  EXPECT_LE(rel, 1e-6);

  ASSERT_FALSE(runs["ddp2"].empty());
  ASSERT_FALSE(runs["hvd2"].empty());
  double rel2 = max_relative_difference(runs["hvd2"], runs["ddp2"]);
  std::printf("backward_passes_per_step=2 vs DDP no_sync accumulation: %g\n", rel2);
  EXPECT_LE(rel2, 1e-6);
  // Accumulation changes the result (the comparison would be vacuous otherwise).
  EXPECT_GT(max_relative_difference(runs["hvd2"], runs["hvd1"]), 1e-3);

  ASSERT_FALSE(runs["fp16"].empty());
  double worst = 0;
  for (size_t i = 0; i < runs["fp16"].size(); ++i) {
    auto b = runs["ddp1"][i].to(torch::kFloat64);
    worst = std::max(worst, (runs["fp16"][i].to(torch::kFloat64) - b).norm().item<double>() /
                                b.norm().item<double>());
  }
  std::printf("fp16 compression (float32 model) vs float64 DDP: norm-relative %g\n", worst);
  EXPECT_LE(worst, 1e-2);
}

TEST(Parity, ThreeRanksDistributedOptimizerEqualsDdp) {
  auto runs = parity_runs(3, false);
  ASSERT_FALSE(runs["ddp1"].empty());
  ASSERT_FALSE(runs["hvd1"].empty());
  double rel = max_relative_difference(runs["hvd1"], runs["ddp1"]);
  std::printf("hvd vs DDP on 3 ranks: max relative difference %g\n", rel);
  EXPECT_LE(rel, 1e-6);
}

dtrain::test::RunResult run_worker(int nproc, const std::string& mode,
                                   std::vector<std::string> env = {}) {
  return run_command(
      {DTRAIN_BIN, "run", "--nproc-per-node", std::to_string(nproc), HVD_WORKER_BIN, mode},
      {.env = std::move(env), .timeout = 120s});
}

// Every collective on 3 ranks; then 20 named tensors submitted in opposite orders by odd and
// even ranks pair by name (in one negotiation, fused), and again with fusion off.
TEST(Collectives, EveryOperationAndNameMatchingOnThreeRanks) {
  auto r = run_worker(3, "collectives");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int k = 0; k < 3; ++k) {
    EXPECT_NE(r.out.find("rank " + std::to_string(k) + ": collectives OK"), std::string::npos)
        << r.out;
    size_t first = r.out.find("rank " + std::to_string(k) + ": order OK");
    EXPECT_NE(first, std::string::npos) << r.out;
    EXPECT_NE(r.out.find("rank " + std::to_string(k) + ": order OK", first + 1), std::string::npos)
        << r.out;
  }
  // Adasum on 3 ranks: Horovod's power-of-2 limit, as a UsageError.
  EXPECT_NE(r.out.find("op Adasum runs on a power-of-2 number of ranks only"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("mismatched allreduce 'mismatch'"), std::string::npos) << r.out;
}

// Adasum (alone, in place with a postscale, fused in a group; a zero tensor on odd ranks)
// equals the formula computed on one process from every rank's tensors, on 2 and 4 ranks.
TEST(Adasum, MatchesTheFormulaOnTwoAndFourRanks) {
  for (int n : {2, 4}) {
    auto r = run_worker(n, "adasum");
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    for (int k = 0; k < n; ++k) {
      EXPECT_NE(r.out.find("rank " + std::to_string(k) + ": adasum OK on " + std::to_string(n) +
                           " ranks"),
                std::string::npos)
          << r.out;
    }
  }
}

TEST(Stall, WarningNamesTheMissingRanksAndShutdownStopsTheJob) {
  auto r = run_worker(
      2, "stall", {"HOROVOD_STALL_CHECK_TIME_SECONDS=1", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=3"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  // Horovod's wording; rank 0 reports, naming each missing rank and what it lacks.
  EXPECT_NE(r.err.find("One or more tensors were submitted to be reduced, gathered or broadcasted "
                       "by subset of ranks"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("Missing ranks:"), std::string::npos) << r.err;
  // The warnings first (checked once a second), then the shutdown, which marks the ranks
  // stalled for longer than its time with "!", as Horovod's StallInspector does.
  EXPECT_NE(r.err.find("1: [lonely.tensor]"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("0: [barrier.noname.0]"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("stall shutdown"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("1!: [lonely.tensor]"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("One or more rank (marked by \"!\") is stalled for longer than 3 seconds. "
                       "Will shutdown."),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.out.find("rank 0: stopped:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 1: stopped:"), std::string::npos) << r.out;
  EXPECT_LT(r.elapsed, 30);
}

// HorovodRunner(-2) returns rank 0's model - equal to one process trained on both ranks'
// rows - and a rank that throws comes back as WorkerError naming it.
TEST(HorovodRunner, LocalModeReturnsRankZerosModelAndAFailingRankIsAWorkerError) {
  auto r = run_command({HVD_WORKER_BIN, "runner", "--steps", "5"}, {.timeout = 120s});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("HorovodRunner returned rank 0's model"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("WorkerError rank=1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 1 gives up"), std::string::npos) << r.out;
}

TEST(Api, BadInputBeforeAnyProcessStartsIsAUsageError) {
  EXPECT_THROW(dtrain::hvd::HorovodRunner(0), dtrain::UsageError);
  try {
    dtrain::hvd::HorovodRunner hr(4);
    FAIL() << "np > 0 without a cluster engine did not throw";
  } catch (const dtrain::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("cluster.engine"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(dtrain::hvd::is_initialized());
  EXPECT_THROW(dtrain::hvd::rank(), dtrain::UsageError);
  EXPECT_THROW(dtrain::hvd::allreduce(torch::ones({2})), dtrain::UsageError);
  torch::nn::Linear lin(2, 2);
  torch::optim::SGD sgd(lin->parameters(), 0.1);
  EXPECT_THROW(dtrain::hvd::DistributedOptimizer(sgd, lin->named_parameters()), dtrain::UsageError);
}

// Started without any launcher, hvd::init() runs as one process (size 1, rank 0), as Horovod's
// hvd.init() does without horovodrun; it used to throw UsageError.
TEST(Api, InitWithoutALauncherIsOneProcess) {
  RunOptions o;
  o.unset = {"RANK",
             "WORLD_SIZE",
             "LOCAL_RANK",
             "LOCAL_WORLD_SIZE",
             "GROUP_RANK",
             "GROUP_WORLD_SIZE",
             "MASTER_ADDR",
             "MASTER_PORT",
             "HOROVOD_RANK",
             "HOROVOD_SIZE",
             "HOROVOD_LOCAL_RANK",
             "HOROVOD_LOCAL_SIZE",
             "SLURM_PROCID",
             "OMPI_COMM_WORLD_RANK",
             "PMI_RANK"};
  o.timeout = 60s;
  auto r = run_command({HVD_WORKER_BIN, "env"}, o);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("hvd rank=0 size=1 local_rank=0 local_size=1 cross_rank=0 cross_size=1"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("allreduce_sum=1.000000"), std::string::npos) << r.out;
  // Horovod's variables without a launcher's are a job half set up: an error, not size 1.
  o.env = {"HOROVOD_SIZE=2"};
  r = run_command({HVD_WORKER_BIN, "env"}, o);
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.err.find("RANK and WORLD_SIZE are not set"), std::string::npos) << r.err;
}

TEST(Horovodrun, RunsAProgramWithHorovodsVariablesAndRejectsBadInput) {
  auto r = run_command({DTRAIN_BIN, "horovodrun", "-np", "2", "--fusion-threshold-mb", "1",
                        "--cycle-time-ms", "2", "--gloo", HVD_WORKER_BIN, "env"},
                       {.timeout = 120s});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int k = 0; k < 2; ++k) {
    std::string want = "hvd rank=" + std::to_string(k) + " size=2 local_rank=" + std::to_string(k) +
                       " local_size=2 cross_rank=0 cross_size=1 HOROVOD_RANK=" + std::to_string(k) +
                       " HOROVOD_SIZE=2 HOROVOD_LOCAL_RANK=" + std::to_string(k) +
                       " HOROVOD_LOCAL_SIZE=2 HOROVOD_CROSS_RANK=0 HOROVOD_CROSS_SIZE=1 "
                       "HOROVOD_FUSION_THRESHOLD=1048576 "
                       "HOROVOD_CYCLE_TIME=2 allreduce_sum=3.000000";
    EXPECT_NE(r.out.find(want), std::string::npos) << "missing: " << want << "\n" << r.out;
  }
  // Bad input: exit code 2 and a message saying what is wrong.
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  };
  std::vector<Case> cases = {
      {{HVD_WORKER_BIN, "env"}, "-np N is required"},
      {{"-np", "0", HVD_WORKER_BIN}, "-np: got '0', expected a positive integer"},
      {{"-np", "2"}, "missing PROGRAM"},
      {{"-np", "2", "--mpi", HVD_WORKER_BIN},
       "--mpi: dtrain horovodrun runs on dtrain's own launcher"},
      {{"-np", "4", "-H", "localhost:2", HVD_WORKER_BIN}, "the hosts offer only 2 slot(s)"},
      {{"-np", "2", "--bogus", HVD_WORKER_BIN}, "unknown option '--bogus'"},
      {{"-np", "2", "/nonexistent/program"}, "/nonexistent/program"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> argv{DTRAIN_BIN, "horovodrun"};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    auto r = run_command(argv, {.timeout = 30s});
    EXPECT_EQ(r.exit_code, 2) << c.expect << "\n" << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << r.err;
  }
}

}  // namespace

namespace {

// One top-level span of a tensor's row: its name, the activities inside it in order, the
// ranks marked inside it (negotiation), and the args of its end.
struct TopSpan {
  std::string name;
  std::vector<std::string> activities;
  std::set<std::string> ranks;
  nlohmann::json end_args;
};

// A collective's activity is named by the one transport that ran it, as Horovod's are
// (NCCL_ALLREDUCE, MPI_BCAST): never a group's per-device description ("CPU:SHM,CUDA:...").
bool transport_activity(const std::string& name, const std::string& op) {
  for (const char* t : {"SHM_", "GLOO_", "NCCL_"})
    if (name == t + op) return true;
  return false;
}

// horovodrun -np 2 --timeline-filename F: a valid trace, one row (pid) per tensor name, and on
// every row Horovod's phases well nested and in order: NEGOTIATE_ALLREDUCE (each rank marked
// the first time: the full negotiation), then ALLREDUCE holding QUEUE, MEMCPY_IN_FUSION_BUFFER,
// the collective, MEMCPY_OUT_FUSION_BUFFER (the memcpys when fused), for every step.
TEST(HvdTimeline, TwoRanksWriteOneTraceWithHorovodsPhasesPerTensorInOrder) {
  const auto file = (std::filesystem::temp_directory_path() /
                     ("hvd_timeline_" + std::to_string(::getpid()) + ".json"))
                        .string();
  const int steps = 3;
  auto r = run_command({DTRAIN_BIN, "horovodrun", "-np", "2", "--timeline-filename", file,
                        HVD_WORKER_BIN, "timeline", "--steps", std::to_string(steps)},
                       {.timeout = 120s});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  ASSERT_TRUE(std::filesystem::exists(file)) << r.out << r.err;
  nlohmann::json trace;
  {
    std::ifstream in(file);
    ASSERT_NO_THROW(trace = nlohmann::json::parse(in)) << "the timeline is not valid JSON";
  }
  std::filesystem::remove(file);
  ASSERT_TRUE(trace.is_array());

  std::map<int, std::string> names;                 // pid -> tensor name
  std::map<int, std::vector<nlohmann::json>> rows;  // pid -> its events in file order
  for (const auto& e : trace) {
    const int pid = e.at("pid").get<int>();
    if (e.at("ph") == "M") {
      if (e.at("name") == "process_name" && pid > 0)
        names[pid] = e.at("args").at("name").get<std::string>();
      continue;
    }
    rows[pid].push_back(e);
  }
  std::map<std::string, std::vector<TopSpan>> spans;  // tensor name -> its top-level spans
  for (const auto& [pid, events] : rows) {
    ASSERT_TRUE(names.count(pid)) << "events on pid " << pid << " without a process_name";
    const std::string& tensor = names[pid];
    std::vector<std::string> open;
    int64_t last_ts = -1;
    auto& list = spans[tensor];
    for (const auto& e : events) {
      const std::string ph = e.at("ph");
      const int64_t ts = e.at("ts").get<int64_t>();
      EXPECT_GE(ts, last_ts) << tensor << ": time goes backwards";
      last_ts = ts;
      if (ph == "B") {
        const std::string name = e.at("name");
        if (open.empty()) {
          list.push_back({name, {}, {}, {}});
        } else {
          ASSERT_EQ(open.size(), 1u) << tensor << ": " << name << " nested deeper than an activity";
          list.back().activities.push_back(name);
        }
        open.push_back(name);
      } else if (ph == "E") {
        ASSERT_FALSE(open.empty()) << tensor << ": an end without a begin";
        if (open.size() == 1 && e.contains("args")) list.back().end_args = e.at("args");
        open.pop_back();
      } else if (ph == "X") {
        ASSERT_EQ(open.size(), 1u) << tensor << ": a rank mark outside a negotiation";
        ASSERT_TRUE(open.back().rfind("NEGOTIATE_", 0) == 0)
            << tensor << ": a rank mark inside " << open.back();
        list.back().ranks.insert(e.at("name").get<std::string>());
      }
    }
    EXPECT_TRUE(open.empty()) << tensor << ": " << open.size() << " span(s) never ended";
  }

  const std::vector<std::string> params = {"0.weight", "0.bias",   "2.weight",
                                           "2.bias",   "4.weight", "4.bias"};
  int fused = 0;
  for (const auto& p : params) {
    const std::string tensor = "DistributedOptimizer.allreduce." + p;
    ASSERT_TRUE(spans.count(tensor)) << "no row for " << tensor;
    const auto& list = spans[tensor];
    ASSERT_EQ(list.size(), 2u * steps)
        << tensor << ": want NEGOTIATE_ALLREDUCE, ALLREDUCE per step";
    for (size_t k = 0; k < list.size(); k += 2) {
      EXPECT_EQ(list[k].name, "NEGOTIATE_ALLREDUCE") << tensor;
      EXPECT_EQ(list[k + 1].name, "ALLREDUCE") << tensor;
      const auto& a = list[k + 1].activities;
      ASSERT_FALSE(a.empty()) << tensor;
      EXPECT_EQ(a.front(), "QUEUE") << tensor;
      if (a.size() == 2) {
        EXPECT_TRUE(transport_activity(a[1], "ALLREDUCE")) << tensor << ": " << a[1];
      } else {
        ASSERT_EQ(a.size(), 4u) << tensor;
        EXPECT_EQ(a[1], "MEMCPY_IN_FUSION_BUFFER") << tensor;
        EXPECT_TRUE(transport_activity(a[2], "ALLREDUCE")) << tensor << ": " << a[2];
        EXPECT_EQ(a[3], "MEMCPY_OUT_FUSION_BUFFER") << tensor;
        ++fused;
      }
      EXPECT_EQ(list[k + 1].end_args.value("dtype", ""), "Double") << tensor;
    }
    // The first step is negotiated in full: every rank's request is marked.
    EXPECT_EQ(list[0].ranks, (std::set<std::string>{"0", "1"})) << tensor;
    // Later steps are agreed through the response cache: no per-rank marks (as Horovod's).
    int cached = 0;
    for (size_t k = 2; k < list.size(); k += 2) cached += list[k].ranks.empty() ? 1 : 0;
    EXPECT_GE(cached, 1) << tensor << ": no later step was agreed through the response cache";
  }
  EXPECT_GT(fused, 0) << "no gradient was reduced in a fused buffer";
  EXPECT_EQ(spans["DistributedOptimizer.allreduce.0.weight"][1].end_args.value("shape", ""),
            "[512, 784]");
  for (const auto& p : params) {
    const auto& list = spans["broadcast_parameters." + p];
    ASSERT_EQ(list.size(), 2u) << p;
    EXPECT_EQ(list[0].name, "NEGOTIATE_BROADCAST");
    EXPECT_EQ(list[1].name, "BROADCAST");
    ASSERT_EQ(list[1].activities.size(), 2u);
    EXPECT_EQ(list[1].activities[0], "QUEUE");
    EXPECT_TRUE(transport_activity(list[1].activities[1], "BCAST")) << list[1].activities[1];
  }

  // A directory that does not exist is refused before any worker starts.
  auto bad = run_command({DTRAIN_BIN, "horovodrun", "-np", "2", "--timeline-filename",
                          "/nonexistent/dir/t.json", HVD_WORKER_BIN, "timeline"},
                         {.timeout = 30s});
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_NE(bad.err.find("/nonexistent/dir does not exist"), std::string::npos) << bad.err;
}

}  // namespace
