// One process group's collective diagnosis: the flight recorder's ring buffer, the stall
// watchdog and DETAIL mode's fingerprint check (public side: dtrain/debug.h,
// dtrain/flight_recorder.h; published format: diagnosis/records.h).
//
// The hot path (enter/complete) takes one mutex held for a few stores into a preallocated
// ring slot; it never touches the network unless the level is DETAIL. Everything that
// talks to the store at level info runs on the watchdog thread, started by the first
// collective:
//   every tick: if the ring changed, publish this rank's Progress (one store set);
//               if the oldest collective still in flight has waited stall_timeout and was not
//               reported yet, read every rank's Progress and print ONE stall report naming
//               the ranks whose last entered collective is older.
// Thread-safety: every method may be called from any thread.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/thread_annotations.h"
#include "diagnosis/records.h"
#include "dtrain/debug.h"
#include "dtrain/flight_recorder.h"

namespace dtrain::diagnosis {

// Parses DTRAIN_DEBUG and DTRAIN_STALL_TIMEOUT; UsageError naming the variable if malformed
// (init_process_group calls it before joining, so a typo fails before peers wait for us).
void check_environment();

class GroupMonitor {
 public:
  // Reads DTRAIN_DEBUG and DTRAIN_STALL_TIMEOUT (UsageError if malformed).
  GroupMonitor(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size);
  // Stops and joins the watchdog (at most one store request in flight to wait for).
  ~GroupMonitor();
  GroupMonitor(const GroupMonitor&) = delete;
  GroupMonitor& operator=(const GroupMonitor&) = delete;

  void set_level(DebugLevel level) { level_.store(level); }
  DebugLevel level() const { return level_.load(); }
  void set_stall_timeout(std::chrono::milliseconds timeout);
  std::chrono::milliseconds stall_timeout() const;

  // A collective of every rank is about to be issued. Records it and returns its sequence
  // number (0 at level off: nothing recorded). At level detail, first checks that every rank
  // issues the same one (waiting up to `timeout` for them): throws CollectiveMismatchError
  // (or TimeoutError) after recording it as failed.
  std::uint64_t enter(const char* op, at::TensorList tensors, std::chrono::milliseconds timeout);
  void complete(std::uint64_t seq);
  void fail(std::uint64_t seq, const std::string& error);
  void abandon(std::uint64_t seq);

  std::vector<CollectiveRecord> recent() const;
  std::optional<std::string> last_stall_report() const;
  // Publishes now (on the caller's thread), e.g. just before an error leaves the rank.
  void publish_now();

 private:
  void start_watchdog();
  void watchdog_loop();
  std::chrono::milliseconds tick() const;
  Progress snapshot_locked() const DTRAIN_REQUIRES(mu_);
  void publish(const Progress& progress);
  std::string stall_report(const CollectiveRecord& stuck, std::chrono::milliseconds stall);
  void detail_check(std::uint64_t seq, const std::string& fingerprint,
                    std::chrono::milliseconds timeout);
  CollectiveRecord* slot_locked(std::uint64_t seq) DTRAIN_REQUIRES(mu_);
  void finish(std::uint64_t seq, CollectiveState state, const std::string& error);

  const c10::intrusive_ptr<c10d::Store> store_;
  const int rank_;
  const int world_size_;
  std::atomic<DebugLevel> level_{DebugLevel::kInfo};
  std::atomic<std::int64_t> stall_ms_{60000};

  // Assigned by the first collective (a store add), read-only afterwards.
  std::once_flag started_;
  std::string gid_;

  mutable Mutex mu_;
  std::vector<CollectiveRecord> ring_ DTRAIN_GUARDED_BY(mu_);  // slot seq % size
  std::uint64_t seq_ DTRAIN_GUARDED_BY(mu_) = 0;               // last seq given out
  std::uint64_t completed_ DTRAIN_GUARDED_BY(mu_) = 0;         // newest completed seq
  std::uint64_t version_ DTRAIN_GUARDED_BY(mu_) = 0;           // bumped on every change
  std::uint64_t reported_ DTRAIN_GUARDED_BY(mu_) = 0;          // last seq a stall report covered
  std::optional<std::string> last_report_ DTRAIN_GUARDED_BY(mu_);
  bool stop_ DTRAIN_GUARDED_BY(mu_) = false;
  std::condition_variable cv_;

  Mutex publish_mu_;  // one store writer at a time (watchdog vs publish_now)
  std::thread watchdog_;
};

}  // namespace dtrain::diagnosis
