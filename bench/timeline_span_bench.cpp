// The cost of one timeline span, off and on (Google Benchmark). bench/timeline_bench.py
// multiplies it by the spans a training step records to state the timeline's overhead per
// step without the noise of whole-run timings.
//
//   build/bench/timeline_span_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "dtrain/timeline.h"

namespace {

namespace tl = dtrain::timeline;

// Recording off: what every hook costs in a run without DTRAIN_TIMELINE.
void BM_SpanOff(benchmark::State& state) {
  for (auto _ : state) {
    tl::Span span("bench", "compute", 4096);
    benchmark::DoNotOptimize(&span);
  }
}
BENCHMARK(BM_SpanOff);

// Recording on: the clock reads and the append under the recorder's lock.
void BM_SpanOn(benchmark::State& state) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("dtrain_span_bench_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  tl::start((dir / "timeline.json").string(), 0, 1);
  for (auto _ : state) {
    tl::Span span("bench", "compute", 4096);
    benchmark::DoNotOptimize(&span);
  }
  tl::stop();
  std::filesystem::remove_all(dir);
}
// A fixed count: every recorded span stays in memory until stop() writes the file.
BENCHMARK(BM_SpanOn)->Iterations(200000);

}  // namespace

BENCHMARK_MAIN();
