// dtrain::data's delivery rate: one rank of `dtrain run --nproc-per-node N data_bench
// --data parquet:DIR`, reading the Fashion-MNIST table (image: 784 pixels, label) as the
// example does, into float32 [B, 784] and int64 [B] tensors, and doing nothing else with them:
// samples/s delivered to the training loop. Prints one JSON line per rank:
//   {"rank": r, "samples": n, "seconds": s, "samples_per_s": n / s, "peak_rss_mb": ...,
//    "epoch_seconds": [...], "cpu_seconds": user + system CPU time of the process}
// --cache-bytes, --share-cache (0/1) and --thread-nice set ReaderOptions' (their defaults
// otherwise).
// bench/data_bench.py runs it beside Petastorm and a PyTorch DataLoader over pyarrow.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/data_reader.h"
#include "dtrain/env.h"

int main(int argc, char** argv) {
  std::string location;
  dtrain::data::ReaderOptions defaults;
  int epochs = 1, threads = defaults.threads, prefetch = defaults.prefetch,
      nice = defaults.thread_nice;
  int64_t batch = 64, cache = defaults.cache_bytes;
  std::optional<bool> share;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--data") location = argv[i + 1];
    if (a == "--epochs") epochs = std::stoi(argv[i + 1]);
    if (a == "--batch-size") batch = std::stoll(argv[i + 1]);
    if (a == "--threads") threads = std::stoi(argv[i + 1]);
    if (a == "--prefetch") prefetch = std::stoi(argv[i + 1]);
    if (a == "--cache-bytes") cache = std::stoll(argv[i + 1]);
    if (a == "--thread-nice") nice = std::stoi(argv[i + 1]);
    if (a == "--share-cache") share = std::stoi(argv[i + 1]) != 0;
  }
  if (location.empty()) {
    std::fprintf(
        stderr,
        "usage: data_bench --data parquet:DIR [--epochs N] [--batch-size B] "
        "[--threads T] [--prefetch P] [--cache-bytes C] [--share-cache 0|1] [--thread-nice N]\n");
    return 2;
  }
  try {
    dtrain::data::Reader reader(
        dtrain::data::Table::open(location),
        {.columns = {{.name = "image", .dtype = torch::kFloat32, .shape = {784}},
                     {.name = "label", .dtype = torch::kLong}},
         .batch_size = batch,
         .threads = threads,
         .prefetch = prefetch,
         .cache_bytes = cache,
         .share_cache = share,
         .thread_nice = nice});
    int64_t samples = 0;
    double checksum = 0;
    std::vector<double> epoch_seconds;
    auto t0 = std::chrono::steady_clock::now();
    for (int e = 0; e < epochs; ++e) {
      auto e0 = std::chrono::steady_clock::now();
      reader.set_epoch(e);
      while (auto b = reader.next()) {
        samples += b->rows;
        checksum += static_cast<double>(b->at("label")[0].item<int64_t>());
      }
      epoch_seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - e0).count());
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::string per_epoch;
    for (double s : epoch_seconds) per_epoch += (per_epoch.empty() ? "" : ", ") + std::to_string(s);
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    auto env = dtrain::WorkerEnv::from_environ();
    std::printf(
        "{\"rank\": %d, \"samples\": %lld, \"seconds\": %.4f, \"samples_per_s\": %.1f, "
        "\"peak_rss_mb\": %.1f, \"checksum\": %.0f, \"epoch_seconds\": [%s], "
        "\"cpu_seconds\": %.3f}\n",
        env ? env->rank : 0, static_cast<long long>(samples), secs, samples / secs,
        ru.ru_maxrss / 1024.0, checksum, per_epoch.c_str(),
        ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
            (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "data_bench: %s\n", e.what());
    return 1;
  }
}
