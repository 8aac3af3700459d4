// hvd's background thread: negotiation by name, fusion, execution, stall check. One class,
// in four files as Horovod splits its controller: controller.cpp (the cycle and negotiation),
// wire.{h,cpp} (the request line), response_cache.cpp (the response cache), ops.cpp
// (execution: fused allreduce, Adasum, every other kind).
//
// The protocol, one cycle (every cycle_time, on every rank's background thread):
//   1. Each rank serialises the requests its callers queued since the last cycle (one line
//      each: name, kind, dtype, shape, options) plus its flags (joined, shutting down, stall
//      shutdown) and all-gathers them on hvd's group: one fixed 4 KiB slot per rank, or,
//      when some rank's lines are longer, a lengths-then-bytes all-gather every rank falls
//      back to alike. This is the only collective of a cycle that runs nothing.
//   2. Every rank folds every rank's lines into the same table: name -> the request of each
//      rank that submitted it, with rank 0's submission number and the time it was first
//      seen. All ranks see the same lines in the same order, so their tables agree.
//   3. A name is ready when every rank that has not joined submitted it. Ready names are
//      sorted by (cycle in which they became ready, the submission number on the lowest
//      non-joined rank): the same order on every rank, whatever order ranks submitted in.
//      Requests whose kind, dtype or shape disagree across ranks fail on every rank with a
//      UsageError naming the ranks (decided from the table, so no rank waits for another).
//   4. The ready requests run in that order; consecutive allreduces with equal dtype, op,
//      scale factors and compression are fused into buffers of at most fusion_threshold bytes.
//   5. Stall check: a name some ranks submitted and others not for stall_check_time makes
//      rank 0 print Horovod's warning naming it and the missing ranks; after
//      stall_shutdown_time rank 0 sets its stall flag, and every rank then fails all pending
//      requests with the report.
// Idle ranks still cycle (a heartbeat, see below), as Horovod's do, so a rank stuck in user
// code is noticed.
//
// Who runs a cycle: the background thread, or a caller waiting on a result (synchronize(),
// DistributedOptimizer::step()) when a cycle is due and the background thread is not in one
// (Controller::wait; cycle_mu_ makes them take turns). The cycle is the same either way; the
// caller running it saves the two thread hand-offs (wake the thread, be woken by it) that
// cost a context switch each, twice per step, on a loaded 2-core machine.
//
// The response cache (Horovod's idea, HOROVOD_CACHE_CAPACITY, default 1024; 0 turns it off):
// an allreduce, broadcast or reducescatter that ran after a full negotiation in which every
// rank submitted the same request gets a cache bit - the same on every rank, as every rank
// executes the same names in the same order. A later request with that name and the same
// signature is a hit: the rank holds it under its bit. Each cycle then starts with one small
// sum all-reduce of int32 [ranks needing the full exchange, ranks with new requests, per bit
// the ranks holding it]; bits every rank holds run at once (in bit order, fused), and only
// when some rank has a request that missed (or a flag: shutdown, stall, a joined rank, or a
// hit unmatched for min(1 s, stall check / 2)) do all ranks go on to the full exchange above,
// announcing the hits they still hold with their new requests.
//
// When a cycle starts (every cycle is a collective: a rank that starts early sleeps in it
// until the others start theirs):
//   - new requests queued: HOROVOD_CYCLE_TIME after the first of them (so a backward pass's
//     gradients are fused), or at once when a caller waits on a result (synchronize(),
//     DistributedOptimizer::step()): nothing more is coming from it, so the last gradients
//     of a step go out without waiting for the cycle boundary;
//   - requests in flight, a caller waiting and the last cycle made progress (something ran or
//     some rank had new requests): at once; otherwise one cycle time after the last;
//   - nothing queued or in flight here: a heartbeat every 50 ms (kIdleHeartbeat), so no
//     cycle takes CPU from forward and backward; a peer that submits meanwhile sleeps in its
//     cycle's collective until this rank's own submission (or the heartbeat) starts ours.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/thread_annotations.h"
#include "dtrain/horovod.h"
#include "dtrain/process_group.h"
#include "horovod/timeline.h"

