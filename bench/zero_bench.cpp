// ZeRO benchmarks (issue #11). Three modes:
//
//   zero_bench adam [--params 100000000] [--reps 5]
//     One process: dtrain's CPU Adam (zero::cpu_adam_step) vs torch::optim::Adam on one tensor
//     of the same size, and both against memcpy bandwidth measured in the same run (a
//     parallel memcpy over the same threads). Bytes/s of Adam = 28 bytes per element (reads
//     param, grad, exp_avg, exp_avg_sq; writes param, exp_avg, exp_avg_sq); of memcpy = 2 x size.
//
//   dtrain run --nproc-per-node N zero_bench memory
//     A ~100M-parameter model (6 x Linear(4096, 4096)), one training step per stage 0-3 (and
//     stage 3 with offload); rank 0 prints engine.memory() next to the ZeRO formulas (fp32:
//     4 + 4 + 8 bytes per parameter: K = 8, Adam's two moments; the parameters are the master).
//
//   dtrain run --nproc-per-node 2 zero_bench throughput [--steps 20] [--rounds 3] [--zero JSON]
//     Samples/s of an ~8.4M-parameter MLP under dtrain DDP + torch::optim::Adam and under ZeRO
//     stages 0-3 (stages 1-3 also with overlap_comm and 2M-element buckets), interleaved in
//     rounds (best round counts); ratios against DDP. --zero adds zero_optimization settings.
//
//   zero_bench rss [--width 2048] [--layers 20] [--steps 3] [--worlds 2,4] [--batch 8]
//     Peak memory as the user sees it: for each world size and stage 0-3, a fresh
//     `dtrain run --nproc-per-node N zero_bench rss-worker ...` trains an MLP (LAYERS x
//     Linear(WIDTH, WIDTH), default 83.9M parameters, fp32, Adam) with dtrain's default
//     zero_optimization settings (DeepSpeed's but for stage 3's prefetch and reuse distance:
//     include/dtrain/zero_config.h); each rank resets its VmHWM after initialize
//     (`echo 5 > /proc/self/clear_refs`), runs STEPS steps and reads VmHWM. Prints per stage
//     the accounting figure (engine.memory()), every rank's measured peak RSS, and the largest
//     peak's ratio to stage 0's at the same world size. --zero '{"key": value}' adds
//     zero_optimization settings to every run (e.g. stage 3's prefetch and reuse distance).
//     `rss-worker ... --resume DIR` then saves a checkpoint into DIR and loads it back, and
//     prints the load's peak RSS above what the process held before it (zero_resume_rss),
//     with this rank's share of the optimizer files (all of them / N) to compare it with.
//     `--resume DIR --load-only` loads what an earlier run saved there (another world size).
//
// Every mode prints the machine (CPU model, cores) and JSON lines.
#include <ATen/Parallel.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "dtrain/dtrain.h"

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string machine() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model = "unknown CPU";
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  return model + ", " + std::to_string(::sysconf(_SC_NPROCESSORS_ONLN)) + " cores, libtorch " +
         TORCH_VERSION + ", " + std::to_string(at::get_num_threads()) + " intra-op threads";
}

std::string arg(int argc, char** argv, const std::string& name, const std::string& def) {
  for (int i = 2; i + 1 < argc; ++i)
    if (name == argv[i]) return argv[i + 1];
  return def;
}

bool has_flag(int argc, char** argv, const std::string& name) {
  for (int i = 1; i < argc; ++i)
    if (argv[i] == name) return true;
  return false;
}

