// Collectives on tensors, with PyTorch's names and semantics (torch.distributed).
//
// Every collective comes in two forms:
//   all_reduce(t, opts)        blocks until done (or throws), like async_op=False;
//   all_reduce_async(t, opts)  returns a Work to wait() on later, like async_op=True.
// Each takes an options struct whose `group` defaults to the default group (the one
// init_process_group() made last) and whose `timeout` defaults to the group's timeout.
// Tensors are CPU tensors (Gloo). In-place collectives write into the tensors passed.
//
// Errors: a rank that dies or a peer that never arrives makes wait() throw
// dtrain::TimeoutError (timeout passed) or dtrain::NetworkError (connection lost) within the
// timeout, naming the collective. Bad arguments (shape mismatch, bad rank, a dtype Gloo
// cannot reduce) throw UsageError before anything is sent, so the group stays usable.
// After a TimeoutError or NetworkError the group is not: ranks no longer agree on which
// collective comes next (as in PyTorch); leave it and make a new one, or exit. A group with
// a timed-out collective is never destroyed (its c10d object is leaked on purpose), so
// leaving it or exiting does not wait for Gloo's thread, still blocked in that collective.
//
// Dtypes: float32, float64, float16, int8, uint8, int32, int64 (what Gloo 1.13 reduces).
// Non-contiguous tensors are fine: they go through a contiguous copy.
//
// Thread-safety: collectives of one group must be issued in the same order on every rank;
// issuing them from several threads of one rank at once is not supported.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "dtrain/process_group.h"

namespace dtrain {

namespace diagnosis {
class GroupMonitor;
}

enum class ReduceOp { kSum, kAvg, kMin, kMax, kProduct };

// Fields every collective's options share.
struct CollectiveOptions {
  std::shared_ptr<ProcessGroup> group;  // Default: the default group.
  // Default (0): the group's timeout. Only a shorter one has an effect: libtorch 1.13's Gloo
  // runs every collective under the group's timeout, and this one only bounds how long
  // wait() waits for it.
  std::chrono::milliseconds timeout{0};
};

// A pending collective. Movable, not copyable. Destroying an unwaited Work does not cancel
// the collective (it completes in the background, as in PyTorch).
class Work {
 public:
  Work() = default;
  // `finish` runs once, in wait(), after the collective completed (e.g. dividing for kAvg).
  // A `timeout` of 0 means the group's timeout (30 minutes without a group).
  // `group` (the c10d group that runs it) names the rank in error messages, and is kept
  // alive for good if the collective times out: Gloo's thread is still blocked in it, and
  // destroying the group would wait for that thread (up to the group's timeout).
  // `monitor` and `seq` (from GroupMonitor::enter) are the flight recorder's record of this
  // collective, settled by wait() (dtrain/flight_recorder.h); none for a Work made elsewhere.
  Work(c10::intrusive_ptr<c10d::Work> work, std::chrono::milliseconds timeout, std::string what,
       std::function<void()> finish = {}, c10::intrusive_ptr<c10d::ProcessGroup> group = {},
       std::shared_ptr<diagnosis::GroupMonitor> monitor = {}, std::uint64_t seq = 0);
  Work(Work&&) noexcept = default;
  Work& operator=(Work&&) noexcept = default;
  ~Work();

