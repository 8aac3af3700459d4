// Collectives on c10d process groups (Gloo, NCCL or the shared-memory backend; libtorch 1.13/2.x).
// One piece (~750 lines): every collective goes through the same checks, staging, issue and
// finishing steps defined here; each collective itself is a few lines on top of them.
//
// Each collective validates its arguments locally first (so a UsageError never leaves a
// rank half-way into a collective the others are waiting in), stages non-contiguous
// tensors through contiguous copies, issues the c10d call, and returns a Work whose wait()
// applies the finishing step (AVG division, copy back) and turns c10d/Gloo exceptions
// into dtrain errors that name the collective, the rank and the timeout.
#include "dtrain/collectives.h"

#include <algorithm>
#include <cctype>
#include <exception>
#include <sstream>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#include "comm/backend.h"
#include "comm/c10d_compat.h"
#include "comm/gloo/gloo.h"
#include "diagnosis/monitor.h"
#include "dtrain/error.h"
#include "dtrain/error_message.h"
#include "dtrain/flight_recorder.h"
#include "dtrain/timeline.h"

namespace dtrain {

namespace {

// An object kept alive on purpose until the process ends (a reference released, never
// dropped): not a leak, and LeakSanitizer is told so.
void kept_for_good(const void* object) {
#if defined(__SANITIZE_ADDRESS__)
  __lsan_ignore_object(object);
#else
  (void)object;
#endif
}

// What the caller asked for, resolved: the group, its c10d object, the effective timeout.
struct Call {
  const char* name;
  std::shared_ptr<ProcessGroup> group;
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  std::chrono::milliseconds timeout;
  int rank;
  int world;
  // The operation the call runs on its backend (what the backend's traits must include).
  comm::Op op;
  // The flight recorder's record of this collective (diagnosis/monitor.h), set by issue().
  std::shared_ptr<diagnosis::GroupMonitor> monitor = {};
  std::uint64_t seq = 0;
};

std::string shape_str(at::IntArrayRef sizes) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < sizes.size(); ++i) os << (i ? ", " : "") << sizes[i];
  os << "]";
  return os.str();
}

std::string prefix(const Call& c) {
  return std::string(c.name) + " (rank " + std::to_string(c.rank) + " of " +
         std::to_string(c.world) + "): ";
}

std::chrono::milliseconds group_timeout(c10d::ProcessGroup& pg) {
  if (comm::Backend* backend = comm::cpu_backend(pg)) {
    if (auto t = comm::backend_timeout(*backend)) return *t;
  }
  return std::chrono::minutes(30);  // PyTorch's default
}

// The backend operation a collective runs (reduce_scatter is an all_to_all, see below).
comm::Op op_of(const std::string& name) {
  if (name == "all_reduce") return comm::kOpAllreduce;
  if (name == "reduce") return comm::kOpReduce;
  if (name.rfind("broadcast", 0) == 0) return comm::kOpBroadcast;
  if (name.rfind("all_gather", 0) == 0) return comm::kOpAllgather;
  if (name == "gather") return comm::kOpGather;
  if (name == "scatter") return comm::kOpScatter;
  if (name == "all_to_all" || name == "reduce_scatter") return comm::kOpAlltoall;
  if (name == "send" || name == "recv") return comm::kOpSendRecv;
  if (name == "barrier") return comm::kOpBarrier;
  return comm::kOpAll;
}

Call begin(const char* name, const CollectiveOptions& options) {
  if (options.timeout.count() < 0) {
    throw UsageError(std::string(name) + ": timeout must be >= 0 ms (0 = the group's), got " +
                     std::to_string(options.timeout.count()) + " ms");
  }
  auto group = resolve_group(options);
  const auto& pg = group->c10d();
  if (!pg) throw UsageError(std::string(name) + ": the process group has no c10d group");
  // The backends' own timeout is the group's: a longer one here could not extend it, so the
  // effective timeout (the one messages report) is the shorter of the two.
  auto gt = group->timeout();
  auto timeout = options.timeout.count() == 0 ? gt : std::min(options.timeout, gt);
  return Call{name, group, pg, timeout, pg->getRank(), pg->getSize(), op_of(name)};
}

