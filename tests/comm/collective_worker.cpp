// A worker for the multi-process collective tests (tests/comm/collectives_mp_test.cpp).
//
//   collective_worker --mode all [--init URL --rank R --world-size N]
//     Joins the group (env:// under `dtrain run`, else URL), runs every collective with
//     every reduce op in its sync and async forms plus the object forms and send/recv,
//     checks each result against the value computed locally from every rank's input, and
//     prints "collective_worker rank R of N: all K checks passed". Exit 1 on any mismatch,
//     after printing what mismatched.
//
//   collective_worker --mode die --init URL --rank R --world-size N [--timeout-ms T] [--die-rank D]
//     Joins, passes a barrier, then rank D SIGKILLs itself just before an all_reduce that
//     the others enter with timeout T (default 3000). The survivors print
//     "collective_worker rank R: <ErrorType> after <ms> ms: <message>" and exit 3; exit 4 if
//     the all_reduce succeeded.
//
//   --backend auto|shm|gloo (default auto) picks init_process_group's backend; every mode
//   prints "collective_worker rank R: backend B" first.
//
//   collective_worker --mode stall ... (same flags)
//     As die, but rank D stays alive and connected without calling the all_reduce (it
//     sleeps 60 s): the others must time out, and exit at once although Gloo's thread is
//     still blocked in the collective.
#include <torch/torch.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/collectives.h"
#include "dtrain/error.h"
#include "support/reference_reduce.h"

namespace {

using dtrain::ReduceOp;

struct Args {
  std::string mode = "all";
  std::string init = "env://";
  int rank = -1;
  int world_size = -1;
  int timeout_ms = 3000;
  int die_rank = 1;
  std::string backend = "auto";
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "collective_worker: %s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--mode")
      a.mode = value();
    else if (k == "--init")
      a.init = value();
    else if (k == "--backend")
      a.backend = value();
    else if (k == "--rank")
      a.rank = std::stoi(value());
    else if (k == "--world-size")
      a.world_size = std::stoi(value());
    else if (k == "--timeout-ms")
      a.timeout_ms = std::stoi(value());
    else if (k == "--die-rank")
      a.die_rank = std::stoi(value());
    else {
      std::fprintf(stderr, "collective_worker: unknown argument %s\n", k.c_str());
      std::exit(2);
    }
  }
  return a;
}

int g_rank = -1;
int g_checks = 0;
int g_failures = 0;

void check(bool ok, const std::string& what, const torch::Tensor& got = {},
           const torch::Tensor& want = {}) {
  ++g_checks;
  if (ok) return;
  ++g_failures;
  std::string detail;
  if (got.defined()) {
    std::ostringstream os;
    os << " got " << got.flatten() << " want " << want.flatten();
    detail = os.str();
  }
  std::fprintf(stderr, "collective_worker rank %d: MISMATCH %s%s\n", g_rank, what.c_str(),
               detail.c_str());
}

bool same(const torch::Tensor& got, const torch::Tensor& want) {
  if (got.scalar_type() != want.scalar_type() || got.sizes() != want.sizes()) return false;
  if (at::isFloatingType(want.scalar_type()))
    return torch::allclose(got.to(torch::kFloat64), want.to(torch::kFloat64), 1e-4, 1e-4);
  return torch::equal(got, want);
}

void check_tensor(const torch::Tensor& got, const torch::Tensor& want, const std::string& what) {
  check(same(got, want), what, got, want);
}

const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kProduct:
      return "product";
  }
  return "?";
}

torch::Tensor input(int rank, int64_t n, torch::Dtype dtype) {
  return dtrain::test::reference_input(rank, {n}, dtype);
}
torch::Tensor expected(ReduceOp op, int world, int64_t n, torch::Dtype dtype) {
  return dtrain::test::reference_reduce(op, world, {n}, dtype);
}

