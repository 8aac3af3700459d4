// The shared-memory backend: a c10d backend (comm::Backend) for ranks that all run on one host.
//
// all_reduce (sum, product, min, max on float32/64, float16, bfloat16, int8/16/32/64,
// uint8; avg on the floating-point ones), reduce (the same dtypes and ops, to one root),
// broadcast, all_gather (equal shapes) and barrier move their data through one
// POSIX shared-memory segment (comm/shm/shm_segment.h) instead of loopback TCP. all_reduce
// is a reduce-scatter then an all-gather inside the segment: every rank copies its input
// into its own slot, each rank reduces its 1/N slice of the chunk (in rank order 0..N-1, so
// every rank gets bitwise the same result), then copies the other ranks' reduced slices
// out. Small chunks (<= 16 KiB) skip the split: every rank reduces the whole chunk after
// one barrier. A tensor that lives in its rank's pool of the segment (empty_pooled(): DDP's
// buckets) is not copied in: the others read it where it is, its rank reduces its slice
// there in place and copies the others' slices into it, and a third barrier at the end keeps
// every rank from writing its tensor again while a peer still reads it. reduce: the other ranks
// copy their input into their slots and the root reduces them with its own tensor in place (one
// copy per sender, one pass at the root: a ZeRO engine's reductions to each partition's owner take
// turns being the root). Everything else (gather, scatter, all_to_all, send/recv, other dtypes and
// ops, several tensors per call) goes to the wrapped Gloo group unchanged.
//
// Collectives run in issue order on one worker thread per group, as Gloo's do, so the
// returned Work is asynchronous - except that a caller who waits for a collective the worker
// has not started yet runs it itself (one at a time, still in order; DTRAIN_SHM_INLINE=0: never),
// which spares the hand-off to the worker and back on the step's critical path. Each runs under the
// group's timeout, as Gloo's do (a shorter per-call timeout bounds only the caller's wait). Errors:
// TimeoutError when a peer does not arrive in time, NetworkError when a peer's process exited, left
// the group, or gave up after an error of its own; after any error the group is unusable (every
// later collective fails at once, as Gloo's do after a timeout). Ranks that issue different
// collectives, or sizes, get an Error naming both calls.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/c10d_compat.h"
#include "comm/shm/shm_segment.h"
#include "core/thread_annotations.h"

namespace dtrain::shm {

enum ShmOp : uint32_t {
  kOpBarrier = 1,
  kOpAllreduce = 2,
  kOpBroadcast = 3,
  kOpAllgather = 4,
  kOpReduce = 5
};

// A string that is equal on two ranks exactly when they can share a POSIX shm segment:
// hostname, boot id, and the identity of the /dev/shm mount this process sees.
std::string host_identity();

class ShmProcessGroup : public comm::Backend {
 public:
  // Joins the shared-memory segment of the group over `store` (the same prefixed store the
  // Gloo group uses). REQUIRES: every rank calls it at the same point, with the same
  // world size; `gloo` is this rank's group over the same ranks.
  // With `require` false, returns nullptr on every rank when the ranks are not all on one
  // host (so every rank falls back to Gloo together); with `require` true, that throws
  // UsageError. Throws NetworkError/TimeoutError when the segment cannot be set up.
  static c10::intrusive_ptr<ShmProcessGroup> join(
      const c10::intrusive_ptr<c10d::Store>& store, int rank, int world,
      c10::intrusive_ptr<comm::Backend> gloo, std::chrono::milliseconds timeout, bool require,
      const SegmentOptions& options = segment_options_from_env());

  ShmProcessGroup(int rank, int world, c10::intrusive_ptr<comm::Backend> gloo,
                  std::unique_ptr<ShmSegment> segment, std::chrono::milliseconds timeout);
  // Finishes the queued collectives (each bounded by its timeout), then leaves the segment.
  ~ShmProcessGroup() override;