// The backend that runs `t`'s device type in the call's group, or nullptr.
const comm::DeviceBackend* backend_for(const Call& c, const at::Tensor& t) {
  return c.group->backends().find(t.device().type());
}

std::string shown_name(const comm::BackendTraits& t) {
  // The shared-memory backend takes Gloo's dtypes (it hands Gloo what it does not do itself).
  if (t.name == "nccl") return "NCCL";
  return "Gloo";
}

void check_tensor(const Call& c, const at::Tensor& t, const char* what) {
  if (!t.defined()) throw UsageError(prefix(c) + what + " is an undefined tensor");
  const comm::DeviceBackend* b = backend_for(c, t);
  if (!b) {
    std::string have;
    for (const auto& d : c.group->backends().devices) {
      have += (have.empty() ? "" : ", ") + std::string(c10::DeviceTypeName(d.device, true)) + " (" +
              d.traits.name + ")";
    }
    const bool cuda = t.device().is_cuda();
    throw UsageError(
        prefix(c) + what + " is on " + t.device().str() + ", but this group's backend ('" +
        c.group->backend_name() + "') takes tensors on " + have + " only; " +
        (cuda ? "move it with .cpu(), or make the group with backend \"auto\" or \"nccl\" in a "
                "CUDA build where every rank sees a GPU"
              : "move it to a device the group takes"));
  }
  if (!b->traits.supports(c.op)) {
    throw UsageError(prefix(c) + "the " + b->traits.name + " backend cannot run " + c.name +
                     " on " + t.device().str() +
                     " tensors; move them with .cpu() (the group's "
                     "CPU backend runs every collective)");
  }
  if (t.layout() != at::kStrided) {
    throw UsageError(prefix(c) + what + " is not a dense (strided) tensor; call .to_dense() first");
  }
  if (!b->traits.supports(t.scalar_type())) {
    throw UsageError(prefix(c) + what + " has dtype " +
                     std::string(c10::toString(t.scalar_type())) + ", which " +
                     shown_name(b->traits) + " does not support; use " + b->traits.dtype_list() +
                     " (e.g. convert bool to uint8)");
  }
}

// Tensors of one call on one device (a backend runs one device type's tensors).
void check_same_device(const Call& c, const at::Tensor& a, const char* an, const at::Tensor& b,
                       const char* bn) {
  if (a.device() != b.device()) {
    throw UsageError(prefix(c) + an + " is on " + a.device().str() + " but " + bn + " is on " +
                     b.device().str() + "; put them on one device");
  }
}

void check_same(const Call& c, const at::Tensor& a, const char* an, const at::Tensor& b,
                const char* bn) {
  check_same_device(c, a, an, b, bn);
  if (a.scalar_type() != b.scalar_type()) {
    throw UsageError(prefix(c) + an + " has dtype " + std::string(c10::toString(a.scalar_type())) +
                     " but " + bn + " has " + std::string(c10::toString(b.scalar_type())) +
                     "; they must match");
  }
  if (a.sizes() != b.sizes()) {
    throw UsageError(prefix(c) + an + " has shape " + shape_str(a.sizes()) + " but " + bn +
                     " has " + shape_str(b.sizes()) + "; they must match");
  }
}

void check_rank(const Call& c, int r, const char* what) {
  if (r < 0 || r >= c.world) {
    throw UsageError(prefix(c) + what + "=" + std::to_string(r) +
                     " is not a rank of this group (0.." + std::to_string(c.world - 1) + ")");
  }
}

void check_op(const Call& c, ReduceOp op, const at::Tensor& t) {
  if (op == ReduceOp::kAvg && !at::isFloatingType(t.scalar_type())) {
    throw UsageError(
        prefix(c) + "ReduceOp::kAvg needs a floating-point tensor, got " +
        std::string(c10::toString(t.scalar_type())) +
        " (an integer average would truncate); convert to float, or use kSum and divide");
  }
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:  // Gloo has no AVG: sum, then divide in the Work's finish step
      return c10d::ReduceOp::SUM;
    case ReduceOp::kMin:
      return c10d::ReduceOp::MIN;
    case ReduceOp::kMax:
      return c10d::ReduceOp::MAX;
    case ReduceOp::kProduct:
      return c10d::ReduceOp::PRODUCT;
  }
  throw UsageError("unknown ReduceOp " + std::to_string(static_cast<int>(op)));
}