int adam_bench(int64_t n, int reps) {
  std::printf("machine: %s\n", machine().c_str());
  auto opts = torch::TensorOptions().dtype(torch::kFloat32);
  auto p = torch::randn({n}, opts), g = torch::randn({n}, opts) * 1e-3;
  auto m = torch::zeros({n}, opts), v = torch::zeros({n}, opts);
  // dtrain's CPU Adam.
  std::vector<double> ours;
  for (int r = 0; r <= reps; ++r) {
    auto t = Clock::now();
    dtrain::zero::cpu_adam_step(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(),
                                v.data_ptr<float>(), n, r + 1, 1e-3, 0.9, 0.999, 1e-8, 0.0, false);
    if (r > 0) ours.push_back(seconds_since(t));  // the first pass faults the pages in
  }
  m = torch::Tensor(), v = torch::Tensor();
  // torch::optim::Adam over one tensor of n elements.
  auto tp = p.clone().requires_grad_(true);
  tp.mutable_grad() = g;
  torch::optim::Adam opt({tp}, torch::optim::AdamOptions(1e-3));
  std::vector<double> theirs;
  for (int r = 0; r <= reps; ++r) {
    auto t = Clock::now();
    opt.step();
    if (r > 0) theirs.push_back(seconds_since(t));
  }
  opt.zero_grad();
  tp = torch::Tensor();
  // memcpy bandwidth, split over the same threads.
  auto src = torch::randn({n}, opts), dst = torch::empty({n}, opts);
  std::vector<double> copy;
  for (int r = 0; r <= reps; ++r) {
    auto t = Clock::now();
    const float* s = src.data_ptr<float>();
    float* d = dst.data_ptr<float>();
    at::parallel_for(
        0, n, std::max<int64_t>(65536, n / at::get_num_threads()),
        [&](int64_t lo, int64_t hi) { std::memcpy(d + lo, s + lo, (hi - lo) * sizeof(float)); });
    if (r > 0) copy.push_back(seconds_since(t));
  }
  auto best = [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); };
  const double o = best(ours), t = best(theirs), c = best(copy);
  const double adam_bw = 28.0 * n / o, copy_bw = 8.0 * n / c;
  std::printf(
      "{\"bench\":\"cpu_adam\",\"params\":%lld,\"dtrain_s\":%.4f,\"torch_optim_adam_s\":%.4f,"
      "\"memcpy_s\":%.4f,"
      "\"speedup_vs_torch\":%.2f,\"dtrain_gbps\":%.2f,\"memcpy_gbps\":%.2f,\"fraction_of_memcpy\":%"
      ".2f}\n",
      static_cast<long long>(n), o, t, c, t / o, adam_bw / 1e9, copy_bw / 1e9, adam_bw / copy_bw);
  std::printf(
      "CPU Adam over %lld params: dtrain %.3f s, torch::optim::Adam %.3f s (%.2fx); %.1f GB/s = "
      "%.0f%% of "
      "memcpy's %.1f GB/s\n",
      static_cast<long long>(n), o, t, t / o, adam_bw / 1e9, 100 * adam_bw / copy_bw,
      copy_bw / 1e9);
  return 0;
}

// overlap: DeepSpeed's overlap_comm with 2M-element (8 MB) reduce buckets, so that the first
// buckets' reductions run while backward computes the rest.
nlohmann::json zero_config(int stage, int micro, bool offload = false, bool overlap = false) {
  nlohmann::json c = {
      {"train_micro_batch_size_per_gpu", micro},
      {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 1e-4}}}}},
      {"zero_optimization",
       {{"stage", stage},
        {"reduce_bucket_size", overlap ? 2000000 : 25000000},
        {"overlap_comm", overlap},
        // stage 3 fetches every layer for its forward and again for its backward
        // (DeepSpeed's default 1e9 keeps every layer of this model gathered between the two)
        {"stage3_max_reuse_distance", 0}}}};
  if (offload)
    c["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}},
    c["zero_optimization"]["offload_param"] = {{"device", "cpu"}};
  return c;
}

int memory_bench() {
  auto pg = dtrain::init_process_group();
  const int N = pg->world_size();
  if (pg->rank() == 0) std::printf("machine: %s\n", machine().c_str());
  using namespace torch::nn;
  for (std::string v : {"stage0", "stage1", "stage2", "stage3", "stage3_offload"}) {
    torch::manual_seed(0);
    Sequential model;
    for (int i = 0; i < 6; ++i) model->push_back(Linear(4096, 4096));
    const int stage = v[5] - '0';
    auto cfg = zero_config(stage, 2, v == "stage3_offload");
    auto e = dtrain::zero::initialize(model, cfg);
    auto x = torch::randn({2, 4096});
    e.backward(e(x).pow(2).mean());
    e.step();
    auto m = e.memory();
    const int64_t n = e.core().num_parameters();
    auto est = dtrain::zero::estimate_memory(e.config(), n);
    struct rusage ru {};
    ::getrusage(RUSAGE_SELF, &ru);
    if (pg->rank() == 0) {
      auto mib = [](int64_t b) { return b / 1048576.0; };
      if (stage == 3) {
        // Stage 3's per-layer fetch: the most parameter bytes alive between layers (partition +
        // gathered buffers still alive), against gathering the whole module for the step.
        auto st = e.core().stage3_stats();
        const int64_t whole = st.partition_bytes + n * 4;
        std::printf(
            "{\"bench\":\"zero_stage3_resident\",\"world\":%d,\"variant\":\"%s\",\"peak_between_"
            "layers_mib\":%.1f,"
            "\"partition_mib\":%.1f,\"whole_module_gather_mib\":%.1f,\"fetches\":%lld,"
            "\"prefetches\":%lld}\n",
            N, v.c_str(), mib(st.peak_resident_bytes), mib(st.partition_bytes), mib(whole),
            (long long)st.fetches, (long long)st.prefetches);
      }
      std::printf(
          "{\"bench\":\"zero_memory\",\"world\":%d,\"variant\":\"%s\",\"params\":%lld,"
          "\"measured_mib\":{\"params\":%.1f,\"grads\":%.1f,\"optimizer\":%.1f,\"cpu\":%.1f},"
          "\"formula_mib\":{\"params\":%.1f,\"grads\":%.1f,\"optimizer\":%.1f,\"cpu\":%.1f},\"peak_"
          "rss_mib\":%.0f}\n",
          N, v.c_str(), static_cast<long long>(n), mib(m.params_device), mib(m.grads_device),
          mib(m.optimizer_device), mib(m.params_cpu + m.grads_cpu + m.optimizer_cpu),
          mib(est.params), mib(est.grads), mib(est.optimizer), mib(est.offloaded),
          ru.ru_maxrss / 1024.0);
      std::fflush(stdout);
    }
  }
  return 0;
}