int run_all(const std::shared_ptr<dtrain::ProcessGroup>& g) {
  const int rank = g->rank();
  const int world = g->world_size();
  const std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax,
                                     ReduceOp::kProduct};
  const int64_t n = 10;
  for (auto dtype : {torch::kFloat32, torch::kInt64}) {
    for (auto op : ops) {
      if (op == ReduceOp::kAvg && dtype == torch::kInt64) continue;
      std::string tag = std::string(op_name(op)) + " " + c10::toString(dtype);
      auto want = expected(op, world, n, dtype);
      // all_reduce, sync and async.
      dtrain::AllReduceOptions ao;
      ao.op = op;
      auto t = input(rank, n, dtype);
      dtrain::all_reduce(t, ao);
      check_tensor(t, want, "all_reduce " + tag);
      auto a = input(rank, n, dtype);
      auto w = dtrain::all_reduce_async(a, ao);
      w.wait();
      check_tensor(a, want, "all_reduce_async " + tag);
      // reduce to every dst, sync and async.
      for (int dst = 0; dst < world; ++dst) {
        dtrain::ReduceOptions ro;
        ro.op = op;
        ro.dst = dst;
        auto r1 = input(rank, n, dtype);
        dtrain::reduce(r1, ro);
        if (rank == dst) check_tensor(r1, want, "reduce " + tag + " dst " + std::to_string(dst));
        auto r2 = input(rank, n, dtype);
        dtrain::reduce_async(r2, ro).wait();
        if (rank == dst)
          check_tensor(r2, want, "reduce_async " + tag + " dst " + std::to_string(dst));
      }
      // reduce_scatter: rank r gets chunk r of the reduction.
      dtrain::ReduceScatterOptions rso;
      rso.op = op;
      auto full_want = expected(op, world, 2 * world, dtype);
      auto out = torch::zeros({2}, dtype);
      dtrain::reduce_scatter(out, input(rank, 2 * world, dtype), rso);
      check_tensor(out, full_want.slice(0, 2 * rank, 2 * rank + 2), "reduce_scatter " + tag);
    }
  }
  // broadcast from every src, sync and async.
  for (int src = 0; src < world; ++src) {
    dtrain::BroadcastOptions bo;
    bo.src = src;
    auto b = torch::full({7}, 10.0 * rank, torch::kFloat64);
    dtrain::broadcast(b, bo);
    check_tensor(b, torch::full({7}, 10.0 * src, torch::kFloat64),
                 "broadcast src " + std::to_string(src));
    auto c = torch::full({3}, rank, torch::kInt32);
    dtrain::broadcast_async(c, bo).wait();
    check_tensor(c, torch::full({3}, src, torch::kInt32),
                 "broadcast_async src " + std::to_string(src));
  }
  auto mine = [](int r) { return torch::arange(4, torch::kFloat32) + 100 * r; };
  // all_gather, gather, scatter.
  auto all = dtrain::all_gather(mine(rank));
  check(static_cast<int>(all.size()) == world,
        "all_gather returned " + std::to_string(all.size()) + " tensors");
  for (int r = 0; r < world && r < static_cast<int>(all.size()); ++r)
    check_tensor(all[r], mine(r), "all_gather[" + std::to_string(r) + "]");
  for (int dst = 0; dst < world; ++dst) {
    dtrain::GatherOptions go;
    go.dst = dst;
    auto got = dtrain::gather(mine(rank), go);
    if (rank == dst) {
      check(static_cast<int>(got.size()) == world, "gather size on dst");
      for (int r = 0; r < world && r < static_cast<int>(got.size()); ++r)
        check_tensor(got[r], mine(r), "gather dst " + std::to_string(dst));
    } else {
      check(got.empty(), "gather returned tensors on a non-dst rank");
    }
  }
  for (int src = 0; src < world; ++src) {
    dtrain::ScatterOptions so;
    so.src = src;
    std::vector<torch::Tensor> chunks;
    if (rank == src)
      for (int j = 0; j < world; ++j)
        chunks.push_back(torch::full({2}, 10 * src + j, torch::kInt64));
    auto out = torch::zeros({2}, torch::kInt64);
    dtrain::scatter(out, chunks, so);
    check_tensor(out, torch::full({2}, 10 * src + rank, torch::kInt64),
                 "scatter src " + std::to_string(src));
  }
  // all_to_all.
  auto in = torch::empty({world}, torch::kInt64);
  for (int j = 0; j < world; ++j) in[j] = 10 * rank + j;
  auto a2a = torch::zeros({world}, torch::kInt64);
  dtrain::all_to_all(a2a, in);
  auto a2a_want = torch::empty({world}, torch::kInt64);
  for (int j = 0; j < world; ++j) a2a_want[j] = 10 * j + rank;
  check_tensor(a2a, a2a_want, "all_to_all");
  // send/recv in a ring, sync and async.
  if (world > 1) {
    const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
    dtrain::PointToPointOptions po;
    po.tag = 7;
    auto s = dtrain::send_async(torch::full({5}, rank + 0.5), next, po);
    auto got = torch::zeros({5});
    dtrain::recv(got, prev, po);
    s.wait();
    check_tensor(got, torch::full({5}, prev + 0.5), "recv from " + std::to_string(prev));
    auto got2 = torch::zeros({5});
    auto r2 = dtrain::recv_async(got2, next, po);
    dtrain::send(torch::full({5}, rank + 0.25), prev, po);
    r2.wait();
    check_tensor(got2, torch::full({5}, next + 0.25), "recv_async from " + std::to_string(next));
  }
  // Objects.
  auto text = [](int r) {
    return "rank " + std::to_string(r) + std::string(static_cast<size_t>(r) * 5, '#');
  };
  for (int src = 0; src < world; ++src) {
    dtrain::BroadcastOptions bo;
    bo.src = src;
    auto s = dtrain::broadcast_object(text(rank), bo);
    check(s == text(src), "broadcast_object src " + std::to_string(src) + " got '" + s + "'");
    auto v = dtrain::broadcast_object<double>(rank * 1.25, bo);
    check(v == src * 1.25, "broadcast_object<double> src " + std::to_string(src));
  }
  auto strings = dtrain::all_gather_object(text(rank));
  check(static_cast<int>(strings.size()) == world, "all_gather_object size");
  for (int r = 0; r < world && r < static_cast<int>(strings.size()); ++r) {
    check(strings[r] == text(r),
          "all_gather_object[" + std::to_string(r) + "] = '" + strings[r] + "'");
  }
  auto ints = dtrain::all_gather_object<int64_t>(int64_t{1} << (40 + rank));
  for (int r = 0; r < world && r < static_cast<int>(ints.size()); ++r) {
    check(ints[r] == (int64_t{1} << (40 + r)),
          "all_gather_object<int64_t>[" + std::to_string(r) + "]");
  }
  dtrain::barrier();
  if (g_failures > 0) {
    std::fprintf(stderr, "collective_worker rank %d of %d: %d of %d checks FAILED\n", rank, world,
                 g_failures, g_checks);
    return 1;
  }
  std::printf("collective_worker rank %d of %d: all %d checks passed\n", rank, world, g_checks);
  return 0;
}