// A tensor c10d can write into: the caller's own if contiguous, else a contiguous copy
// that copy_back() writes through to the caller's (possibly strided view) tensor.
struct Staged {
  at::Tensor target;  // the caller's tensor (same TensorImpl, so writes reach the caller)
  at::Tensor buf;
  void copy_back() const {
    if (!buf.is_same(target)) target.copy_(buf);
  }
};

Staged stage(const at::Tensor& t) {
  if (t.is_contiguous()) return Staged{t, t};
  return Staged{t, t.contiguous()};
}

// Issues the c10d call; its backend (Gloo, NCCL, ours) throws c10::Error at call time about
// the arguments (our checks should have caught them first) or, NCCL's, about its set-up.
// First the flight recorder records it (and, with DTRAIN_DEBUG=detail, checks that every rank
// issues the same collective): `fingerprint` are the tensors whose dtype and shapes are the
// same on every rank (collective hook, dtrain/debug.h).
template <typename F>
c10::intrusive_ptr<c10d::Work> issue(Call& c, at::TensorList fingerprint, F&& f) {
  c.monitor = c.group->monitor();
  if (c.monitor) c.seq = c.monitor->enter(c.name, fingerprint, c.timeout);
  try {
    return f();
  } catch (const c10::Error& e) {
    if (c.seq) c.monitor->fail(c.seq, "rejected by its backend");
    throw UsageError(prefix(c) + "rejected by its backend: " + e.what_without_backtrace());
  } catch (...) {
    if (c.seq) c.monitor->fail(c.seq, "could not be issued");
    throw;
  }
}

template <typename F>
c10::intrusive_ptr<c10d::Work> issue_p2p(const Call& c, F&& f) {
  try {
    return f();
  } catch (const c10::Error& e) {
    throw UsageError(prefix(c) + "rejected by its backend: " + e.what_without_backtrace());
  }
}

Work make_work(const Call& c, c10::intrusive_ptr<c10d::Work> w, std::function<void()> finish = {}) {
  return Work(std::move(w), c.timeout, c.name, std::move(finish), c.pg, c.monitor, c.seq);
}

bool contains_ci(std::string hay, std::string needle) {
  auto lower = [](std::string& s) {
    for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  };
  lower(hay);
  lower(needle);
  return hay.find(needle) != std::string::npos;
}

std::string exception_text(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return error_message(x);
  } catch (...) {
    return "unknown exception";
  }
}

bool is_io_error(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const NetworkError& x) {
    // The shared-memory backend's "a peer exited / left" errors.
    return std::string(x.what()).rfind("lost the connection to a peer rank", 0) == 0;
  } catch (...) {
    return comm::is_gloo_io_error(e);
  }
}

// Broadcast of one tensor under a given name (the object forms reuse it).
Work broadcast_impl(const char* name, at::Tensor& tensor, const BroadcastOptions& options) {
  Call c = begin(name, options);
  check_tensor(c, tensor, "tensor");
  check_rank(c, options.src, "src");
  Staged s = stage(tensor);
  std::vector<at::Tensor> v{s.buf};
  c10d::BroadcastOptions o;
  o.rootRank = options.src;
  o.rootTensor = 0;
  o.timeout = c.timeout;
  auto w = issue(c, v, [&] { return c.pg->broadcast(v, o); });
  return make_work(c, std::move(w), [s] { s.copy_back(); });
}

std::vector<at::Tensor> all_gather_impl(const char* name, const at::Tensor& tensor,
                                        const CollectiveOptions& options) {
  Call c = begin(name, options);
  check_tensor(c, tensor, "tensor");
  std::vector<at::Tensor> in{tensor.contiguous()};
  std::vector<std::vector<at::Tensor>> out(1);
  for (int r = 0; r < c.world; ++r) out[0].push_back(at::empty_like(in[0]));
  c10d::AllgatherOptions o;
  o.timeout = c.timeout;
  auto w = issue(c, in, [&] { return c.pg->allgather(out, in, o); });
  make_work(c, std::move(w)).wait();
  return out[0];
}

}  // namespace

