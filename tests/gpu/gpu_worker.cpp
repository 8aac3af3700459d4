// A worker for the gpu tests (tests/gpu/gpu_test.cpp), run under `dtrain run`: each mode checks
// its own results against values computed directly, prints one "<mode> ok" line per rank and
// exits 0, or prints what differed and exits 1.
//
//   gpu_worker collectives [--backend B]   every collective on CUDA tensors (this rank's GPU),
//                                          inputs written on a side stream just before
//   gpu_worker ddp                         DDP on CUDA against one process on the whole batch
//   gpu_worker syncbn                      SyncBatchNorm on CUDA against BatchNorm on the
//                                          whole batch
//   gpu_worker checkpoint                  a checkpoint written on the GPU loads on the CPU
//                                          and back
//   gpu_worker hvd                         hvd collectives on CUDA tensors
//   gpu_worker cpu_job                     a CPU-only job on this GPU machine: "auto" leaves
//                                          CUDA undecided and CUDA's driver unloaded (the
//                                          cost each worker of a CPU job would pay at launch)
//   gpu_worker zero cuda|cpu LIMIT_MB [STAGE [STEPS]]
//                                          ZeRO (stage 3, the default: optimizer and
//                                          parameters offloaded to the CPU) for STEPS (4)
//                                          steps; on cuda with at most LIMIT_MB of GPU memory
//                                          (set_per_process_memory_fraction; <= 0: no cap).
//                                          Rank 0 prints the losses, samples/s and the peak
//                                          GPU memory (JSON); the test compares cuda's with
//                                          cpu's, the benchmark stage 3 with stage 0.
//   gpu_worker optim cuda|cpu              ZeRO's optimizers and fp16 overflow handling on
//                                          one device: Lion (FusedLion on CUDA) at stage 0,
//                                          CPU Lion offloaded at stage 2, fp16 Adam with an
//                                          infinite loss at one step (the inf/NaN check on the
//                                          device's gradients), bf16 offloaded. Rank 0 prints
//                                          each case's losses, parameters, skipped steps and
//                                          loss scale (JSON); the test compares cuda's with
//                                          cpu's.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <string>

#include <dlfcn.h>
#include <unistd.h>

#include "dtrain/dtrain.h"
#include "dtrain/horovod.h"
#include "dtrain/zero.h"

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::fprintf(stderr, "gpu_worker: FAILED: %s\n", what.c_str());
  }
}

bool same(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() && torch::equal(a.cpu(), b.cpu());
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.detach().cpu().to(torch::kDouble) - b.detach().cpu().to(torch::kDouble))
      .abs()
      .max()
      .item<double>();
}

// Writes `value` into `t` on a side stream after enough work that a collective which did not
// wait for the caller's stream would read the old contents; the caller's stream then waits for
// the side stream (what PyTorch code does with wait_stream), and every collective must respect
// the caller's stream.
void slow_fill(torch::Tensor& t, double value) {
  auto caller = c10::cuda::getCurrentCUDAStream();
  auto side = c10::cuda::getStreamFromPool();
  {
    c10::cuda::CUDAStreamGuard guard(side);
    auto m = torch::randn({2048, 2048}, t.options().dtype(torch::kFloat));
    for (int i = 0; i < 8; ++i) m = torch::tanh(m.mm(m) / 2048.0);
    t.copy_((m.sum() * 0 + value).to(t.scalar_type()).expand_as(t));
  }
  at::cuda::CUDAEvent ready;
  ready.record(side);
  ready.block(caller);
}

template <typename O>
O with_op(dtrain::ReduceOp op) {
  O o;
  o.op = op;
  return o;
}