namespace dtrain::hvd::detail {

using Clock = std::chrono::steady_clock;

enum class Kind { kAllreduce, kAllgather, kBroadcast, kAlltoall, kReducescatter, kJoin, kBarrier };
const char* kind_name(Kind k);
const char* kind_upper(Kind k);  // "ALLREDUCE", ...: Horovod's names on the timeline

// Where a caller waits for a request's result.
struct Pending {
  Mutex mu;
  std::condition_variable cv;
  bool done DTRAIN_GUARDED_BY(mu) = false;
  // Written once under mu before done is set, read only after done was seen: from then on
  // they do not change, and readers need no lock.
  std::exception_ptr error;
  torch::Tensor result;
  torch::Tensor extra;      // alltoall: received splits
  int join_last_rank = -1;  // join: the rank that joined last
  void finish(torch::Tensor out, std::exception_ptr err = nullptr) DTRAIN_EXCLUDES(mu);
};

struct Request {
  Kind kind = Kind::kAllreduce;
  std::string name;
  torch::Tensor tensor;  // input (in place: also the output)
  bool in_place = false;
  AllreduceOptions reduce;      // allreduce / reducescatter: op, compression, scale factors
  int root = 0;                 // broadcast
  std::vector<int64_t> splits;  // alltoall
  std::shared_ptr<Pending> pending;
};

struct ControllerOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  int64_t fusion_threshold = 64 * 1024 * 1024;  // HOROVOD_FUSION_THRESHOLD (bytes)
  int64_t cache_capacity = 1024;                // HOROVOD_CACHE_CAPACITY (0: no response cache)
  // HOROVOD_CYCLE_TIME (ms, fractional). Default 5 ms (Horovod's older default): on few cores
  // every cycle's negotiation takes CPU from backward; 1 ms measured 0.7-0.8x of DDP there.
  std::chrono::microseconds cycle_time{5000};
  double stall_check_seconds = 60;      // HOROVOD_STALL_CHECK_TIME_SECONDS
  double stall_shutdown_seconds = 0;    // HOROVOD_STALL_SHUTDOWN_TIME_SECONDS
  bool stall_check = true;              // HOROVOD_STALL_CHECK_DISABLE=1 turns it off
  std::string timeline;                 // HOROVOD_TIMELINE: rank 0 writes it
  bool timeline_mark_cycles = false;    // HOROVOD_TIMELINE_MARK_CYCLES=1
  static ControllerOptions from_env();  // UsageError for a malformed variable
};

class Controller {
 public:
  // Throws UsageError when rank 0 cannot write options.timeline.
  Controller(std::shared_ptr<ProcessGroup> group, ControllerOptions options);
  ~Controller();  // stops the thread (shutdown() first for an orderly stop)

  // Queues a request; the caller waits on request.pending. Throws UsageError when hvd is
  // shut down or the request is malformed here (checked before anything is sent).
  void submit(Request request);
  // A caller starts (+1) or stops (-1) waiting on a result: cycles start at once meanwhile
  // (the caller runs them in wait(); this does not wake the thread).
  void add_waiter(int delta);
  // A waiter (between add_waiter(1) and add_waiter(-1)) waits for `p`, up to `timeout`: it runs
  // the due cycles itself when the background thread is not in one (saves two thread
  // hand-offs per cycle), else sleeps until `p` is done or the next cycle is due.
  void wait(Pending& p, std::chrono::milliseconds timeout);
  // Announces this rank's shutdown and waits until every rank announced it (up to the
  // timeout), then stops the thread. Pending requests fail.
  void shutdown();
  const ControllerOptions& options() const { return options_; }
  ProcessGroup& group() { return *group_; }

 private:
  struct Entry {                   // one name in the negotiation table
    std::vector<std::string> sig;  // per rank: its request line ("" = not submitted)
    std::vector<int64_t> seq;      // per rank: its submission number
    Clock::time_point first_seen;
    int count = 0;
  };
  struct StallFindings {
    std::string message;  // Horovod's stall report; empty when nothing is stalled
    bool shut_down = false;
  };
  static constexpr std::chrono::milliseconds kIdleHeartbeat{50};
  struct CacheEntry {  // identical on every rank
    std::string sig;   // the request's line without its submission number
    int bit = 0;
    Kind kind = Kind::kAllreduce;
    int64_t last_used = 0;  // exec_counter_ at its last run (LRU eviction)
  };

