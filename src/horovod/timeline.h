// Horovod's timeline (HOROVOD_TIMELINE=FILE): one Chrome trace for the job, written by rank 0
// (Horovod's coordinator), with one row per tensor name and Horovod's phases on it:
//
//   NEGOTIATE_ALLREDUCE   from the cycle a name is first seen on any rank to the cycle every
//     "0" "1" ...         rank has submitted it; an instant per rank as its request arrives
//                         (names agreed through the response cache have no per-rank marks,
//                         as in Horovod)
//   ALLREDUCE             from the start of the cycle's execution to the result, holding
//     QUEUE               waiting behind the requests executed before it in this cycle
//     MEMCPY_IN_FUSION_BUFFER   copying into the fusion buffer (fused or converted requests)
//     SHM_ALLREDUCE / GLOO_ALLREDUCE   the collective on hvd's group (backend's name, as
//                         Horovod's MPI_ALLREDUCE / GLOO_ALLREDUCE)
//     MEMCPY_OUT_FUSION_BUFFER  copying the results out
//   (ALLGATHER, BROADCAST, ALLTOALL, REDUCESCATTER, BARRIER, JOIN likewise: QUEUE and the
//   collective, e.g. SHM_BCAST.)
//
// Format as Horovod's writer: a JSON array of trace events, each tensor a "process" (pid
// 1, 2, ... named by the tensor; pid 0 carries start_time_since_epoch_in_micros), B/E pairs
// for spans, ts in microseconds since hvd::init(). The file is rewritten to stay valid JSON
// after every flush (about once a second and at shutdown), so a job that dies leaves a
// readable trace; a span still open in it (a NEGOTIATE_* without its end) is what hung.
// HOROVOD_TIMELINE_MARK_CYCLES=1 adds a CYCLE_START instant per negotiation cycle.
//
// Thread-safety: used by hvd's background thread only (and closed after it stopped).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "timeline/chrome_trace.h"

namespace dtrain::hvd::detail {

class Timeline {
 public:
  // Opens (truncates) `path`. Throws UsageError when it cannot be written.
  Timeline(const std::string& path, bool mark_cycles);
  ~Timeline();  // flushes and closes
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // `kind` is the request's kind in capitals ("ALLREDUCE"): the span is "NEGOTIATE_<kind>".
  void negotiate_start(const std::string& name, const char* kind);
  void negotiate_rank_ready(const std::string& name, int rank);
  void negotiate_end(const std::string& name);
  // The top-level span ("ALLREDUCE", ...) and activities inside it (one at a time).
  void start(const std::string& name, const char* what, int64_t bytes);
  void activity_start(const std::string& name, const char* activity);
  void activity_end(const std::string& name);
  // Ends the open activity, if any, and the top-level span; args name dtype and shape.
  void end(const std::string& name, const std::string& dtype, const std::string& shape);
  void mark_cycle_start();
  bool mark_cycles() const { return mark_cycles_; }
  // Writes what is buffered when a second passed since the last write (or `force`).
  void flush(bool force = false);

 private:
  enum class State { kNone, kNegotiating, kTopLevel, kActivity };
  int64_t now_us() const;
  int pid(const std::string& name);  // the tensor's row, with its metadata on first use
  void event(int pid, char phase, const char* op, const trace::Event& args = {});
  static std::string sort_index(int pid);  // the row's process_sort_index metadata event

  std::string path_;
  std::FILE* file_ = nullptr;
  bool mark_cycles_;
  bool first_flush_ = true;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_flush_;
  std::string buffer_;  // events not yet written, each followed by ",\n"
  std::map<std::string, int> pids_;
  std::map<std::string, State> states_;
};

}  // namespace dtrain::hvd::detail