int collectives(const std::string& backend) {
  auto pg = dtrain::init_process_group({.backend = backend});
  const int rank = pg->rank(), world = pg->world_size();
  const torch::Device dev = dtrain::local_device();
  check(dev.is_cuda(), "local_device() is " + dev.str() + ", expected a GPU");
  const auto f = torch::TensorOptions(torch::kFloat).device(dev);
  const double tri = world * (world + 1) / 2.0;

  auto t = torch::zeros({1000}, f);
  slow_fill(t, rank + 1);
  dtrain::all_reduce(t);
  check(same(t, torch::full({1000}, tri, f)), "all_reduce sum after a side-stream write");
  check(t.device() == dev, "all_reduce moved the tensor");

  t = torch::full({257}, static_cast<double>(rank + 1), f);
  dtrain::all_reduce(t, with_op<dtrain::AllReduceOptions>(dtrain::ReduceOp::kAvg));
  check(max_diff(t, torch::full({257}, tri / world, f)) < 1e-6, "all_reduce avg");
  t = torch::full({3}, static_cast<double>(rank), f);
  dtrain::all_reduce(t, with_op<dtrain::AllReduceOptions>(dtrain::ReduceOp::kMax));
  check(same(t, torch::full({3}, world - 1.0, f)), "all_reduce max");

  for (int root = 0; root < world; ++root) {
    auto b = torch::full({5, 7}, static_cast<double>(rank), f);
    dtrain::BroadcastOptions bo;
    bo.src = root;
    dtrain::broadcast(b, bo);
    check(same(b, torch::full({5, 7}, static_cast<double>(root), f)),
          "broadcast from " + std::to_string(root));
  }

  auto gathered = dtrain::all_gather(torch::full({4}, static_cast<double>(rank), f));
  check(static_cast<int>(gathered.size()) == world, "all_gather count");
  for (int r = 0; r < world && r < static_cast<int>(gathered.size()); ++r) {
    check(same(gathered[r], torch::full({4}, static_cast<double>(r), f)) && gathered[r].is_cuda(),
          "all_gather part " + std::to_string(r));
  }
  auto flat = torch::empty({world * 4}, f);
  dtrain::all_gather_into_tensor(flat, torch::full({4}, static_cast<double>(rank), f));
  check(same(flat, torch::arange(world, f).repeat_interleave(4)), "all_gather_into_tensor");

  // reduce_scatter: input[j] = rank + j; chunk `rank` of the sum is sum_r (r + rank).
  auto in = torch::arange(world * 3, f).div(3, "floor") + rank;
  auto out = torch::empty({3}, f);
  dtrain::reduce_scatter(out, in);
  check(same(out, torch::full({3}, tri - world + world * rank, f)), "reduce_scatter sum");

  auto red = torch::full({6}, static_cast<double>(rank + 1), f);
  dtrain::ReduceOptions ro;
  ro.dst = 0;
  dtrain::reduce(red, ro);
  if (rank == 0) check(same(red, torch::full({6}, tri, f)), "reduce to rank 0");

  auto send = torch::arange(world, f) + 100 * rank;  // element j goes to rank j
  auto recv = torch::empty({world}, f);
  dtrain::all_to_all(recv, send);
  check(same(recv, torch::arange(world, f) * 100 + rank), "all_to_all");

  if (world > 1) {
    auto ring = torch::full({9}, static_cast<double>(rank), f);
    auto got = torch::empty({9}, f);
    auto s = dtrain::send_async(ring, (rank + 1) % world);
    auto r = dtrain::recv_async(got, (rank + world - 1) % world);
    s.wait();
    r.wait();
    check(same(got, torch::full({9}, static_cast<double>((rank + world - 1) % world), f)),
          "send/recv ring");
  }
  pg->barrier();
  std::printf("gpu_worker rank %d: collectives ok backend=%s device=%s\n", rank,
              pg->backend_name().c_str(), dev.str().c_str());
  dtrain::destroy_process_group();
  return failures ? 1 : 0;
}

torch::nn::Sequential mlp() {
  using namespace torch::nn;
  return Sequential(Linear(32, 64), ReLU(), Linear(64, 64), ReLU(), Linear(64, 5));
}

// The global batch of step s: the same on every rank (CPU generator, then the device).
std::pair<torch::Tensor, torch::Tensor> batch(int step, int64_t n, torch::Device dev) {
  auto gen = at::detail::createCPUGenerator(1000 + step);
  auto x = at::randn({n, 32}, gen);
  auto y = at::randint(0, 5, {n}, gen, at::TensorOptions(torch::kLong));
  return {x.to(dev), y.to(dev)};
}