// This process's VmRSS / VmHWM in bytes (/proc/self/status).
int64_t proc_status_bytes(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string k = std::string(key) + ":";
  while (std::getline(in, line))
    if (line.rfind(k, 0) == 0) return std::stoll(line.substr(k.size())) * 1024;  // "NNN kB"
  throw std::runtime_error(std::string("no ") + key + " in /proc/self/status");
}

void reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  if (!out.flush()) throw std::runtime_error("cannot write /proc/self/clear_refs");
}

// One stage at one world size: every rank's peak RSS over `steps` training steps.
int rss_worker(int stage, int64_t width, int layers, int steps, int batch,
               const std::string& zero_json, const std::string& resume_dir, bool load_only) {
  auto pg = dtrain::init_process_group();
  const int N = pg->world_size();
  using namespace torch::nn;
  torch::manual_seed(0);
  Sequential model;
  for (int i = 0; i < layers; ++i) model->push_back(Linear(width, width));
  // dtrain's defaults for everything but the stage: reduce_bucket_size 5e8,
  // stage3_prefetch_bucket_size 5e6, stage3_max_live_parameters 1e9, _reuse_distance 0, ...
  nlohmann::json cfg = {{"train_micro_batch_size_per_gpu", batch},
                        {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 1e-4}}}}},
                        {"zero_optimization", {{"stage", stage}}}};
  if (!zero_json.empty()) cfg["zero_optimization"].update(nlohmann::json::parse(zero_json));
  auto e = dtrain::zero::initialize(model, cfg);
  auto x = torch::randn({batch, width});
  pg->barrier();
  const int64_t after_init = proc_status_bytes("VmRSS");
  reset_peak_rss();
  // DTRAIN_ZERO_BENCH_PHASES=1: rank 0 also prints the peak of each phase (diagnosis).
  const bool phases = std::getenv("DTRAIN_ZERO_BENCH_PHASES") != nullptr && pg->rank() == 0;
  auto phase = [&](const char* what) {
    if (!phases) return;
    std::printf("phase %s: peak %lld MiB, now %lld MiB\n", what,
                (long long)(proc_status_bytes("VmHWM") >> 20),
                (long long)(proc_status_bytes("VmRSS") >> 20));
    reset_peak_rss();
  };
  for (int s = 0; s < steps; ++s) {
    auto loss = e(x).pow(2).mean();
    phase("forward");
    e.backward(loss);
    phase("backward");
    e.step();
    phase("step");
  }
  const int64_t peak = proc_status_bytes("VmHWM");
  auto mine = torch::tensor({double(after_init), double(peak)}, torch::kFloat64);
  auto all = dtrain::all_gather(mine);
  if (pg->rank() == 0) {
    auto m = e.memory();
    std::ostringstream ranks, inits;
    int64_t max_peak = 0;
    for (int r = 0; r < N; ++r) {
      const auto v = all[r];
      ranks << (r ? "," : "") << int64_t(v[1].item<double>());
      inits << (r ? "," : "") << int64_t(v[0].item<double>());
      max_peak = std::max<int64_t>(max_peak, int64_t(v[1].item<double>()));
    }
    std::printf(
        "{\"bench\":\"zero_rss\",\"world\":%d,\"stage\":%d,\"params\":%lld,"
        "\"accounted_bytes\":%lld,\"rss_after_init_bytes\":[%s],\"peak_rss_bytes\":[%s],"
        "\"max_peak_rss_bytes\":%lld}\n",
        N, stage, (long long)e.core().num_parameters(),
        (long long)(m.params() + m.grads() + m.optimizer()), inits.str().c_str(),
        ranks.str().c_str(), (long long)max_peak);
    std::fflush(stdout);
  }
  if (!resume_dir.empty()) {
    // --resume DIR: the checkpoint saved, then loaded back into the same engine; the peak RSS
    // above what the process held before the load is what resuming costs on top of training.
    // --load-only: the checkpoint an earlier run saved there (at another world size, say).
    if (!load_only) e.save_checkpoint(resume_dir, "resume");
    pg->barrier();
    const int64_t before = proc_status_bytes("VmRSS");
    reset_peak_rss();
    e.load_checkpoint(resume_dir, "resume");
    const int64_t extra = proc_status_bytes("VmHWM") - before;
    // This rank's share of the optimizer files: all of them over this run's ranks (one file
    // at the world size of the save).
    int64_t file = 0, files = 0, saved_world = 0;
    for (const auto& f : std::filesystem::directory_iterator(resume_dir + "/resume"))
      if (f.path().filename().string().find("optim_states") != std::string::npos) {
        file = std::max<int64_t>(file, static_cast<int64_t>(f.file_size()));
        files += static_cast<int64_t>(f.file_size());
        ++saved_world;
      }
    auto got = dtrain::all_gather(torch::tensor({double(extra)}, torch::kFloat64));
    if (pg->rank() == 0) {
      std::ostringstream extras;
      int64_t max_extra = 0;
      for (int r = 0; r < N; ++r) {
        const auto v = int64_t(got[r][0].item<double>());
        extras << (r ? "," : "") << v;
        max_extra = std::max(max_extra, v);
      }
      std::printf(
          "{\"bench\":\"zero_resume_rss\",\"world\":%d,\"saved_world\":%lld,\"stage\":%d,"
          "\"params\":%lld,\"load_extra_peak_bytes\":[%s],\"max_load_extra_peak_bytes\":%lld,"
          "\"largest_optim_file_bytes\":%lld,\"own_share_bytes\":%lld}\n",
          N, (long long)saved_world, stage, (long long)e.core().num_parameters(),
          extras.str().c_str(), (long long)max_extra, (long long)file, (long long)(files / N));
      std::fflush(stdout);
    }
  }
  return 0;
}

