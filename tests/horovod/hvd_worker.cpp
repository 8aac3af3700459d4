// A program written against dtrain::hvd, for the horovod tests. Modes:
//   hvd_worker train --opt hvd|ddp [--bpps K] [--steps S] [--batch B] [--fp16] --out FILE
//       the seed's MLP (784-512-256-10, float64, Adam) on deterministic data: rank r reads rows
//       [(s*K + m)*W*B + r*B, +B) for micro-step m of step s; saves rank 0's parameters.
//       ddp: dtrain DDP with K-step accumulation (no_sync); hvd: DistributedOptimizer.
//   hvd_worker parity [--extras] --out PREFIX   the runs a parity check compares, in one job
//   hvd_worker collectives    every hvd collective against values computed here, then named
//                             tensors submitted in opposite orders (fused, then fusion off);
//                             exits 1 on the first mismatch, naming it
//   hvd_worker stall          rank 0 submits a tensor rank 1 never does (stall check)
//   hvd_worker env            prints hvd's view of the job and Horovod's variables
//   hvd_worker adasum         op Adasum (alone, in place with a postscale, fused in a group)
//                             against the formula computed here from every rank's tensors
//   hvd_worker timeline       broadcast_parameters and a few DistributedOptimizer steps (run
//                             under horovodrun --timeline-filename: the test reads the trace)
//   hvd_worker runner         HorovodRunner(-2).run(train) against one process's training,
//                             then a HorovodRunner whose rank 1 throws (WorkerError)
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "dtrain/dtrain.h"
#include "dtrain/horovod.h"
#include "dtrain/horovod_runner.h"

namespace hvd = dtrain::hvd;