int ddp() {
  auto pg = dtrain::init_process_group();
  const int rank = pg->rank(), world = pg->world_size();
  const torch::Device dev = dtrain::local_device();
  const int64_t per_rank = 16, steps = 6;
  torch::manual_seed(7);
  auto model = mlp();
  model->to(dev);
  // Small buckets: several all-reduces launched while backward still runs.
  dtrain::DDPOptions ddp_options;
  ddp_options.bucket_cap_mb = 0.005;
  ddp_options.first_bucket_mb = 0.002;
  dtrain::DistributedDataParallel wrapped(model, ddp_options);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = batch(s, per_rank * world, dev);
    opt.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(
        wrapped(x.narrow(0, rank * per_rank, per_rank)), y.narrow(0, rank * per_rank, per_rank));
    loss.backward();
    opt.step();
  }
  if (rank == 0) {
    torch::manual_seed(7);
    auto ref = mlp();
    ref->to(dev);
    torch::optim::SGD ropt(ref->parameters(), torch::optim::SGDOptions(0.1));
    for (int s = 0; s < steps; ++s) {
      auto [x, y] = batch(s, per_rank * world, dev);
      ropt.zero_grad();
      torch::nn::functional::cross_entropy(ref->forward(x), y).backward();
      ropt.step();
    }
    double worst = 0;
    auto a = model->parameters(), b = ref->parameters();
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, max_diff(a[i], b[i]));
    check(a[0].is_cuda(), "DDP moved the parameters off the GPU");
    check(worst < 1e-5, "DDP on CUDA differs from one process by " + std::to_string(worst));
    std::printf("gpu_worker rank 0: ddp ok world=%d maxdiff=%.3g backend=%s\n", world, worst,
                pg->backend_name().c_str());
  }
  pg->barrier();
  dtrain::destroy_process_group();
  return failures ? 1 : 0;
}

int syncbn() {
  auto pg = dtrain::init_process_group();
  const int rank = pg->rank(), world = pg->world_size();
  const torch::Device dev = dtrain::local_device();
  auto gen = at::detail::createCPUGenerator(11);
  auto all = (at::randn({4 * world, 3, 5, 5}, gen) * 3 + 1).to(dev);
  auto mine = all.narrow(0, 4 * rank, 4).clone().requires_grad_(true);
  dtrain::SyncBatchNorm bn(3);
  bn->to(dev);
  auto out = bn->forward(mine);
  out.pow(2).sum().backward();
  auto w_grad = bn->weight.grad().clone();
  dtrain::all_reduce(w_grad);  // the gradient of the whole batch's loss
  auto outs = dtrain::all_gather(out.detach());
  if (rank == 0) {
    torch::nn::BatchNorm2d ref(3);
    ref->to(dev);
    auto x = all.clone().requires_grad_(true);
    auto y = ref->forward(x);
    y.pow(2).sum().backward();
    double d_out = max_diff(torch::cat(outs), y);
    double d_w = max_diff(w_grad, ref->weight.grad());
    double d_mean = max_diff(bn->running_mean, ref->running_mean);
    check(d_out < 1e-4 && d_w < 1e-3 && d_mean < 1e-5,
          "SyncBatchNorm on CUDA differs: output " + std::to_string(d_out) + ", weight grad " +
              std::to_string(d_w) + ", running mean " + std::to_string(d_mean));
    std::printf("gpu_worker rank 0: syncbn ok out=%.3g wgrad=%.3g\n", d_out, d_w);
  }
  pg->barrier();
  dtrain::destroy_process_group();
  return failures ? 1 : 0;
}