// Runs rss_worker for every stage and world size, each in fresh processes, and prints the table.
int rss_bench(const std::string& self, const std::string& worlds, int64_t width, int layers,
              int steps, int batch, const std::string& zero_json) {
  std::printf("machine: %s\n", machine().c_str());
  std::printf("zero_optimization: dtrain's defaults%s%s\n", zero_json.empty() ? "" : " and ",
              zero_json.c_str());
  std::stringstream ws(worlds);
  std::string w;
  while (std::getline(ws, w, ',')) {
    double stage0 = 0;
    for (int stage = 0; stage <= 3; ++stage) {
      const std::string cmd = std::string(DTRAIN_LAUNCHER_BIN) + " run --nproc-per-node " + w +
                              " " + self + " rss-worker --stage " + std::to_string(stage) +
                              " --width " + std::to_string(width) + " --layers " +
                              std::to_string(layers) + " --steps " + std::to_string(steps) +
                              " --batch " + std::to_string(batch) +
                              (zero_json.empty() ? "" : " --zero '" + zero_json + "'");
      FILE* p = ::popen(cmd.c_str(), "r");
      if (!p) throw std::runtime_error("cannot run " + cmd);
      std::string json;
      char buf[4096];
      while (std::fgets(buf, sizeof buf, p))
        if (const char* at = std::strstr(buf, "{\"bench\":\"zero_rss\"")) json = at;
      if (::pclose(p) != 0 || json.empty()) throw std::runtime_error("failed: " + cmd);
      auto j = nlohmann::json::parse(json);
      const double peak = j["max_peak_rss_bytes"].get<double>();
      if (stage == 0) stage0 = peak;
      j["ratio_to_stage0"] = peak / stage0;
      std::printf("%s\n", j.dump().c_str());
      std::string per_rank;
      for (auto& v : j["peak_rss_bytes"]) {
        if (!per_rank.empty()) per_rank += ' ';
        per_rank += std::to_string(v.get<int64_t>() >> 20);
      }
      std::printf(
          "world %s stage %d: accounted %.0f MiB, peak RSS per rank [%s] MiB, %.2fx stage 0\n",
          w.c_str(), stage, j["accounted_bytes"].get<double>() / 1048576, per_rank.c_str(),
          peak / stage0);
      std::fflush(stdout);
    }
  }
  return 0;
}

