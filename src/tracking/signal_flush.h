// Deliver what an MLflow run has queued when the process is told to stop (SIGTERM, SIGINT).
//
// `dtrain run` (as torchrun) stops the surviving workers of a failed job with SIGTERM; without
// this, whatever rank 0's run had queued since the last batch (its params, the last steps'
// metrics) died with the process. A run registers a flusher here; on the first SIGTERM or
// SIGINT whose disposition was the default, a watcher thread runs every flusher (all of them
// within the longest run's bound), then the signal's default action runs as before, so the process
// still dies of the signal (exit status unchanged). A handler the program installed is never
// replaced, and a second signal during the flush kills at once.
#pragma once

#include <chrono>
#include <functional>

namespace dtrain::mlflow::detail {

// Called on the watcher thread: `start` for every run first (ask for delivery; returns at once),
// then `finish` for each (wait until the signal's time plus the run's own bound, keep the rest),
// so several open runs take the longest bound, not their sum.
struct SignalFlusher {
  std::function<void()> start;
  std::function<void(std::chrono::steady_clock::time_point signalled_at)> finish;
};

// Returns a token for unregister_signal_flusher. Installs the handlers on first use.
int register_signal_flusher(SignalFlusher flusher);
void unregister_signal_flusher(int token);

}  // namespace dtrain::mlflow::detail