// --- Work ---------------------------------------------------------------------

Work::Work(c10::intrusive_ptr<c10d::Work> work, std::chrono::milliseconds timeout, std::string what,
           std::function<void()> finish, c10::intrusive_ptr<c10d::ProcessGroup> group,
           std::shared_ptr<diagnosis::GroupMonitor> monitor, std::uint64_t seq)
    : work_(std::move(work)),
      timeout_(timeout),
      what_(std::move(what)),
      finish_(std::move(finish)),
      group_(std::move(group)),
      monitor_(std::move(monitor)),
      seq_(seq) {}

Work::~Work() {
  if (monitor_ && seq_ && !waited_) monitor_->abandon(seq_);  // no-op if wait() failed it
}

void Work::wait() {
  if (!work_) {
    throw UsageError("dtrain::Work::wait: this Work is empty (default-constructed or moved from)");
  }
  if (waited_) return;
  // c10d's wait(0) would mean "forever": never ask for that.
  std::chrono::milliseconds timeout = timeout_;
  if (timeout.count() <= 0) timeout = group_ ? group_timeout(*group_) : std::chrono::minutes(30);
  std::exception_ptr error;
  try {
    timeline::Span span("collective wait", "comm");  // timeline hook
    work_->wait(timeout);
  } catch (...) {
    error = std::current_exception();
  }
  if (error) {
    std::string where = what_;
    if (group_)
      where += " (rank " + std::to_string(group_->getRank()) + " of " +
               std::to_string(group_->getSize()) + ")";
    std::string detail = exception_text(error);
    // The flight recorder: settle the record, publish it for the launcher's failure summary,
    // and end the message with this rank's recent collectives.
    std::string recorder;
    if (monitor_ && seq_) {
      monitor_->fail(seq_, detail);
      monitor_->publish_now();
      recorder = "\nrecent collectives of this rank (flight recorder, oldest first):";
      auto recent = monitor_->recent();
      for (size_t i = recent.size() > 16 ? recent.size() - 16 : 0; i < recent.size(); ++i) {
        recorder += "\n  " + format_record(recent[i]);
      }
    }
    // c10d's Work::wait throws "Operation timed out!" and leaves the work pending; Gloo's own
    // timeouts (the group's, and send/recv's waits) complete it with "Timed out waiting ...".
    const bool pending = !work_->isCompleted();
    if (!pending && detail.rfind("an earlier collective of this group", 0) == 0) {
      // The shared-memory backend after an earlier failure (which may have been a timeout),
      // like Gloo's closed pairs below.
      throw NetworkError(where + " failed: " + detail + recorder);
    }
    if (pending || contains_ci(detail, "timed out")) {
      if (pending) {
        // Gloo's thread is still blocked in this collective (until the group's timeout) and
        // may still write into its tensors. Keep the work and the group alive for good:
        // destroying the group would join that thread, so a program that catches this error
        // and exits would hang for up to the group's timeout.
        c10::intrusive_ptr<c10d::Work> keep_work = work_;
        kept_for_good(keep_work.release());
        if (group_) {
          c10::intrusive_ptr<c10d::ProcessGroup> keep_group = group_;
          kept_for_good(keep_group.release());
        }
      }
      throw TimeoutError(where + " timed out after " + std::to_string(timeout.count()) +
                         " ms: a peer rank may have died or not called " + what_ +
                         " (every rank must call the same collectives in the same order); this "
                         "group is unusable now [" +
                         detail + "]" + recorder);
    }
    if (contains_ci(detail, "Application timeout caused pair closure")) {
      // Gloo closes a group's connections when one of its operations times out; every later
      // collective of the group fails at once with this.
      throw NetworkError(where +
                         " failed: an earlier collective of this group timed out and Gloo closed "
                         "the group's connections; the group is unusable, make a new one [" +
                         detail + "]" + recorder);
    }
    if (is_io_error(error)) {
      throw NetworkError(where +
                         " failed: lost the connection to a peer rank (it may have died) [" +
                         detail + "]" + recorder);
    }

    throw Error(where + " failed: " + detail + recorder);
  }
  waited_ = true;
  if (monitor_) monitor_->complete(seq_);
  if (finish_) {
    auto finish = std::move(finish_);
    finish_ = nullptr;
    finish();
  }
}