  void loop();
  // Whether a cycle is due now; else *due says when.
  bool cycle_due(Clock::time_point* due) DTRAIN_REQUIRES(mu_);
  // One cycle; false once the protocol ended (shutdown, stall, failure).
  bool run_cycle() DTRAIN_REQUIRES(cycle_mu_) DTRAIN_EXCLUDES(mu_);
  void negotiate_and_run();
  std::vector<std::string> exchange(const std::string& msg);  // every rank's message, by rank
  void parse_rank_message(int rank, const std::string& msg, std::vector<std::string>& completed);
  void execute(std::vector<std::string> names);
  void run_batch(std::vector<Request>& reqs, std::vector<Entry>& entries);
  static bool cacheable(Kind k);
  // The cycle's bit-vector all-reduce: updates need_full and progressed_, returns the bits
  // every rank holds.
  std::vector<int> sync_cache(bool& need_full, bool fresh_work);
  void run_cached(const std::vector<int>& bits);
  void cache_insert(const std::string& name, const Entry& e);
  void run_allreduce_group(std::vector<Request*>& reqs);
  void run_one(Request& req, Entry& entry);
  // Adasum over hvd's group, in place; `counts`: the elements of each tensor in `buffer`.
  void adasum_reduce(torch::Tensor& buffer, const std::vector<int64_t>& counts);
  void fail_all(const std::string& why, bool timeout);
  void stall_check();
  StallFindings stall_findings() const;
  // HOROVOD_STALL_SHUTDOWN_TIME_SECONDS stops the job only when it is > 0 and not below the
  // warning time (Horovod warns "will not shutdown" otherwise).
  bool shutdown_applies() const;
  void check_agreement(const std::string& name, const Entry& e);

  std::shared_ptr<ProcessGroup> group_;
  ControllerOptions options_;
  int rank_, size_;

  Mutex mu_;
  std::condition_variable cv_;
  std::deque<Request> queue_ DTRAIN_GUARDED_BY(mu_);       // submitted, not yet announced
  bool stop_requested_ DTRAIN_GUARDED_BY(mu_) = false;     // this rank called shutdown()
  bool stopped_ DTRAIN_GUARDED_BY(mu_) = false;            // the thread has finished
  std::string fatal_ DTRAIN_GUARDED_BY(mu_);               // why the controller gave up
  Clock::time_point first_queued_ DTRAIN_GUARDED_BY(mu_);  // when queue_ last became non-empty
  int waiters_ DTRAIN_GUARDED_BY(mu_) = 0;                 // callers waiting on a result
  bool bg_pending_ DTRAIN_GUARDED_BY(mu_) = false;       // requests in flight after the last cycle
  bool last_progressed_ DTRAIN_GUARDED_BY(mu_) = false;  // the last cycle's progressed_
  bool cycles_done_ DTRAIN_GUARDED_BY(mu_) = false;      // the protocol ended; no more cycles
  Clock::time_point last_cycle_ DTRAIN_GUARDED_BY(mu_) = Clock::now();  // the last cycle's start
  // Held while a cycle runs (by the background thread, or by a waiting caller): the state
  // below is touched only under it.
  Mutex cycle_mu_;

  // Background-thread state.
  std::map<std::string, Request> mine_;  // announced by us, not yet run
  std::map<std::string, Entry> table_;
  int64_t next_seq_ = 0;
  std::vector<bool> joined_;
  std::vector<bool> shutting_down_;
  int last_joined_ = -1;
  // The device of this rank's last CUDA tensor: where it makes its zeros once it has joined
  // (its local device before any).
  std::optional<torch::Device> last_cuda_device_;
  bool stall_flag_ = false;
  int idle_cycles_ = 0;
  bool progressed_ = false;  // the last cycle ran something or some rank had new requests
  // The response cache.
  std::map<std::string, CacheEntry> cache_;
  std::vector<std::string> cache_names_;  // bit -> name ("" free)
  int64_t exec_counter_ = 0;
  std::map<int, Request> hits_;           // bit -> this rank's request, until every rank holds it
  std::map<std::string, int> hit_names_;  // name -> bit of hits_
  std::map<int, Clock::time_point> hit_since_;
  Clock::time_point last_stall_check_;
  torch::Tensor fusion_buffer_;         // uint8, grown as needed
  std::unique_ptr<Timeline> timeline_;  // rank 0 with HOROVOD_TIMELINE only
  // The timeline's name of `op` ("ALLREDUCE", "BCAST", ...) on a tensor on `device`: the
  // transport that runs it, as Horovod names its activities ("SHM_ALLREDUCE", "NCCL_BCAST").
  // Called (on rank 0, with a timeline) just before that collective, which every rank runs.
  const std::string& activity_name(const torch::Tensor& tensor, const char* op);
  std::map<std::pair<int, std::string>, std::string> activity_names_;  // (device type, op) ->
  std::thread thread_;
};

}  // namespace dtrain::hvd::detail