int checkpoint() {
  const torch::Device dev = dtrain::local_device();
  const std::string dir =
      std::filesystem::temp_directory_path() / ("dtrain-gpu-ckpt-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  torch::manual_seed(3);
  auto model = mlp();
  model->to(dev);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
  constexpr int64_t kRows = 8;
  auto [x, y] = batch(0, kRows, dev);
  torch::nn::functional::cross_entropy(model->forward(x), y).backward();
  opt.step();
  dtrain::TrainingState one;
  one.step = 1;
  dtrain::save_checkpoint(dir + "/gpu.pt", *model, &opt, one);
  // On the CPU: the same parameters, and an optimizer whose state sits on the CPU too.
  auto cpu_model = mlp();
  torch::optim::Adam cpu_opt(cpu_model->parameters(), torch::optim::AdamOptions(1e-2));
  auto state = dtrain::load_checkpoint(dir + "/gpu.pt", *cpu_model, &cpu_opt);
  check(state.step == 1, "step after load");
  auto a = model->parameters(), b = cpu_model->parameters();
  for (size_t i = 0; i < a.size(); ++i) check(same(a[i], b[i]), "parameter " + std::to_string(i));
  auto [cx, cy] = batch(1, kRows, torch::kCPU);
  torch::nn::functional::cross_entropy(cpu_model->forward(cx), cy).backward();
  cpu_opt.step();  // fails if the Adam state came back on the GPU
  // And back onto the GPU.
  dtrain::TrainingState two;
  two.step = 2;
  dtrain::save_checkpoint(dir + "/cpu.pt", *cpu_model, &cpu_opt, two);
  auto gpu_model = mlp();
  gpu_model->to(dev);
  torch::optim::Adam gpu_opt(gpu_model->parameters(), torch::optim::AdamOptions(1e-2));
  dtrain::load_checkpoint(dir + "/cpu.pt", *gpu_model, &gpu_opt);
  auto c = gpu_model->parameters(), d = cpu_model->parameters();
  for (size_t i = 0; i < c.size(); ++i)
    check(c[i].is_cuda() && same(c[i], d[i]), "gpu parameter " + std::to_string(i));
  torch::nn::functional::cross_entropy(gpu_model->forward(x), y).backward();
  gpu_opt.step();
  std::filesystem::remove_all(dir);
  std::printf("gpu_worker rank 0: checkpoint ok\n");
  return failures ? 1 : 0;
}

int hvd() {
  dtrain::hvd::init();
  const int rank = dtrain::hvd::rank(), world = dtrain::hvd::size();
  const torch::Device dev = dtrain::local_device();
  const auto f = torch::TensorOptions(torch::kFloat).device(dev);
  dtrain::hvd::AllreduceOptions so;
  so.op = dtrain::hvd::Sum;
  so.name = "sum";
  auto sum = dtrain::hvd::allreduce(torch::full({10}, static_cast<double>(rank + 1), f), so);
  check(sum.is_cuda() && same(sum, torch::full({10}, world * (world + 1) / 2.0, f)),
        "hvd allreduce sum on CUDA");
  dtrain::hvd::AllreduceOptions ao;
  ao.name = "avg";
  auto avg = dtrain::hvd::allreduce(torch::full({10}, static_cast<double>(rank), f), ao);
  check(max_diff(avg, torch::full({10}, (world - 1) / 2.0, f)) < 1e-6, "hvd allreduce average");
  auto b = torch::full({4}, static_cast<double>(rank), f);
  dtrain::hvd::broadcast_(b, 0, "b");
  check(same(b, torch::zeros({4}, f)), "hvd broadcast_");
  auto g = dtrain::hvd::allgather(torch::full({2}, static_cast<double>(rank), f), "g");
  check(g.is_cuda() && g.size(0) == 2 * world, "hvd allgather on CUDA");
  // join: the last rank joins at once; the others' CUDA allreduce goes on, the joined rank
  // contributing zeros on its GPU (a CUDA collective takes no CPU tensor).
  if (rank == world - 1) {
    const int last = dtrain::hvd::join();
    check(last != world - 1 || world == 1, "hvd join: the last rank to join");
  } else {
    dtrain::hvd::AllreduceOptions jo;
    jo.op = dtrain::hvd::Sum;
    jo.name = "after_join";
    auto s = dtrain::hvd::allreduce(torch::full({3}, 1.0, f), jo);
    check(s.is_cuda() && same(s, torch::full({3}, static_cast<double>(world - 1), f)),
          "hvd allreduce with a joined rank on CUDA");
    dtrain::hvd::join();
  }
  std::printf("gpu_worker rank %d: hvd ok\n", rank);
  dtrain::hvd::shutdown();
  return failures ? 1 : 0;
}

// Whether CUDA's driver has been initialised in this process (cuInit ran: the runtime's first
// call, or anything that asks the driver). Loading the driver library is not that: libtorch's
// CUDA libraries and NCCL may map libcuda.so.1 at load (the first H200 run of this test saw it
// mapped in a CPU-only job whose 16-worker launch cost no more than with no GPU visible). Before
// cuInit every driver call answers CUDA_ERROR_NOT_INITIALIZED (3); cuCtxGetCurrent initialises
// nothing. The driver is only asked if it is already loaded (RTLD_NOLOAD).
bool driver_initialised() {
  void* driver = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (driver == nullptr) return false;
  using CtxGetCurrent = int (*)(void**);
  auto get = reinterpret_cast<CtxGetCurrent>(::dlsym(driver, "cuCtxGetCurrent"));
  void* ctx = nullptr;
  const bool initialised = get == nullptr || get(&ctx) != 3;
  ::dlclose(driver);
  return initialised;
}

int cpu_job() {
  check(!driver_initialised(), "CUDA's driver was initialised before init_process_group");
  auto pg = dtrain::init_process_group();
  const int rank = pg->rank(), world = pg->world_size();
  auto t = torch::full({4}, rank + 1.0);
  dtrain::all_reduce(t);
  check(t[0].item<double>() == world * (world + 1) / 2.0, "all_reduce on the CPU");
  pg->barrier();
  check(pg->backend_name() == "cpu:shm,cuda:auto",
        "backend '" + pg->backend_name() + "', expected cpu:shm,cuda:auto (CUDA undecided)");
  check(!driver_initialised(), "a CPU-only job initialised CUDA's driver (cuInit ran)");
  std::printf("gpu_worker rank %d: cpu_job ok backend=%s\n", rank, pg->backend_name().c_str());
  dtrain::destroy_process_group();
  return failures ? 1 : 0;
}

// Stage 3 offloads the optimizer and the parameters to the CPU; stage 0 keeps all on the device
// (bench/gpu_bench.py's zero_offload compares the two). limit_mb <= 0: no cap.
int zero(const std::string& where, double limit_mb, int stage, int steps) {
  auto pg = dtrain::init_process_group();
  const int rank = pg->rank();
  const torch::Device dev = where == "cuda" ? dtrain::local_device() : torch::Device(torch::kCPU);
  if (dev.is_cuda() && limit_mb > 0) {
    // The caching allocator starts with CUDA's lazy initialisation, which the first CUDA
    // tensor triggers; before it, setMemoryFraction throws "Allocator not initialized".
    torch::empty({1}, torch::TensorOptions().device(dev));
    const double total =
        static_cast<double>(at::cuda::getDeviceProperties(dev.index())->totalGlobalMem);
    c10::cuda::CUDACachingAllocator::setMemoryFraction(limit_mb * 1024 * 1024 / total, dev.index());
  }
  // 8 x Linear(2048, 2048): 33.6M parameters, 134 MB in fp32; Adam's two moments 268 MB.
  torch::manual_seed(5);
  torch::nn::Sequential model;
  for (int i = 0; i < 8; ++i) {
    model->push_back(torch::nn::Linear(2048, 2048));
    if (i < 7) model->push_back(torch::nn::Tanh());
  }
  model->to(dev);
  nlohmann::json config = {
      {"train_micro_batch_size_per_gpu", 8},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-4}, {"weight_decay", 0.01}}}}},
      {"zero_optimization", {{"stage", stage}}}};
  if (stage == 3) {
    config["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}, {"pin_memory", true}};
    config["zero_optimization"]["offload_param"] = {{"device", "cpu"}, {"pin_memory", true}};
    config["zero_optimization"]["stage3_max_reuse_distance"] = 0;
    // DeepSpeed's defaults prefetch 5e7 elements ahead, more than this whole model (33.6M): in
    // backward every layer would be gathered again beside the gradients (177 MiB, measured on
    // the H100). A user fitting a model into little GPU memory bounds them, as here: one layer
    // (2048 x 2048 + 2048) prefetched, three gathered at once.
    const int64_t layer = 2048 * 2048 + 2048;
    config["zero_optimization"]["stage3_prefetch_bucket_size"] = layer;
    config["zero_optimization"]["stage3_max_live_parameters"] = 3 * layer;
  }
  auto engine = dtrain::zero::initialize(model, config);
  if (dev.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(dev.index());
  std::vector<double> losses;
  auto t0 = std::chrono::steady_clock::now();
  for (int step = 0; step < steps; ++step) {
    if (step == 1) {  // the clock starts after the first step (allocations, pinned buffers)
      if (dev.is_cuda()) torch::cuda::synchronize();
      t0 = std::chrono::steady_clock::now();
    }
    auto gen = at::detail::createCPUGenerator(500 + step * 10 + rank);
    auto x = at::randn({8, 2048}, gen).to(dev);
    auto target = at::randn({8, 2048}, gen).to(dev);
    auto loss = torch::mse_loss(engine(x), target);
    engine.backward(loss);
    engine.step();
    auto global = loss.detach().to(torch::kCPU, torch::kDouble).reshape({1});
    dtrain::all_reduce(global, with_op<dtrain::AllReduceOptions>(dtrain::ReduceOp::kAvg));
    losses.push_back(global.item<double>());
  }
  if (dev.is_cuda()) torch::cuda::synchronize();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double samples_per_s = steps > 1 ? 8.0 * pg->world_size() * (steps - 1) / secs : 0.0;
  double peak_mb = 0;
  if (dev.is_cuda()) {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(dev.index());
    peak_mb = static_cast<double>(stats.allocated_bytes[0].peak) / (1024.0 * 1024.0);
    check(limit_mb <= 0 || peak_mb <= limit_mb, "peak GPU memory " + std::to_string(peak_mb) +
                                                    " MB over the " + std::to_string(limit_mb) +
                                                    " MB allowed");
  }
  if (rank == 0) {
    nlohmann::json out = {{"zero", where},
                          {"stage", stage},
                          {"samples_per_s", samples_per_s},
                          {"losses", losses},
                          {"peak_gpu_mb", peak_mb},
                          {"adam_state_mb", 2 * 8 * (2048.0 * 2048 + 2048) * 4 / (1024 * 1024)}};
    std::printf("%s\n", out.dump().c_str());
  }
  pg->barrier();
  dtrain::destroy_process_group();
  return failures ? 1 : 0;
}

// A Linear whose (16-bit, under fp16/bf16) weights compute in float32, the same arithmetic on
// both devices (CPU matmuls have no float16 kernel in libtorch 1.13); the gradient flows back
// into the 16-bit parameters.
struct CastLinearImpl : torch::nn::Module {
  torch::nn::Linear inner{nullptr};
  CastLinearImpl(int in, int out) { inner = register_module("inner", torch::nn::Linear(in, out)); }
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::nn::functional::linear(x.to(torch::kFloat32), inner->weight.to(torch::kFloat32),
                                         inner->bias.to(torch::kFloat32));
  }
};
TORCH_MODULE(CastLinear);

