// dtrain::timeline: where every rank spends its time, as one Chrome-trace JSON file.
//
// DTRAIN_TIMELINE=FILE (or timeline::start(FILE)) records on every rank: the spans a program
// marks (the Fashion-MNIST example marks data loading, forward, backward, optimizer step),
// DDP's bucket all-reduces (launch, with bytes) and the waits for their results, and each
// synchronous collective. At exit every rank writes FILE.rank<N>.json; rank 0 waits (up to
// DTRAIN_TIMELINE_MERGE_TIMEOUT seconds, default 30) for the others' files and merges them
// into FILE: one track (pid) per rank, one row (tid) per thread. Perfetto
// (ui.perfetto.dev) and chrome://tracing open it.
//
// Collectives on the shared-memory backend are split into time waiting for peers (spans
// named kWaitForPeers inside the op's span, on the backend's thread) and time transferring
// (copies and reductions: the rest of the op); each op's span carries both as args
// (wait_for_peers_us, transfer_us). Gloo's ops are one span each (Gloo does not expose the
// split).
//
// Off, a span costs one relaxed atomic load.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::timeline {

namespace detail {
extern std::atomic<bool> g_enabled;
int64_t now_us() noexcept;
void record(const char* name, const char* category, int64_t begin_us, int64_t end_us, int64_t bytes,
            int64_t index) noexcept;
}  // namespace detail

// The name of the spans that time a wait for peer ranks inside a collective.
inline constexpr const char kWaitForPeers[] = "wait for peers";

inline bool enabled() noexcept { return detail::g_enabled.load(std::memory_order_relaxed); }

// Starts recording; this rank's spans go to PATH.rank<rank>.json and the merged trace to PATH.
void start(const std::string& path, int rank, int world_size);
// Stops, writes this rank's file, and on rank 0 merges every rank's file into PATH.
// Returns the file written (the merged one on rank 0). Called at exit when still recording.
std::string stop();

// Merges rank files (each a Chrome trace of one rank) into one trace at `out`.
void merge(const std::vector<std::string>& rank_files, const std::string& out);

// A span on the calling thread: begins here, ends at destruction. `name` and `category`
// must outlive the program (string literals). `bytes`/`index` (-1: none) become args.
class Span {
 public:
  explicit Span(const char* name, const char* category = "dtrain", int64_t bytes = -1,
                int64_t index = -1) noexcept
      : name_(name),
        category_(category),
        bytes_(bytes),
        index_(index),
        begin_(enabled() ? detail::now_us() : -1) {}
  ~Span() {
    if (begin_ >= 0) detail::record(name_, category_, begin_, detail::now_us(), bytes_, index_);
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  const char* name_;
  const char* category_;
  int64_t bytes_, index_, begin_;
};

}  // namespace dtrain::timeline