  // Blocks until the collective is done. Throws TimeoutError after the timeout, or
  // NetworkError / Error when a peer failed; the message names the collective.
  void wait();
  // True once done (wait() then returns at once). send/recv complete only inside wait()
  // (Gloo 1.13's point-to-point Work has no background completion), so for them it stays
  // false until wait() returned.
  bool is_completed() const;
  // Adds a step that runs in wait() after this Work's own finish step (e.g. decompressing
  // a result into its destination). Returns the combined Work.
  Work then(std::function<void()> next) && {
    auto first = std::move(finish_);
    finish_ = [first = std::move(first), next = std::move(next)]() {
      if (first) first();
      next();
    };
    return std::move(*this);
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::chrono::milliseconds timeout_{0};
  std::string what_;
  std::function<void()> finish_;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::shared_ptr<diagnosis::GroupMonitor> monitor_;
  std::uint64_t seq_ = 0;
  bool waited_ = false;
};

struct AllReduceOptions : CollectiveOptions {
  ReduceOp op = ReduceOp::kSum;  // Default: sum.
};
struct BroadcastOptions : CollectiveOptions {
  int src = 0;  // Default: rank 0.
};
struct ReduceOptions : CollectiveOptions {
  ReduceOp op = ReduceOp::kSum;
  int dst = 0;
};
struct GatherOptions : CollectiveOptions {
  int dst = 0;
};
struct ScatterOptions : CollectiveOptions {
  int src = 0;
};
struct ReduceScatterOptions : CollectiveOptions {
  ReduceOp op = ReduceOp::kSum;
};
struct PointToPointOptions : CollectiveOptions {
  int tag = 0;
};

// In place on every rank.
void all_reduce(torch::Tensor& tensor, const AllReduceOptions& options = {});
Work all_reduce_async(torch::Tensor& tensor, const AllReduceOptions& options = {});
// tensor on src is sent; on the others it is overwritten (same shape and dtype everywhere).
void broadcast(torch::Tensor& tensor, const BroadcastOptions& options = {});
Work broadcast_async(torch::Tensor& tensor, const BroadcastOptions& options = {});
// The result lands in tensor on dst only; the others' tensors are unspecified afterwards.
void reduce(torch::Tensor& tensor, const ReduceOptions& options = {});
Work reduce_async(torch::Tensor& tensor, const ReduceOptions& options = {});
// Returns world_size tensors, rank r's at index r (tensors of equal shape on every rank).
std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor,
                                      const CollectiveOptions& options = {});
// `out` holds world_size equal chunks along dim 0; every rank gets rank r's `input` in chunk r
// (PyTorch's all_gather_into_tensor): no list of new tensors, no copies out of them.
// `input` may be out's own chunk (in place), or any tensor of one chunk's shape and dtype.
void all_gather_into_tensor(torch::Tensor& out, const torch::Tensor& input,
                            const CollectiveOptions& options = {});
// Returns world_size tensors on dst, an empty vector elsewhere.
std::vector<torch::Tensor> gather(const torch::Tensor& tensor, const GatherOptions& options = {});
// On src, `chunks` holds world_size tensors (ignored elsewhere); every rank gets its chunk
// written into `out`.
void scatter(torch::Tensor& out, const std::vector<torch::Tensor>& chunks,
             const ScatterOptions& options = {});
// `input` holds world_size equal chunks along dim 0; rank r gets the reduction of every
// rank's chunk r in `out` (shape: one chunk). Gloo 1.13 has no reduce_scatter: this is an
// all_to_all plus a local reduction, which moves as few bytes as a ring reduce-scatter
// (see the implementation).
void reduce_scatter(torch::Tensor& out, const torch::Tensor& input,
                    const ReduceScatterOptions& options = {});
// `input` is split in world_size equal chunks along dim 0; chunk j goes to rank j; `out`
// (same shape) receives rank j's chunk for us at position j.
void all_to_all(torch::Tensor& out, const torch::Tensor& input,
                const CollectiveOptions& options = {});
void barrier(const CollectiveOptions& options = {});
// Point to point (tensor shape and dtype must match on both sides; tag >= 0; messages are
// matched by peer and tag). Sending to or receiving from oneself is a UsageError.
void send(const torch::Tensor& tensor, int dst, const PointToPointOptions& options = {});
void recv(torch::Tensor& tensor, int src, const PointToPointOptions& options = {});
Work send_async(const torch::Tensor& tensor, int dst, const PointToPointOptions& options = {});
Work recv_async(torch::Tensor& tensor, int src, const PointToPointOptions& options = {});

// Object forms, for strings and small values: the bytes travel as uint8 tensors with their
// lengths gathered first.
std::string broadcast_object(const std::string& value, const BroadcastOptions& options = {});
std::vector<std::string> all_gather_object(const std::string& value,
                                           const CollectiveOptions& options = {});

// Typed convenience over the string forms for arithmetic types and std::string.
template <typename T>
T broadcast_object(const T& value, const BroadcastOptions& options = {}) {
  static_assert(std::is_arithmetic_v<T>,
                "broadcast_object<T>: T must be arithmetic or std::string");
  std::string bytes(reinterpret_cast<const char*>(&value), sizeof(T));
  std::string out = broadcast_object(bytes, options);
  T result;
  std::memcpy(&result, out.data(), sizeof(T));
  return result;
}
template <typename T>
std::vector<T> all_gather_object(const T& value, const CollectiveOptions& options = {}) {
  static_assert(std::is_arithmetic_v<T>,
                "all_gather_object<T>: T must be arithmetic or std::string");
  auto all =
      all_gather_object(std::string(reinterpret_cast<const char*>(&value), sizeof(T)), options);
  std::vector<T> out(all.size());
  for (size_t i = 0; i < all.size(); ++i) std::memcpy(&out[i], all[i].data(), sizeof(T));
  return out;
}

// The group an options struct names (its `group`, else the default group).
std::shared_ptr<ProcessGroup> resolve_group(const CollectiveOptions& options);

}  // namespace dtrain