bool Work::is_completed() const {
  if (!work_) return false;
  return waited_ || work_->isCompleted();
}

// --- groups -------------------------------------------------------------------

std::shared_ptr<ProcessGroup> resolve_group(const CollectiveOptions& options) {
  return options.group ? options.group : default_group();
}

// --- tensor collectives ---------------------------------------------------------

Work all_reduce_async(torch::Tensor& tensor, const AllReduceOptions& options) {
  Call c = begin("all_reduce", options);
  check_tensor(c, tensor, "tensor");
  check_op(c, options.op, tensor);
  Staged s = stage(tensor);
  std::vector<at::Tensor> v{s.buf};
  c10d::AllreduceOptions o;
  o.reduceOp = to_c10d(options.op);
  o.timeout = c.timeout;
  // The shared-memory backend averages while it reduces (no extra pass); Gloo sums, and
  // the Work's finish step divides.
  bool avg = options.op == ReduceOp::kAvg && c.world > 1;
  if (avg && backend_for(c, tensor)->traits.native_avg) {
    o.reduceOp = c10d::ReduceOp::AVG;
    avg = false;
  }
  auto w = issue(c, v, [&] { return c.pg->allreduce(v, o); });
  const int world = c.world;
  return make_work(c, std::move(w), [s, avg, world] {
    if (avg) s.buf.div_(world);
    s.copy_back();
  });
}

void all_reduce(torch::Tensor& tensor, const AllReduceOptions& options) {
  timeline::Span span(
      "all_reduce", "comm",
      tensor.defined() ? static_cast<int64_t>(tensor.nbytes()) : 0);  // timeline hook
  all_reduce_async(tensor, options).wait();
}

Work broadcast_async(torch::Tensor& tensor, const BroadcastOptions& options) {
  return broadcast_impl("broadcast", tensor, options);
}

void broadcast(torch::Tensor& tensor, const BroadcastOptions& options) {
  broadcast_async(tensor, options).wait();
}

Work reduce_async(torch::Tensor& tensor, const ReduceOptions& options) {
  Call c = begin("reduce", options);
  check_tensor(c, tensor, "tensor");
  check_rank(c, options.dst, "dst");
  check_op(c, options.op, tensor);
  Staged s = stage(tensor);
  std::vector<at::Tensor> v{s.buf};
  c10d::ReduceOptions o;
  o.reduceOp = to_c10d(options.op);
  o.rootRank = options.dst;
  o.rootTensor = 0;
  o.timeout = c.timeout;
  auto w = issue(c, v, [&] { return c.pg->reduce(v, o); });
  const bool is_dst = c.rank == options.dst;
  const bool avg = options.op == ReduceOp::kAvg && c.world > 1;
  const int world = c.world;
  return make_work(c, std::move(w), [s, is_dst, avg, world] {
    if (!is_dst) return;  // the others' tensors are unspecified: leave the caller's alone
    if (avg) s.buf.div_(world);
    s.copy_back();
  });
}

void reduce(torch::Tensor& tensor, const ReduceOptions& options) {
  reduce_async(tensor, options).wait();
}

std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor,
                                      const CollectiveOptions& options) {
  return all_gather_impl("all_gather", tensor, options);
}