  const std::string getBackendName() const override { return "shm"; }
  // A CPU tensor of `sizes` and `dtype` (uninitialised) in this rank's pool of the segment, which
  // all_reduce takes without copying it in or out; undefined when the group has no pool (a
  // world of one, DTRAIN_SHM_POOL_BYTES=0) or the pool or /dev/shm has no room for it. It stays
  // valid after the group is gone.
  at::Tensor empty_pooled(at::IntArrayRef sizes, at::ScalarType dtype);
  // all_reduces so far that read some rank's tensor in its pool (rather than through the slots).
  uint64_t in_place_all_reduces() const { return in_place_.load(); }
  // Collectives so far that the thread waiting for them ran (DTRAIN_SHM_INLINE).
  uint64_t run_by_their_waiter() const { return inline_ops_.load(); }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // How long a waiter spins before it sleeps: in a collective's first barrier, in its later
  // ones, and in the caller's wait for the collective (Work::wait).
  struct Spins {
    std::chrono::microseconds first, inner, wait;
  };
  Spins spins() const { return {segment_->spin(), segment_->inner_spin(), work_context_->spin}; }
  const c10::intrusive_ptr<comm::Backend>& gloo() const { return gloo_; }

  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> barrier(
      const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;

  // Delegated to Gloo as they are.
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

 private:
  class ShmWork;
  // What the group's works share: how a waiter waits, the hand-back statistics, and the group
  // while it lives (for run_inline).
  struct WorkContext {
    std::chrono::microseconds spin{0};
    bool inline_runs = true;  // a waiter runs a collective not started yet (run_inline)
    std::chrono::milliseconds group_timeout{0};
    std::atomic<uint64_t> waits{0};
    std::atomic<int64_t> handback_ns{0};
    Mutex mu;
    ShmProcessGroup* group DTRAIN_GUARDED_BY(mu) = nullptr;
  };
  using Task = std::function<void(Clock::time_point deadline)>;

  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, std::vector<at::Tensor> keep,
                                         Task task);
  c10::intrusive_ptr<c10d::Work> delegated(c10::intrusive_ptr<c10d::Work> w);
  void run();
  // Runs `work`'s collective on the calling thread (its waiter) if it is next and the group's
  // thread runs none: true when it ran it. The collectives still run one at a time, in order.
  bool run_inline(const ShmWork* work);
  struct Item;
  void execute(Item& item);  // runs one collective and completes its work
  // The collectives proper, on the thread running them (execute).
  void begin(const OpDescriptor& d);  // publishes this rank's descriptor of the next op
  void check_descriptors();           // after the op's first barrier
  void do_allreduce(at::Tensor& t, c10d::ReduceOp op, Clock::time_point deadline);
  void do_reduce(at::Tensor& t, c10d::ReduceOp op, int root, Clock::time_point deadline);
  void do_broadcast(at::Tensor& t, int root, Clock::time_point deadline);
  void do_allgather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                    Clock::time_point deadline);
  int next_parity() { return static_cast<int>(chunk_++ & 1u); }

  c10::intrusive_ptr<comm::Backend> gloo_;
  std::unique_ptr<ShmSegment> segment_;
  std::chrono::milliseconds timeout_;

  Mutex mu_;
  std::condition_variable cv_;
  struct Item {
    c10::intrusive_ptr<ShmWork> work;
    Task task;
    Clock::time_point queued;
    const char* span = "shm collective";  // the timeline's name of the op (a literal)
    int64_t bytes = -1;                   // the bytes it moves per rank, for the timeline
  };
  std::deque<Item> queue_ DTRAIN_GUARDED_BY(mu_);
  bool stop_ DTRAIN_GUARDED_BY(mu_) = false;
  // A collective is running (on the group's thread or a waiter's). What follows under "worker
  // state" belongs to whichever thread set it.
  bool running_ DTRAIN_GUARDED_BY(mu_) = false;
  // Gloo works not known complete, so barrier() can wait for them as Gloo's barrier does.
  std::vector<c10::intrusive_ptr<c10d::Work>> delegated_ DTRAIN_GUARDED_BY(mu_);

  // Worker state: the thread running a collective (running_) owns it.
  uint64_t seq_ = 0;    // collectives run so far
  uint64_t chunk_ = 0;  // chunks moved so far (picks the buffer parity)
  std::string broken_;  // why the group is unusable, or empty
  uint64_t ops_ = 0;
  std::atomic<uint64_t> inline_ops_{0};  // of those, run by their waiter (run_inline)
  std::atomic<uint64_t> in_place_{0};
  std::shared_ptr<WorkContext> work_context_;  // works may outlive the group
  double op_seconds_ = 0;                      // running collectives
  double queued_seconds_ = 0;  // from enqueue to start (the hand-off to this thread)
  std::thread worker_;
};

}  // namespace dtrain::shm