int optim(const std::string& where) {
  auto pg = dtrain::init_process_group();
  const int rank = pg->rank();
  const torch::Device dev = where == "cuda" ? dtrain::local_device() : torch::Device(torch::kCPU);
  nlohmann::json out = nlohmann::json::object();
  const nlohmann::json lion = {
      {"type", "Lion"}, {"params", {{"lr", 1e-4}, {"betas", {0.9, 0.99}}, {"weight_decay", 0.01}}}};
  const nlohmann::json adam = {{"type", "Adam"}, {"params", {{"lr", 1e-3}}}};
  const nlohmann::json offload = {{"device", "cpu"}};
  // One case: 6 steps of a 16 -> 4 layer on this device; at `inf_step` the loss is infinite.
  auto run = [&](const std::string& name, nlohmann::json config, int inf_step) {
    config["train_micro_batch_size_per_gpu"] = 8;
    torch::manual_seed(7);
    CastLinear model(16, 4);
    model->to(dev);
    auto engine = dtrain::zero::initialize(model, config);
    std::vector<double> losses;
    for (int step = 0; step < 6; ++step) {
      auto gen = at::detail::createCPUGenerator(100 + step * 10 + rank);
      auto x = at::randn({8, 16}, gen).to(dev);
      auto y = at::randn({8, 4}, gen).to(dev);
      // .to(kFloat32): under fp16 torch_autocast the linear comes out fp16.
      auto loss = torch::mse_loss(engine(x).to(torch::kFloat32), y);
      if (step == inf_step) loss = loss * std::numeric_limits<double>::infinity();
      engine.backward(loss);
      engine.step();
      auto global = loss.detach().to(torch::kCPU, torch::kDouble).reshape({1});
      dtrain::all_reduce(global, with_op<dtrain::AllReduceOptions>(dtrain::ReduceOp::kAvg));
      losses.push_back(step == inf_step ? -1.0 : global.item<double>());  // -1: the inf step
    }
    std::vector<double> params;
    for (const auto& p : engine.module()->parameters()) {
      auto flat = p.detach().to(torch::kCPU, torch::kDouble).reshape({-1}).contiguous();
      params.insert(params.end(), flat.data_ptr<double>(), flat.data_ptr<double>() + flat.numel());
    }
    out[name] = {{"losses", losses},
                 {"params", params},
                 {"skipped", engine.skipped_steps()},
                 {"loss_scale", engine.loss_scale()}};
  };
  run("lion stage 0", {{"optimizer", lion}, {"zero_optimization", {{"stage", 0}}}}, -1);
  run("lion stage 2 offload",
      {{"optimizer", lion}, {"zero_optimization", {{"stage", 2}, {"offload_optimizer", offload}}}},
      -1);
  run("fp16 adam stage 2, an infinite loss at step 3",
      {{"optimizer", adam},
       {"fp16", {{"enabled", true}, {"initial_scale_power", 8}, {"hysteresis", 1}}},
       {"zero_optimization", {{"stage", 2}}}},
      2);
  const nlohmann::json autocast16 = {{"enabled", true}, {"dtype", "fp16"}};
  run("autocast fp16 adam stage 0, an infinite loss at step 3 (GradScaler)",
      {{"optimizer", adam}, {"torch_autocast", autocast16}, {"zero_optimization", {{"stage", 0}}}},
      2);
  run("autocast fp16 adam stage 2, an infinite loss at step 3 (the norm)",
      {{"optimizer", adam}, {"torch_autocast", autocast16}, {"zero_optimization", {{"stage", 2}}}},
      2);
  run("bf16 adam stage 2 offload",
      {{"optimizer", adam},
       {"bf16", {{"enabled", true}}},
       {"zero_optimization", {{"stage", 2}, {"offload_optimizer", offload}}}},
      -1);
  if (rank == 0) std::printf("{\"optim\":%s}\n", out.dump().c_str());
  pg->barrier();
  dtrain::destroy_process_group();
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  std::string backend = "auto";
  for (int i = 2; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--backend") backend = argv[i + 1];
  }
  try {
    if (mode == "cpu_job") return cpu_job();  // before anything asks CUDA (which starts it)
    if (!torch::cuda::is_available() &&
        !((mode == "zero" || mode == "optim") && argc > 2 && std::string(argv[2]) == "cpu")) {
      std::fprintf(stderr, "gpu_worker: no GPU is visible to this process\n");
      return 2;
    }
    if (mode == "collectives") return collectives(backend);
    if (mode == "ddp") return ddp();
    if (mode == "syncbn") return syncbn();
    if (mode == "checkpoint") return checkpoint();
    if (mode == "hvd") return hvd();
    if (mode == "optim" && argc > 2) return optim(argv[2]);
    if (mode == "zero" && argc > 3) {
      return zero(argv[2], std::stod(argv[3]), argc > 4 ? std::stoi(argv[4]) : 3,
                  argc > 5 ? std::stoi(argv[5]) : 4);
    }
    std::fprintf(stderr, "gpu_worker: unknown mode '%s'\n", mode.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_worker: %s\n", dtrain::error_message(e).c_str());
    return 1;
  }
}