int throughput_bench(int steps, int rounds, const std::string& zero_json) {
  auto pg = dtrain::init_process_group();
  const int r = pg->rank(), N = pg->world_size();
  if (r == 0) std::printf("machine: %s, %d processes\n", machine().c_str(), N);
  using namespace torch::nn;
  const int batch = 64;
  auto make = [] {
    torch::manual_seed(0);
    return Sequential(Linear(1024, 2048), ReLU(), Linear(2048, 2048), ReLU(), Linear(2048, 1024),
                      ReLU(), Linear(1024, 10));
  };
  auto x = torch::randn({batch, 1024});
  auto y = torch::randint(0, 10, {batch}, torch::kLong);
  std::map<std::string, double> best;
  const std::vector<std::string> variants = {
      "ddp",    "stage0",         "stage1", "stage1_overlap",
      "stage2", "stage2_overlap", "stage3", "stage3_overlap"};
  for (int round = 0; round < rounds; ++round) {
    for (const auto& v : variants) {
      auto model = make();
      double secs = 0;
      if (v == "ddp") {
        dtrain::DistributedDataParallel ddp(model);
        torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-4));
        for (int s = -2; s < steps; ++s) {
          if (s == 0) pg->barrier();
          auto t = Clock::now();
          opt.zero_grad();
          functional::cross_entropy(ddp(x), y).backward();
          opt.step();
          if (s >= 0) secs += seconds_since(t);
        }
      } else {
        auto cfg = zero_config(v[5] - '0', batch, false, v.find("overlap") != std::string::npos);
        if (!zero_json.empty()) cfg["zero_optimization"].update(nlohmann::json::parse(zero_json));
        auto e = dtrain::zero::initialize(model, cfg);
        for (int s = -2; s < steps; ++s) {
          if (s == 0) pg->barrier();
          auto t = Clock::now();
          e.backward(functional::cross_entropy(e(x), y));
          e.step();
          if (s >= 0) secs += seconds_since(t);
        }
      }
      // A step is done when its slowest rank is.
      auto t = torch::tensor({secs}, torch::kFloat64);
      dtrain::AllReduceOptions o;
      o.op = dtrain::ReduceOp::kMax;
      dtrain::all_reduce(t, o);
      double sps = double(steps) * batch * N / t.item<double>();
      best[v] = std::max(best[v], sps);
    }
  }
  if (r == 0) {
    for (const auto& v : variants)
      std::printf(
          "{\"bench\":\"zero_throughput\",\"world\":%d,\"variant\":\"%s\",\"samples_per_s\":%.1f,"
          "\"vs_ddp\":%.3f}\n",
          N, v.c_str(), best[v], best[v] / best["ddp"]);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "adam")
      return adam_bench(std::stoll(arg(argc, argv, "--params", "100000000")),
                        std::stoi(arg(argc, argv, "--reps", "5")));
    if (mode == "memory") return memory_bench();
    if (mode == "rss")
      return rss_bench(
          std::filesystem::read_symlink("/proc/self/exe").string(),
          arg(argc, argv, "--worlds", "2,4"), std::stoll(arg(argc, argv, "--width", "2048")),
          std::stoi(arg(argc, argv, "--layers", "20")), std::stoi(arg(argc, argv, "--steps", "3")),
          std::stoi(arg(argc, argv, "--batch", "8")), arg(argc, argv, "--zero", ""));
    if (mode == "rss-worker")
      return rss_worker(std::stoi(arg(argc, argv, "--stage", "0")),
                        std::stoll(arg(argc, argv, "--width", "2048")),
                        std::stoi(arg(argc, argv, "--layers", "20")),
                        std::stoi(arg(argc, argv, "--steps", "3")),
                        std::stoi(arg(argc, argv, "--batch", "8")), arg(argc, argv, "--zero", ""),
                        arg(argc, argv, "--resume", ""), has_flag(argc, argv, "--load-only"));
    if (mode == "throughput")
      return throughput_bench(std::stoi(arg(argc, argv, "--steps", "20")),
                              std::stoi(arg(argc, argv, "--rounds", "3")),
                              arg(argc, argv, "--zero", ""));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero_bench: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr,
               "usage: zero_bench adam [--params N] [--reps R] | memory | throughput [--steps S] "
               "[--rounds R] | rss [--width W] [--layers L] [--steps S] [--worlds 2,4] "
               "[--batch B]\n");
  return 2;
}