void all_gather_into_tensor(torch::Tensor& out, const torch::Tensor& input,
                            const CollectiveOptions& options) {
  Call c = begin("all_gather_into_tensor", options);
  check_tensor(c, out, "out");
  check_tensor(c, input, "input");
  std::vector<int64_t> chunk_shape = out.sizes().vec();
  if (out.dim() == 0 || out.size(0) % c.world != 0) {
    throw UsageError(prefix(c) + "out of shape " + shape_str(out.sizes()) +
                     " cannot be split into " + std::to_string(c.world) +
                     " equal chunks along dim 0");
  }
  chunk_shape[0] /= c.world;
  if (input.sizes() != at::IntArrayRef(chunk_shape) || out.scalar_type() != input.scalar_type()) {
    throw UsageError(prefix(c) + "input must be one chunk of out, shape " + shape_str(chunk_shape) +
                     " dtype " + std::string(c10::toString(out.scalar_type())) + "; got shape " +
                     shape_str(input.sizes()) + " dtype " +
                     std::string(c10::toString(input.scalar_type())));
  }
  Staged s = stage(out);
  // The chunks of a contiguous tensor are contiguous views: the backend writes into them.
  std::vector<std::vector<at::Tensor>> outs(1);
  for (auto& chunk : s.buf.chunk(c.world, 0)) outs[0].push_back(chunk);
  // Our own chunk as input, when it is one, is read before it is written (Gloo gathers into a
  // flat buffer first; the shared-memory backend copies it to its slot first, and skips
  // copying it onto itself).
  std::vector<at::Tensor> in{input.is_contiguous() ? input : input.contiguous()};
  c10d::AllgatherOptions o;
  o.timeout = c.timeout;
  auto w = issue(c, in, [&] { return c.pg->allgather(outs, in, o); });
  make_work(c, std::move(w), [s] { s.copy_back(); }).wait();
}

std::vector<torch::Tensor> gather(const torch::Tensor& tensor, const GatherOptions& options) {
  Call c = begin("gather", options);
  check_tensor(c, tensor, "tensor");
  check_rank(c, options.dst, "dst");
  std::vector<at::Tensor> in{tensor.contiguous()};
  // Gloo wants one list of world_size outputs on the root and no list elsewhere.
  std::vector<std::vector<at::Tensor>> out;
  if (c.rank == options.dst) {
    out.emplace_back();
    for (int r = 0; r < c.world; ++r) out[0].push_back(at::empty_like(in[0]));
  }
  c10d::GatherOptions o;
  o.rootRank = options.dst;
  o.timeout = c.timeout;
  auto w = issue(c, in, [&] { return c.pg->gather(out, in, o); });
  make_work(c, std::move(w)).wait();
  return out.empty() ? std::vector<torch::Tensor>{} : out[0];
}

void scatter(torch::Tensor& out, const std::vector<torch::Tensor>& chunks,
             const ScatterOptions& options) {
  Call c = begin("scatter", options);
  check_tensor(c, out, "out");
  check_rank(c, options.src, "src");
  std::vector<std::vector<at::Tensor>> in;
  if (c.rank == options.src) {
    if (static_cast<int>(chunks.size()) != c.world) {
      throw UsageError(prefix(c) + "src needs one chunk per rank: got " +
                       std::to_string(chunks.size()) + " chunks for a group of " +
                       std::to_string(c.world));
    }
    in.emplace_back();
    for (size_t i = 0; i < chunks.size(); ++i) {
      std::string name = "chunks[" + std::to_string(i) + "]";
      check_tensor(c, chunks[i], name.c_str());
      check_same(c, chunks[i], name.c_str(), out, "out");
      in[0].push_back(chunks[i].contiguous());
    }
  }
  Staged s = stage(out);
  std::vector<at::Tensor> v{s.buf};
  c10d::ScatterOptions o;
  o.rootRank = options.src;
  o.timeout = c.timeout;
  auto w = issue(c, v, [&] { return c.pg->scatter(v, in, o); });
  make_work(c, std::move(w), [s] { s.copy_back(); }).wait();
}

