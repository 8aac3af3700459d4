// A worker for tests/diagnosis/diagnosis_mp_test.cpp, run under `dtrain run`; rank 1 misbehaves.
//
//   diagnosis_worker --mode mismatch   (run with DTRAIN_DEBUG=detail)
//     Three agreeing all_reduces, then rank 1 calls broadcast where the others call
//     all_reduce. Every rank prints "diagnosis_worker rank R: CollectiveMismatchError: <what>"
//     and exits 0; exit 4 if the collective went through.
//   diagnosis_worker --mode skip       (run with a small DTRAIN_STALL_TIMEOUT)
//     Three all_reduces, then rank 1 skips the fourth: it sleeps --sleep-ms (default 3000)
//     and exits 0. The others wait in all_reduce #4 (group timeout --timeout-ms, default
//     20000) until rank 1's exit breaks the group, print the error and exit 3.
//   diagnosis_worker --mode die
//     Three all_reduces, then rank 1 sleeps --sleep-ms (so its watchdog publishes) and
//     SIGKILLs itself; the others enter all_reduce #4 and fail (or are stopped by the agent).
#include <torch/torch.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "dtrain/collectives.h"
#include "dtrain/debug.h"
#include "dtrain/error.h"

int main(int argc, char** argv) {
  std::string mode;
  int sleep_ms = 3000;
  int timeout_ms = 20000;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--mode")
      mode = argv[i + 1];
    else if (k == "--sleep-ms")
      sleep_ms = std::atoi(argv[i + 1]);
    else if (k == "--timeout-ms")
      timeout_ms = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "diagnosis_worker: unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  if (mode != "mismatch" && mode != "skip" && mode != "die") {
    std::fprintf(stderr, "diagnosis_worker: --mode mismatch|skip|die\n");
    return 2;
  }
  dtrain::ProcessGroupOptions po;
  po.timeout = std::chrono::milliseconds(timeout_ms);
  auto group = dtrain::init_process_group(po);
  const int rank = group->rank();
  auto t = torch::ones({4});
  for (int i = 0; i < 3; ++i) dtrain::all_reduce(t);
  std::printf("diagnosis_worker rank %d: 3 all_reduces done\n", rank);
  std::fflush(stdout);
  try {
    if (mode == "mismatch" && rank == 1) {
      dtrain::broadcast(t);
    } else if (mode == "skip" && rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
      return 0;
    } else if (mode == "die" && rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
      std::raise(SIGKILL);
    } else {
      dtrain::all_reduce(t);
    }
  } catch (const dtrain::CollectiveMismatchError& e) {
    std::printf("diagnosis_worker rank %d: CollectiveMismatchError: %s\n", rank, e.what());
    std::fflush(stdout);
    return 0;
  } catch (const dtrain::Error& e) {
    std::fprintf(stderr, "diagnosis_worker rank %d: error: %s\n", rank, e.what());
    std::fflush(stderr);
    return 3;
  }
  std::printf("diagnosis_worker rank %d: the fourth collective went through\n", rank);
  return 4;
}
