// All-reduce benchmark worker: run it under a launcher, e.g.
//
//   dtrain run --nproc-per-node 2 build/bench/allreduce_bench
//
// For each size (--min-bytes .. --max-bytes, multiplying by --factor) it all-reduces a
// float32 tensor (sum) with dtrain::all_reduce: untimed warm-up, then the timed iterations
// in 5 blocks, each started by a barrier. A block's time per op is the slowest rank's (a
// collective is done when its last rank is); the figure is the best block, with the
// median block beside it. Rank 0 prints one JSON line per size:
//   {"impl":"dtrain-<backend>","world":2,"bytes":1024,"iters":1000,"time_us":...,"median_us":...,
//    "algbw_gbps":...,"busbw_gbps":...}
// algbw = bytes / time; busbw = algbw * 2(n-1)/n, what a ring all-reduce moves per rank.
//
// --backend auto|shm|gloo (default auto) is init_process_group's backend; "impl" names the
// one chosen.
//
// Iterations per size: --iters if given, else min(1000, max(5, 256 MiB / bytes)), so that
// each size takes roughly the same time; warm-up is a tenth of that (at least 2).
// bench/allreduce_bench.py uses the same rule for torch.distributed.
#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "dtrain/collectives.h"

namespace {

// Timed iterations are split into blocks, each started by a barrier; the figure is the best
// block (on a shared machine a load spike then spoils one block, not the whole size).
constexpr int kBlocks = 5;

int64_t parse_size(const std::string& s) {
  // Accepts 1024, 1K, 4M, 64MiB-style suffixes (binary).
  size_t pos = 0;
  int64_t v = std::stoll(s, &pos);
  std::string suffix = s.substr(pos);
  if (suffix.empty() || suffix == "B") return v;
  char c = static_cast<char>(std::toupper(static_cast<unsigned char>(suffix[0])));
  if (c == 'K') return v << 10;
  if (c == 'M') return v << 20;
  if (c == 'G') return v << 30;
  throw std::invalid_argument("bad size '" + s + "'");
}

}  // namespace

int main(int argc, char** argv) {
  int64_t min_bytes = 1 << 10;
  int64_t max_bytes = 64 << 20;
  int64_t factor = 4;
  int iters_override = 0;
  std::string backend = "auto";
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "allreduce_bench: %s needs a value\n", k.c_str());
      return 2;
    }
    std::string v = argv[++i];
    if (k == "--min-bytes")
      min_bytes = parse_size(v);
    else if (k == "--max-bytes")
      max_bytes = parse_size(v);
    else if (k == "--factor")
      factor = std::stoll(v);
    else if (k == "--iters")
      iters_override = std::stoi(v);
    else if (k == "--backend")
      backend = v;
    else {
      std::fprintf(stderr, "allreduce_bench: unknown argument %s\n", k.c_str());
      return 2;
    }
  }
  if (factor < 2 || min_bytes < 4 || max_bytes < min_bytes) {
    std::fprintf(stderr,
                 "allreduce_bench: need --factor >= 2 and 4 <= --min-bytes <= --max-bytes\n");
    return 2;
  }
  try {
    dtrain::ProcessGroupOptions po;
    po.backend = backend;
    auto group = dtrain::init_process_group(po);
    const int rank = group->rank();
    const int world = group->world_size();
    for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= factor) {
      const int64_t n = bytes / 4;
      // Zeros: the sum stays zero, so no overflow to inf and no denormals over the iterations.
      auto t = torch::zeros({n}, torch::kFloat32);
      const int iters =
          iters_override > 0
              ? iters_override
              : static_cast<int>(std::clamp<int64_t>((int64_t{256} << 20) / bytes, 5, 1000));
      const int warmup = std::max(2, iters / 10);
      const int per_block = std::max(1, iters / kBlocks);
      for (int i = 0; i < warmup; ++i) dtrain::all_reduce(t);
      std::vector<double> block_seconds;
      for (int b = 0; b < kBlocks; ++b) {
        dtrain::barrier();
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < per_block; ++i) dtrain::all_reduce(t);
        double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
            per_block;
        auto slowest = torch::full({1}, seconds, torch::kFloat64);
        dtrain::AllReduceOptions max_op;
        max_op.op = dtrain::ReduceOp::kMax;
        dtrain::all_reduce(slowest, max_op);
        block_seconds.push_back(slowest.item<double>());
      }
      std::sort(block_seconds.begin(), block_seconds.end());
      const double best = block_seconds.front();
      const double median = block_seconds[block_seconds.size() / 2];
      if (rank == 0) {
        const double algbw = static_cast<double>(bytes) / best / 1e9;
        std::printf(
            "{\"impl\":\"dtrain-%s\",\"world\":%d,\"bytes\":%lld,\"iters\":%d,\"time_us\":%.3f,"
            "\"median_us\":%.3f,\"algbw_gbps\":%.4f,\"busbw_gbps\":%.4f}\n",
            group->backend_name().c_str(), world, static_cast<long long>(bytes),
            per_block * kBlocks, best * 1e6, median * 1e6, algbw,
            algbw * 2.0 * (world - 1) / world);
        std::fflush(stdout);
      }
    }
    dtrain::barrier();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