// reduce_scatter. Gloo 1.13 has none (ProcessGroupGloo::reduce_scatter throws). Choices:
//  - all_reduce the whole input and keep our chunk: simple, but a ring all-reduce moves
//    2(n-1)/n of the input per rank, twice what a reduce-scatter needs, and every rank
//    computes every chunk's reduction;
//  - one reduce() per chunk: n collectives (n latencies), and Gloo's reduce is no cheaper;
//  - all_to_all (chunk j to rank j), then reduce the n received chunks locally: one
//    collective moving (n-1)/n of the input per rank - what a ring reduce-scatter moves -
//    and each rank reduces only its own chunk. The cost is a receive buffer the size of
//    the input. This is what we do.
// Reduction order is rank order (0, 1, ..., n-1) on every rank.
void reduce_scatter(torch::Tensor& out, const torch::Tensor& input,
                    const ReduceScatterOptions& options) {
  Call c = begin("reduce_scatter", options);
  check_tensor(c, out, "out");
  check_tensor(c, input, "input");
  check_op(c, options.op, input);
  if (input.dim() == 0 || input.size(0) % c.world != 0) {
    throw UsageError(prefix(c) + "input of shape " + shape_str(input.sizes()) +
                     " cannot be split into " + std::to_string(c.world) +
                     " equal chunks along dim 0");
  }
  std::vector<int64_t> chunk_shape = input.sizes().vec();
  chunk_shape[0] /= c.world;
  if (out.sizes() != at::IntArrayRef(chunk_shape) || out.scalar_type() != input.scalar_type()) {
    throw UsageError(prefix(c) + "out must be one chunk of input, shape " + shape_str(chunk_shape) +
                     " dtype " + std::string(c10::toString(input.scalar_type())) + "; got shape " +
                     shape_str(out.sizes()) + " dtype " +
                     std::string(c10::toString(out.scalar_type())));
  }
  check_same_device(c, out, "out", input, "input");
  if (backend_for(c, input)->traits.name == "nccl") {
    // NCCL has a reduce-scatter of its own (a ring: (n-1)/n of the input per rank, reduced
    // on the GPU as it moves), averaging itself.
    at::Tensor in = input.contiguous();
    Staged s = stage(out);
    c10d::ReduceScatterOptions o;
    o.reduceOp =
        options.op == ReduceOp::kAvg ? c10d::ReduceOp(c10d::ReduceOp::AVG) : to_c10d(options.op);
    o.timeout = c.timeout;
    auto w = issue(c, in, [&] { return c.pg->_reduce_scatter_base(s.buf, in, o); });
    make_work(c, std::move(w), [s] { s.copy_back(); }).wait();
    return;
  }
  at::Tensor send = input.contiguous();
  at::Tensor recv = at::empty_like(send);
  std::vector<int64_t> counts;  // empty: equal split
  c10d::AllToAllOptions o;
  o.timeout = c.timeout;
  auto w = issue(c, send, [&] { return c.pg->alltoall_base(recv, send, counts, counts, o); });
  make_work(c, std::move(w)).wait();
  auto parts = recv.chunk(c.world, 0);
  at::Tensor acc = parts[0].clone();
  for (int j = 1; j < c.world; ++j) {
    switch (options.op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc.add_(parts[j]);
        break;
      case ReduceOp::kProduct:
        acc.mul_(parts[j]);
        break;
      case ReduceOp::kMin:
        acc = at::minimum(acc, parts[j]);
        break;
      case ReduceOp::kMax:
        acc = at::maximum(acc, parts[j]);
        break;
    }
  }
  if (options.op == ReduceOp::kAvg && c.world > 1) acc.div_(c.world);
  out.copy_(acc);
}

void all_to_all(torch::Tensor& out, const torch::Tensor& input, const CollectiveOptions& options) {
  Call c = begin("all_to_all", options);
  check_tensor(c, out, "out");
  check_tensor(c, input, "input");
  if (input.dim() == 0 || input.size(0) % c.world != 0) {
    throw UsageError(prefix(c) + "input of shape " + shape_str(input.sizes()) +
                     " cannot be split into " + std::to_string(c.world) +
                     " equal chunks along dim 0");
  }
  check_same(c, out, "out", input, "input");
  at::Tensor send = input.contiguous();
  Staged s = stage(out);
  std::vector<int64_t> counts;  // empty: equal split
  c10d::AllToAllOptions o;
  o.timeout = c.timeout;
  auto w = issue(c, send, [&] { return c.pg->alltoall_base(s.buf, send, counts, counts, o); });
  make_work(c, std::move(w), [s] { s.copy_back(); }).wait();
}