namespace {

#define CHECK_CLOSE(what, got, want)                                            \
  do {                                                                          \
    auto g_ = (got).to(torch::kFloat64);                                        \
    auto w_ = (want).to(torch::kFloat64);                                       \
    if (g_.sizes() != w_.sizes() || !torch::allclose(g_, w_, 1e-6, 1e-6)) {     \
      std::fprintf(stderr, "rank %d: %s: got %s, want %s\n", hvd::rank(), what, \
                   c10::str(g_).c_str(), c10::str(w_).c_str());                 \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)

torch::nn::Sequential make_mlp() {
  using namespace torch::nn;
  return Sequential(Linear(784, 512), ReLU(), Linear(512, 256), ReLU(), Linear(256, 10));
}

// Trains on this process's rows; rank 0's parameters are returned (every rank returns its own).
std::vector<torch::Tensor> train_hvd(int steps, int batch, int bpps, bool fp16) {
  hvd::init();
  const int w = hvd::size(), r = hvd::rank();
  torch::manual_seed(1234);
  auto model = make_mlp();
  const int64_t global = static_cast<int64_t>(w) * batch;
  auto x_all = torch::randn({steps * bpps * global, 784});
  auto y_all = torch::randint(0, 10, {steps * bpps * global}, torch::kLong);
  if (!fp16) {
    model->to(torch::kFloat64);
    x_all = x_all.to(torch::kFloat64);
  }
  // Different seeds per rank before the broadcast: the broadcast must make them equal.
  if (r != 0) {
    torch::NoGradGuard g;
    for (auto& p : model->parameters()) p.add_(0.1);
  }
  hvd::broadcast_parameters(model->named_parameters(), 0);
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
  hvd::DistributedOptimizerOptions o;
  o.backward_passes_per_step = bpps;
  if (fp16) o.compression = hvd::Compression::fp16;
  hvd::DistributedOptimizer opt(adam, model->named_parameters(), o);
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    for (int m = 0; m < bpps; ++m) {
      int64_t start =
          (static_cast<int64_t>(s) * bpps + m) * global + static_cast<int64_t>(r) * batch;
      torch::nn::functional::cross_entropy(model->forward(x_all.narrow(0, start, batch)),
                                           y_all.narrow(0, start, batch))
          .backward();
    }
    opt.step();
  }
  std::vector<torch::Tensor> params;
  for (auto& p : model->parameters()) params.push_back(p.detach().clone());
  return params;
}

std::vector<torch::Tensor> train_ddp(int steps, int batch, int bpps) {
  // One default group for every DDP run of this process (hvd makes its own groups).
  std::shared_ptr<dtrain::ProcessGroup> pg;
  try {
    pg = dtrain::default_group();
  } catch (const dtrain::UsageError&) {
    pg = dtrain::init_process_group();
  }
  const int w = pg->world_size(), r = pg->rank();
  torch::manual_seed(1234);
  auto model = make_mlp();
  const int64_t global = static_cast<int64_t>(w) * batch;
  auto x_all = torch::randn({steps * bpps * global, 784}).to(torch::kFloat64);
  auto y_all = torch::randint(0, 10, {steps * bpps * global}, torch::kLong);
  model->to(torch::kFloat64);
  dtrain::DistributedDataParallel ddp(model);
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
  for (int s = 0; s < steps; ++s) {
    adam.zero_grad();
    for (int m = 0; m < bpps; ++m) {
      int64_t start =
          (static_cast<int64_t>(s) * bpps + m) * global + static_cast<int64_t>(r) * batch;
      auto step = [&] {
        torch::nn::functional::cross_entropy(ddp(x_all.narrow(0, start, batch)),
                                             y_all.narrow(0, start, batch))
            .backward();
      };
      if (m + 1 < bpps) {
        auto guard = ddp.no_sync();
        step();
      } else {
        step();
      }
    }
    adam.step();
  }
  std::vector<torch::Tensor> params;
  for (auto& p : model->parameters()) params.push_back(p.detach().clone());
  return params;
}

void collectives() {
  hvd::init();
  const int n = hvd::size(), r = hvd::rank();
  auto t = torch::arange(6, torch::kFloat64).reshape({2, 3}) + r;  // rank r holds base + r
  auto base = torch::arange(6, torch::kFloat64).reshape({2, 3});
  const double rsum = n * (n - 1) / 2.0;
  // allreduce, every op
  CHECK_CLOSE("allreduce Sum", hvd::allreduce(t, {.op = hvd::Sum}), base * n + rsum);
  CHECK_CLOSE("allreduce Average", hvd::allreduce(t), base + rsum / n);
  CHECK_CLOSE("allreduce Min", hvd::allreduce(t, {.op = hvd::Min}), base);
  CHECK_CLOSE("allreduce Max", hvd::allreduce(t, {.op = hvd::Max}), base + (n - 1));
  auto prod = torch::ones_like(base);
  for (int k = 0; k < n; ++k) prod = prod * (base + k);
  CHECK_CLOSE("allreduce Product", hvd::allreduce(t, {.op = hvd::Product}), prod);
  CHECK_CLOSE("allreduce pre/postscale",
              hvd::allreduce(t, {.op = hvd::Sum, .prescale_factor = 2.0, .postscale_factor = 0.25}),
              (base * n + rsum) * 0.5);
  auto f32 = t.to(torch::kFloat32);
  CHECK_CLOSE("allreduce fp16 compression",
              hvd::allreduce(f32, {.compression = hvd::Compression::fp16}), base + rsum / n);
  if (hvd::allreduce(f32, {.compression = hvd::Compression::fp16}).scalar_type() !=
      torch::kFloat32) {
    std::fprintf(stderr, "fp16 compression changed the result's dtype\n");
    std::exit(1);
  }
  auto ints = torch::full({4}, r + 1, torch::kInt64);
  CHECK_CLOSE("allreduce Sum int64", hvd::allreduce(ints, {.op = hvd::Sum}),
              torch::full({4}, n * (n + 1) / 2));
  // in place, async, poll
  auto inplace = t.clone();
  hvd::allreduce_(inplace, {.op = hvd::Sum, .name = "inplace"});
  CHECK_CLOSE("allreduce_ in place", inplace, base * n + rsum);
  auto a2 = t.clone();
  auto h = hvd::allreduce_async_(a2, {.op = hvd::Max, .name = "async"});
  while (!hvd::poll(h)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  hvd::synchronize(h);
  CHECK_CLOSE("allreduce_async_ + poll", a2, base + (n - 1));
  // grouped
  auto grouped = hvd::grouped_allreduce({t, t * 2, torch::full({1}, 1.0 * r, torch::kFloat64)},
                                        {.op = hvd::Sum});
  CHECK_CLOSE("grouped_allreduce 0", grouped[0], base * n + rsum);
  CHECK_CLOSE("grouped_allreduce 1", grouped[1], (base * n + rsum) * 2);
  CHECK_CLOSE("grouped_allreduce 2", grouped[2], torch::full({1}, rsum, torch::kFloat64));
  // allgather with rank r contributing r+1 rows of value r
  auto rows = torch::full({r + 1, 2}, static_cast<double>(r), torch::kFloat64);
  std::vector<torch::Tensor> want_rows;
  for (int k = 0; k < n; ++k)
    want_rows.push_back(torch::full({k + 1, 2}, static_cast<double>(k), torch::kFloat64));
  CHECK_CLOSE("allgather (different first dims)", hvd::allgather(rows), torch::cat(want_rows));
  // broadcast
  CHECK_CLOSE("broadcast from 1", hvd::broadcast(t, 1), base + 1);
  auto b = t.clone();
  hvd::broadcast_(b, n - 1, "bcast_inplace");
  CHECK_CLOSE("broadcast_ from last", b, base + (n - 1));
  // alltoall: rank r sends j+1 rows of value 100*r + j to rank j
  std::vector<int64_t> splits;
  std::vector<torch::Tensor> send;
  for (int j = 0; j < n; ++j) {
    splits.push_back(j + 1);
    send.push_back(torch::full({j + 1, 3}, 100.0 * r + j, torch::kFloat64));
  }
  auto res = hvd::alltoall(torch::cat(send), torch::tensor(splits));
  std::vector<torch::Tensor> want_recv;
  for (int k = 0; k < n; ++k)
    want_recv.push_back(torch::full({r + 1, 3}, 100.0 * k + r, torch::kFloat64));
  CHECK_CLOSE("alltoall output", res.output, torch::cat(want_recv));
  CHECK_CLOSE("alltoall received_splits", res.received_splits,
              torch::full({n}, r + 1, torch::kInt64));
  // reducescatter: 2n+1 rows, the first rank gets one more
  auto rs_in = torch::arange((2 * n + 1) * 2, torch::kFloat64).reshape({2 * n + 1, 2}) + r;
  auto rs_sum = torch::arange((2 * n + 1) * 2, torch::kFloat64).reshape({2 * n + 1, 2}) * n + rsum;
  int64_t start = r * 2 + std::min(r, 1), count = 2 + (r < 1 ? 1 : 0);
  CHECK_CLOSE("reducescatter Sum", hvd::reducescatter(rs_in, hvd::Sum),
              rs_sum.narrow(0, start, count));
  CHECK_CLOSE("reducescatter Average", hvd::reducescatter(rs_in),
              rs_sum.narrow(0, start, count) / n);
  // objects, parameters, optimizer state
  std::string obj = hvd::broadcast_object(std::string(r == 0 ? "from rank 0" : "other"), 0);
  if (obj != "from rank 0") {
    std::fprintf(stderr, "broadcast_object: got '%s'\n", obj.c_str());
    std::exit(1);
  }
  auto vec = hvd::broadcast_object(std::vector<double>{1.0 * r, 2.0 * r}, n - 1);
  if (vec != std::vector<double>{1.0 * (n - 1), 2.0 * (n - 1)}) {
    std::fprintf(stderr, "broadcast_object vector mismatch\n");
    std::exit(1);
  }
  torch::manual_seed(100 + r);  // different on every rank
  auto lin = torch::nn::Linear(4, 3);
  hvd::broadcast_parameters(lin->named_parameters(), 0);
  auto w0 = hvd::broadcast(lin->weight.detach(), 0, "w0");
  CHECK_CLOSE("broadcast_parameters", lin->weight.detach(), w0);
  torch::optim::Adam adam(lin->parameters(), torch::optim::AdamOptions(1e-2));
  if (r == 0) {  // only rank 0 has state: one step
    lin->forward(torch::ones({2, 4})).sum().backward();
    adam.step();
  }
  hvd::broadcast_optimizer_state(adam, 0);
  auto& state = adam.state();
  if (state.size() != 2) {
    std::fprintf(stderr, "rank %d: broadcast_optimizer_state: %zu state entries, want 2\n", r,
                 state.size());
    std::exit(1);
  }
  // The map's order may differ between ranks: submit every broadcast (named by shape) first,
  // then wait - synchronous calls in different orders would deadlock, as in Horovod.
  std::vector<std::pair<torch::Tensor, torch::Tensor>> checks;
  std::vector<hvd::Handle> handles;
  for (auto& [key, value] : state) {
    auto& st = static_cast<torch::optim::AdamParamState&>(*value);
    if (st.step() != 1) {
      std::fprintf(stderr, "rank %d: broadcast_optimizer_state: step %lld, want 1\n", r,
                   static_cast<long long>(st.step()));
      std::exit(1);
    }
    checks.emplace_back(st.exp_avg(), st.exp_avg().clone());
    handles.push_back(
        hvd::broadcast_async_(checks.back().second, 0, "exp_avg" + c10::str(st.exp_avg().sizes())));
  }
  for (size_t i = 0; i < handles.size(); ++i) {
    hvd::synchronize(handles[i]);
    CHECK_CLOSE("broadcast_optimizer_state exp_avg", checks[i].first, checks[i].second);
  }
  // join: the last rank joins late; the others' allreduce sees zeros from it
  if (r == n - 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  } else {
    auto got =
        hvd::allreduce(torch::ones({3}, torch::kFloat64), {.op = hvd::Sum, .name = "before_join"});
    CHECK_CLOSE("allreduce with a joined rank", got,
                torch::full({3}, 1.0 * (n - 1), torch::kFloat64));
  }
  if (r == n - 1) {
    // this rank's join arrives after the others' allreduce needed it: they joined first
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  int last = hvd::join();
  std::printf("rank %d: join returned %d\n", r, last);
  if (last < 0 || last == n - 1) {
    std::fprintf(stderr,
                 "rank %d: join returned %d; rank %d joined first, so another rank joined last\n",
                 r, last, n - 1);
    std::exit(1);
  }
  hvd::barrier();
  // errors that leave hvd usable
  try {
    hvd::allreduce(t, {.op = hvd::Adasum});
    std::fprintf(stderr, "Adasum did not throw\n");
    std::exit(1);
  } catch (const dtrain::UsageError& e) {
    if (r == 0) std::printf("Adasum: %s\n", e.what());
  }
  try {
    hvd::allreduce(torch::ones({r + 1}, torch::kFloat64), {.name = "mismatch"});
    std::fprintf(stderr, "a shape mismatch did not throw\n");
    std::exit(1);
  } catch (const dtrain::UsageError& e) {
    if (r == 0) std::printf("mismatch: %s\n", e.what());
  }
  CHECK_CLOSE("allreduce after errors", hvd::allreduce(t, {.op = hvd::Sum}), base * n + rsum);
  // The response cache: a name that ran is cached and agreed by bit vector from then on; the
  // same name with a new shape on every rank runs (the entry follows), and a shape that
  // differs on one rank is still a mismatch on every rank.
  for (int k = 0; k < 3; ++k) {
    CHECK_CLOSE("cached allreduce", hvd::allreduce(t, {.op = hvd::Sum, .name = "cached"}),
                base * n + rsum);
  }
  CHECK_CLOSE("cached name, new shape everywhere",
              hvd::allreduce(torch::full({4}, 1.0 * r, torch::kFloat64),
                             {.op = hvd::Sum, .name = "cached"}),
              torch::full({4}, rsum, torch::kFloat64));
  try {
    hvd::allreduce(torch::ones({r == 0 ? 5 : 4}, torch::kFloat64),
                   {.op = hvd::Sum, .name = "cached"});
    std::fprintf(stderr, "rank %d: a shape differing on rank 0 under a cached name did not throw\n",
                 r);
    std::exit(1);
  } catch (const dtrain::UsageError& e) {
    if (std::string(e.what()).find("mismatched allreduce 'cached'") == std::string::npos) {
      std::fprintf(stderr, "rank %d: unexpected error: %s\n", r, e.what());
      std::exit(1);
    }
  }
  CHECK_CLOSE("cached name after a mismatch",
              hvd::allreduce(torch::full({4}, 1.0 * r, torch::kFloat64),
                             {.op = hvd::Sum, .name = "cached"}),
              torch::full({4}, rsum, torch::kFloat64));
  hvd::shutdown();
  std::printf("rank %d: collectives OK\n", r);
}

void order() {
  hvd::init();
  const int n = hvd::size(), r = hvd::rank();
  // 20 named tensors of different sizes; even ranks submit them forwards, odd ranks backwards,
  // all asynchronously before waiting on any.
  std::vector<int> idx(20);
  for (int i = 0; i < 20; ++i) idx[static_cast<size_t>(i)] = (r % 2 == 0) ? i : 19 - i;
  std::vector<torch::Tensor> ts(20);
  // Long names: 20 lines overflow the 4 KiB negotiation slot, exercising the fallback.
  const std::string long_suffix = "." + std::string(200, 'x');
  std::vector<hvd::Handle> hs(20);
  for (int i : idx) {
    ts[static_cast<size_t>(i)] = torch::full({i + 1}, (r + 1) * 1000.0 + i, torch::kFloat64);
    hs[static_cast<size_t>(i)] =
        hvd::allreduce_async_(ts[static_cast<size_t>(i)],
                              {.op = hvd::Sum, .name = "t" + std::to_string(i) + long_suffix});
  }
  for (int i = 0; i < 20; ++i) {
    hvd::synchronize(hs[static_cast<size_t>(i)]);
    double want = 1000.0 * n * (n + 1) / 2 + static_cast<double>(n) * i;
    CHECK_CLOSE(("named tensor t" + std::to_string(i)).c_str(), ts[static_cast<size_t>(i)],
                torch::full({i + 1}, want, torch::kFloat64));
  }
  hvd::shutdown();
  std::printf("rank %d: order OK\n", r);
}

void stall() {
  hvd::init();
  const int r = hvd::rank();
  try {
    if (r == 0) {
      hvd::allreduce(torch::ones({2}), {.name = "lonely.tensor"});
    } else {
      hvd::barrier();  // rank 0 never gets here
    }
    std::printf("rank %d: no stall?\n", r);
    std::exit(3);
  } catch (const dtrain::TimeoutError& e) {
    std::printf("rank %d: stopped: %s\n", r, e.what());
  }
  hvd::shutdown();
}

// Horovod's Adasum of two vectors, in float64.
torch::Tensor adasum_pair(const torch::Tensor& a, const torch::Tensor& b) {
  const double dot = a.dot(b).item<double>(), na = a.dot(a).item<double>(),
               nb = b.dot(b).item<double>();
  const double ca = na > 0 ? 1.0 - dot / (2 * na) : 1.0;
  const double cb = nb > 0 ? 1.0 - dot / (2 * nb) : 1.0;
  return ca * a + cb * b;
}

void adasum_mode() {
  hvd::init();
  const int n = hvd::size(), r = hvd::rank();
  // Rank k's tensors, which every rank can compute: two float64, one float32, and one that
  // is zero on odd ranks (its coefficient must be 1).
  auto tensors_of = [](int k) {
    auto g = at::detail::createCPUGenerator(500 + k);
    std::vector<torch::Tensor> t = {
        torch::randn({5, 7}, g, torch::kFloat64), torch::randn({13}, g, torch::kFloat64),
        torch::randn({3, 4}, g, torch::kFloat32), torch::randn({6}, g, torch::kFloat64)};
    if (k % 2) t[3].zero_();
    // Correlated with rank 0's, so the dot products are far from 0.
    for (auto& x : t) x.add_(torch::ones_like(x));
    return t;
  };
  // The formula on one process: pairs of ranks, then pairs of pairs.
  std::vector<torch::Tensor> want;
  for (size_t i = 0; i < 4; ++i) {
    std::vector<torch::Tensor> level;
    for (int k = 0; k < n; ++k) level.push_back(tensors_of(k)[i].reshape({-1}).to(torch::kFloat64));
    while (level.size() > 1) {
      std::vector<torch::Tensor> next;
      for (size_t j = 0; j < level.size(); j += 2)
        next.push_back(adasum_pair(level[j], level[j + 1]));
      level = next;
    }
    want.push_back(level[0].reshape(tensors_of(0)[i].sizes()));
  }
  auto check = [&](const char* what, size_t i, const torch::Tensor& got) {
    auto g = got.to(torch::kFloat64);
    const double tol = got.scalar_type() == torch::kFloat32 ? 1e-5 : 1e-12;
    const double rel =
        (g - want[i]).abs().max().item<double>() / want[i].abs().max().item<double>();
    if (g.sizes() != want[i].sizes() || !(rel <= tol)) {
      std::fprintf(stderr, "rank %d: Adasum %s tensor %zu: relative difference %g (tolerance %g)\n",
                   r, what, i, rel, tol);
      std::exit(1);
    }
  };
  auto mine = tensors_of(r);
  // Not simply the sum or the average (the comparison would be vacuous otherwise).
  auto sum = torch::zeros_like(want[0]);
  for (int k = 0; k < n; ++k) sum += tensors_of(k)[0].to(torch::kFloat64);
  if ((sum - want[0]).abs().max().item<double>() < 1e-3 ||
      (sum / n - want[0]).abs().max().item<double>() < 1e-3) {
    std::fprintf(stderr, "rank %d: the test's Adasum equals the sum or average\n", r);
    std::exit(1);
  }
  for (size_t i = 0; i < mine.size(); ++i) {
    check(
        "alone", i,
        hvd::allreduce(mine[i], {.op = hvd::Adasum, .name = "adasum.alone." + std::to_string(i)}));
  }
  auto inplace = mine[1].clone();
  hvd::allreduce_(inplace, {.op = hvd::Adasum, .name = "adasum.inplace", .postscale_factor = 0.5});
  check("in place, postscale 0.5 (x2)", 1, inplace * 2);
  auto fused = hvd::grouped_allreduce(mine, {.op = hvd::Adasum, .name = "adasum.group"});
  for (size_t i = 0; i < fused.size(); ++i) check("fused", i, fused[i]);
  hvd::shutdown();
  std::printf("rank %d: adasum OK on %d ranks\n", r, n);
}

void env_mode() {
  hvd::init();
  const char* names[] = {
      "HOROVOD_RANK",       "HOROVOD_SIZE",       "HOROVOD_LOCAL_RANK",       "HOROVOD_LOCAL_SIZE",
      "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE", "HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME"};
  std::string line = "hvd rank=" + std::to_string(hvd::rank()) +
                     " size=" + std::to_string(hvd::size()) +
                     " local_rank=" + std::to_string(hvd::local_rank()) +
                     " local_size=" + std::to_string(hvd::local_size()) +
                     " cross_rank=" + std::to_string(hvd::cross_rank()) +
                     " cross_size=" + std::to_string(hvd::cross_size());
  for (auto* n : names) {
    const char* v = std::getenv(n);
    line += std::string(" ") + n + "=" + (v ? v : "(unset)");
  }
  auto sum = hvd::allreduce(torch::full({1}, 1.0 + hvd::rank()), {.op = hvd::Sum});
  line += " allreduce_sum=" + std::to_string(sum.item<double>());
  std::printf("%s\n", line.c_str());
  hvd::shutdown();
}

// One process over the global batch (what DDP on W ranks of `batch` rows each must equal).
std::vector<torch::Tensor> train_single(int steps, int global) {
  torch::manual_seed(1234);
  auto model = make_mlp();
  auto x_all = torch::randn({static_cast<int64_t>(steps) * global, 784}).to(torch::kFloat64);
  auto y_all = torch::randint(0, 10, {static_cast<int64_t>(steps) * global}, torch::kLong);
  model->to(torch::kFloat64);
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
  for (int s = 0; s < steps; ++s) {
    adam.zero_grad();
    torch::nn::functional::cross_entropy(
        model->forward(x_all.narrow(0, int64_t{s} * global, global)),
        y_all.narrow(0, int64_t{s} * global, global))
        .backward();
    adam.step();
  }
  std::vector<torch::Tensor> params;
  for (auto& p : model->parameters()) params.push_back(p.detach().clone());
  return params;
}

double max_relative_difference(const std::vector<torch::Tensor>& a,
                               const std::vector<torch::Tensor>& b) {
  double worst = a.size() == b.size() ? 0 : 1e300;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    auto diff = (a[i] - b[i]).abs().max().item<double>();
    worst = std::max(worst, diff / std::max(b[i].abs().max().item<double>(), 1e-12));
  }
  return worst;
}

// What HorovodRunner runs: returns (rank, parameters).
std::pair<int, std::vector<torch::Tensor>> runner_train(int steps) {
  auto params = train_hvd(steps, 8, 1, false);
  const int r = hvd::rank();
  hvd::shutdown();
  return {r, params};
}

int runner_fail(int bad_rank) {
  hvd::init();
  if (hvd::rank() == bad_rank)
    throw std::runtime_error("rank " + std::to_string(bad_rank) + " gives up");
  hvd::barrier();
  return hvd::rank();
}

void save(const std::vector<torch::Tensor>& params, const std::string& out) {
  torch::save(params, out);
  std::printf("saved %zu tensors to %s\n", params.size(), out.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  dtrain::init(argc, argv);  // a HorovodRunner worker runs its function here and exits
  CLI::App app{"hvd test worker"};
  std::string mode, opt = "hvd", out;
  int steps = 20, batch = 8, bpps = 1;
  bool fp16 = false, extras = false;
  app.add_option("mode", mode)->required();
  app.add_flag("--extras", extras);
  app.add_option("--opt", opt)->check(CLI::IsMember({"hvd", "ddp"}));
  app.add_option("--steps", steps);
  app.add_option("--batch", batch);
  app.add_option("--bpps", bpps);
  app.add_flag("--fp16", fp16);
  app.add_option("--out", out);
  CLI11_PARSE(app, argc, argv);
  if (mode == "train") {
    auto params =
        opt == "hvd" ? train_hvd(steps, batch, bpps, fp16) : train_ddp(steps, batch, bpps);
    int r = opt == "hvd" ? hvd::rank() : dtrain::default_group()->rank();
    if (r == 0 && !out.empty()) save(params, out);
    if (opt == "hvd") hvd::shutdown();
  } else if (mode == "parity") {
    // Every comparison's runs in one job: OUT.ddp1, OUT.hvd1 and, with --extras, OUT.ddp2,
    // OUT.hvd2 (2 backward passes per step) and OUT.fp16 (hvd, float32, fp16 compression).
    struct Run {
      const char* tag;
      bool hvd;
      int bpps;
      bool fp16;
    };
    std::vector<Run> runs = {{"ddp1", false, 1, false}, {"hvd1", true, 1, false}};
    if (extras) {
      runs.push_back({"ddp2", false, 2, false});
      runs.push_back({"hvd2", true, 2, false});
      runs.push_back({"fp16", true, 1, true});
    }
    for (const auto& run : runs) {
      auto params =
          run.hvd ? train_hvd(steps, batch, run.bpps, run.fp16) : train_ddp(steps, batch, run.bpps);
      int r = run.hvd ? hvd::rank() : dtrain::default_group()->rank();
      if (run.hvd) hvd::shutdown();
      if (r == 0) save(params, out + "." + run.tag);
    }
  } else if (mode == "collectives") {
    collectives();
    // Name matching: a long cycle makes every rank's 20 requests land in one negotiation, in
    // opposite orders; then the same with fusion off (one allreduce per tensor).
    ::setenv("HOROVOD_CYCLE_TIME", "50", 1);
    order();
    ::unsetenv("HOROVOD_CYCLE_TIME");
    ::setenv("HOROVOD_FUSION_THRESHOLD", "0", 1);
    order();
  } else if (mode == "order") {
    order();
  } else if (mode == "stall") {
    stall();
  } else if (mode == "env") {
    env_mode();
  } else if (mode == "adasum") {
    adasum_mode();
  } else if (mode == "timeline") {
    train_hvd(steps, batch, 1, false);
    const int r = hvd::rank();
    hvd::shutdown();  // rank 0 closes the timeline
    std::printf("rank %d: timeline run done\n", r);
  } else if (mode == "runner") {
    hvd::HorovodRunner hr(-2);
    auto [rank, params] = hr.run(runner_train, steps);
    // DistributedOptimizer on 2 ranks of 8 rows equals one process on 16 rows.
    double rel = max_relative_difference(params, train_single(steps, 16));
    std::printf("HorovodRunner returned rank %d's model; relative difference to one process: %g\n",
                rank, rel);
    if (rank != 0 || !(rel <= 1e-9)) return 1;
    try {
      hr.run(runner_fail, 1);
      std::printf("no WorkerError\n");
      return 1;
    } catch (const dtrain::WorkerError& e) {
      std::printf("WorkerError rank=%d: %s\n", e.rank(), e.what());
    }
  } else {
    std::fprintf(stderr, "unknown mode '%s'\n", mode.c_str());
    return 2;
  }
  return 0;
}
