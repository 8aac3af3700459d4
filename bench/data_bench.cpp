// dtrain::data's delivery rate: one rank of `dtrain run --nproc-per-node N data_bench
// --data parquet:DIR`, reading the Fashion-MNIST table (image: 784 pixels, label) as the
// example does, into float32 [B, 784] and int64 [B] tensors, and doing nothing else with them:
// samples/s delivered to the training loop. Prints one JSON line per rank:
//   {"rank": r, "samples": n, "seconds": s, "samples_per_s": n / s, "peak_rss_mb": ...}
// bench/data_bench.py runs it beside Petastorm and a PyTorch DataLoader over pyarrow.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "dtrain/data_reader.h"
#include "dtrain/env.h"

int main(int argc, char** argv) {
  std::string location;
  int epochs = 1, threads = 2, prefetch = 4;
  int64_t batch = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--data") location = argv[i + 1];
    if (a == "--epochs") epochs = std::stoi(argv[i + 1]);
    if (a == "--batch-size") batch = std::stoll(argv[i + 1]);
    if (a == "--threads") threads = std::stoi(argv[i + 1]);
    if (a == "--prefetch") prefetch = std::stoi(argv[i + 1]);
  }
  if (location.empty()) {
    std::fprintf(stderr,
                 "usage: data_bench --data parquet:DIR [--epochs N] [--batch-size B] "
                 "[--threads T] [--prefetch P]\n");
    return 2;
  }
  try {
    dtrain::data::Reader reader(
        dtrain::data::Table::open(location),
        {.columns = {{.name = "image", .dtype = torch::kFloat32, .shape = {784}},
                     {.name = "label", .dtype = torch::kLong}},
         .batch_size = batch,
         .threads = threads,
         .prefetch = prefetch});
    int64_t samples = 0;
    double checksum = 0;
    auto t0 = std::chrono::steady_clock::now();
    for (int e = 0; e < epochs; ++e) {
      reader.set_epoch(e);
      while (auto b = reader.next()) {
        samples += b->rows;
        checksum += static_cast<double>(b->at("label")[0].item<int64_t>());
      }
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    auto env = dtrain::WorkerEnv::from_environ();
    std::printf(
        "{\"rank\": %d, \"samples\": %lld, \"seconds\": %.4f, \"samples_per_s\": %.1f, "
        "\"peak_rss_mb\": %.1f, \"checksum\": %.0f}\n",
        env ? env->rank : 0, static_cast<long long>(samples), secs, samples / secs,
        ru.ru_maxrss / 1024.0, checksum);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "data_bench: %s\n", e.what());
    return 1;
  }
}