int run_die(const std::shared_ptr<dtrain::ProcessGroup>& g, const Args& args) {
  dtrain::barrier();  // everyone connected: the death happens mid-job, not during set-up
  if (g->rank() == args.die_rank) {
    if (args.mode == "stall") {
      std::printf("collective_worker rank %d: stalling instead of calling all_reduce\n", g->rank());
      std::fflush(stdout);
      std::this_thread::sleep_for(std::chrono::seconds(60));
      return 0;
    }
    std::printf("collective_worker rank %d: SIGKILLing myself before all_reduce\n", g->rank());
    std::fflush(stdout);
    std::raise(SIGKILL);
  }
  dtrain::AllReduceOptions o;
  o.timeout = std::chrono::milliseconds(args.timeout_ms);
  auto t = torch::ones({1 << 16});
  auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                 t0)
        .count();
  };
  try {
    dtrain::all_reduce(t, o);
  } catch (const dtrain::TimeoutError& e) {
    std::printf("collective_worker rank %d: TimeoutError after %lld ms: %s\n", g->rank(),
                static_cast<long long>(elapsed()), e.what());
    return 3;
  } catch (const dtrain::NetworkError& e) {
    std::printf("collective_worker rank %d: NetworkError after %lld ms: %s\n", g->rank(),
                static_cast<long long>(elapsed()), e.what());
    return 3;
  } catch (const dtrain::Error& e) {
    std::printf("collective_worker rank %d: Error after %lld ms: %s\n", g->rank(),
                static_cast<long long>(elapsed()), e.what());
    return 3;
  }
  std::printf("collective_worker rank %d: all_reduce succeeded although rank %d died\n", g->rank(),
              args.die_rank);
  return 4;
}

}  // namespace

int main(int argc, char** argv) {
  Args args = parse(argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    dtrain::ProcessGroupOptions po;
    po.init_method = args.init;
    po.backend = args.backend;
    po.rank = args.rank;
    po.world_size = args.world_size;
    po.timeout = std::chrono::seconds(30);
    auto g = dtrain::init_process_group(po);
    g_rank = g->rank();
    std::printf("collective_worker rank %d: backend %s\n", g->rank(), g->backend_name().c_str());
    int rc;
    if (args.mode == "all") {
      rc = run_all(g);
    } else if (args.mode == "die" || args.mode == "stall") {
      rc = run_die(g, args);
    } else {
      std::fprintf(stderr, "collective_worker: unknown --mode %s (all, die, stall)\n",
                   args.mode.c_str());
      return 2;
    }
    std::fflush(stdout);
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "collective_worker rank %d: %s\n", g_rank, e.what());
    return 1;
  }
}