void barrier(const CollectiveOptions& options) {
  Call c = begin("barrier", options);
  c10d::BarrierOptions o;
  o.timeout = c.timeout;
  auto w =
      issue(c, {}, [&] { return comm::barrier(*c.pg, o); });  // not c.pg->barrier(): c10d_compat.h
  make_work(c, std::move(w)).wait();
}

// --- point to point -------------------------------------------------------------

namespace {

void check_peer(const Call& c, int peer, const char* what, int tag) {
  check_rank(c, peer, what);
  if (peer == c.rank) {
    throw UsageError(prefix(c) + what + "=" + std::to_string(peer) +
                     " is this rank; a rank cannot send to or receive from itself");
  }
  if (tag < 0) throw UsageError(prefix(c) + "tag must be >= 0, got " + std::to_string(tag));
}

}  // namespace

Work send_async(const torch::Tensor& tensor, int dst, const PointToPointOptions& options) {
  Call c = begin("send", options);
  check_tensor(c, tensor, "tensor");
  check_peer(c, dst, "dst", options.tag);
  // c10d's SendWork keeps this (possibly copied) tensor alive until the send is done.
  std::vector<at::Tensor> v{tensor.contiguous()};
  // Point to point: not recorded (two ranks take part, so no group-wide sequence number).
  auto w = issue_p2p(c, [&] { return c.pg->send(v, dst, options.tag); });
  return make_work(c, std::move(w));
}

Work recv_async(torch::Tensor& tensor, int src, const PointToPointOptions& options) {
  Call c = begin("recv", options);
  check_tensor(c, tensor, "tensor");
  check_peer(c, src, "src", options.tag);
  Staged s = stage(tensor);
  std::vector<at::Tensor> v{s.buf};
  auto w = issue_p2p(c, [&] { return c.pg->recv(v, src, options.tag); });
  return make_work(c, std::move(w), [s] { s.copy_back(); });
}

void send(const torch::Tensor& tensor, int dst, const PointToPointOptions& options) {
  send_async(tensor, dst, options).wait();
}

void recv(torch::Tensor& tensor, int src, const PointToPointOptions& options) {
  recv_async(tensor, src, options).wait();
}

// --- objects --------------------------------------------------------------------

// Length first (so receivers can size their buffer), then the bytes.
std::string broadcast_object(const std::string& value, const BroadcastOptions& options) {
  Call c = begin("broadcast_object", options);
  check_rank(c, options.src, "src");
  BroadcastOptions o = options;
  o.group = c.group;
  const bool is_src = c.rank == options.src;
  at::Tensor len = torch::full({1}, is_src ? static_cast<int64_t>(value.size()) : 0, torch::kInt64);
  broadcast_impl("broadcast_object", len, o).wait();
  const int64_t n = len.item<int64_t>();
  if (n == 0) return {};
  at::Tensor bytes = torch::empty({n}, torch::kUInt8);
  if (is_src) std::memcpy(bytes.data_ptr<uint8_t>(), value.data(), static_cast<size_t>(n));
  broadcast_impl("broadcast_object", bytes, o).wait();
  return std::string(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()),
                     static_cast<size_t>(n));
}

// Lengths first (all_gather of int64), then every value padded to the longest.
std::vector<std::string> all_gather_object(const std::string& value,
                                           const CollectiveOptions& options) {
  CollectiveOptions o = options;
  o.group = resolve_group(options);
  at::Tensor len = torch::full({1}, static_cast<int64_t>(value.size()), torch::kInt64);
  auto lens = all_gather_impl("all_gather_object", len, o);
  int64_t longest = 0;
  for (const auto& l : lens) longest = std::max(longest, l.item<int64_t>());
  std::vector<std::string> result(lens.size());
  if (longest == 0) return result;
  at::Tensor bytes = torch::zeros({longest}, torch::kUInt8);
  std::memcpy(bytes.data_ptr<uint8_t>(), value.data(), value.size());
  auto all = all_gather_impl("all_gather_object", bytes, o);
  for (size_t r = 0; r < all.size(); ++r) {
    result[r].assign(reinterpret_cast<const char*>(all[r].data_ptr<uint8_t>()),
                     static_cast<size_t>(lens[r].item<int64_t>()));
  }
  return result;
}

}  // namespace dtrain
