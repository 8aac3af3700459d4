#include "comm/shm/shm_group.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "comm/shm/reduce.h"
#include "core/hostfile.h"
#include "core/params.h"
#include "dtrain/error.h"
#include "dtrain/timeline.h"

namespace dtrain::shm {

namespace {

// memcpy for a chunk that may be empty: a tensor of no elements has no data pointer, and
// memcpy's arguments must not be null even for 0 bytes (UBSan's nonnull-attribute).
void copy_bytes(void* to, const void* from, size_t bytes) {
  if (bytes > 0) std::memcpy(to, from, bytes);
}

// Chunks up to this size are reduced whole by every rank after one barrier; larger ones
// are split so each rank reduces 1/N of them (two barriers).
constexpr size_t kSmallChunkBytes = 16 << 10;
// Slices start on 64-byte boundaries (cache lines; vector loads).
constexpr size_t kSliceAlignBytes = 64;

const char* op_name(uint32_t op) {
  switch (op) {
    case kOpBarrier:
      return "barrier";
    case kOpAllreduce:
      return "all_reduce";
    case kOpBroadcast:
      return "broadcast";
    case kOpAllgather:
      return "all_gather";
    case kOpReduce:
      return "reduce";
    default:
      return "unknown collective";
  }
}

std::string describe(const OpDescriptor& d) {
  std::ostringstream s;
  s << op_name(d.op);
  if (d.op != kOpBarrier) {
    s << " of " << d.numel << " " << c10::toString(static_cast<at::ScalarType>(d.dtype))
      << " elements";
  }
  if (d.op == kOpAllreduce || d.op == kOpReduce) s << " (reduce op " << d.reduce << ")";
  if (d.op == kOpBroadcast) s << " from rank " << d.root;
  if (d.op == kOpReduce) s << " to rank " << d.root;
  return s.str();
}

bool plain_cpu(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.layout() == at::kStrided && t.is_contiguous() &&
         !t.is_complex();
}

std::string read_first_line(const char* path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

std::string random_hex() {
  std::random_device rd;
  std::ostringstream s;
  s << std::hex << rd() << rd();
  return s.str();
}

std::string to_string(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
std::vector<uint8_t> to_bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

}  // namespace

std::string host_identity() {
  const std::string host = this_host_name();
  struct stat st {};
  std::string shm = "none";
  if (::stat("/dev/shm", &st) == 0)
    shm = std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
  return host + "|" + read_first_line("/proc/sys/kernel/random/boot_id") + "|" + shm;
}

// --- Work ---------------------------------------------------------------------

// The caller's wait: where the ranks leave cores free it spins (WorkContext::spin) before it
// sleeps on c10d's condition variable, so the worker thread's completion does not have to wake
// it (a futex wake-up, tens of microseconds on a VM, paid once per step by every rank and so by
// the slowest one's).
class ShmProcessGroup::ShmWork : public c10d::Work {
 public:
  ShmWork(int rank, c10d::OpType type, std::vector<at::Tensor> tensors,
          std::shared_ptr<WorkContext> context)
      : c10d::Work(rank, type), tensors_(std::move(tensors)), context_(std::move(context)) {}
  void complete(std::exception_ptr error) {
    finish(std::move(error));
    done_at_.store(Clock::now().time_since_epoch().count(), std::memory_order_release);
  }
  std::vector<at::Tensor> result() override { return tensors_; }

  bool wait(std::chrono::milliseconds timeout) override {
    // Not started yet, and this wait lasts as long as the collective may: run it here, rather
    // than wake the group's thread and be woken by it (a per-call timeout shorter than the
    // group's must stay able to end the wait first; 0 is c10d's "no timeout").
    if (context_->inline_runs && done_at_.load(std::memory_order_acquire) == 0 &&
        (timeout.count() == 0 || timeout >= context_->group_timeout)) {
      // Under the context's lock: the group cannot be destroyed meanwhile.
      MutexLock lock(context_->mu);
      if (context_->group != nullptr) context_->group->run_inline(this);
    }
    if (context_->spin.count() > 0 && done_at_.load(std::memory_order_acquire) == 0) {
      const auto end = Clock::now() + (timeout.count() == 0
                                           ? Clock::duration(context_->spin)
                                           : std::min<Clock::duration>(context_->spin, timeout));
      for (int i = 1; done_at_.load(std::memory_order_acquire) == 0; ++i) {
        cpu_relax();
        if ((i & 63) == 0 && Clock::now() >= end) break;
      }
    }
    const bool ok = c10d::Work::wait(timeout);
    // From the worker's completion to this return: what handing the result back cost (0 for a
    // work waited for after it was done).
    const int64_t done = done_at_.load(std::memory_order_acquire);
    const int64_t now = Clock::now().time_since_epoch().count();
    if (done != 0 && !counted_.exchange(true)) {
      context_->waits.fetch_add(1, std::memory_order_relaxed);
      context_->handback_ns.fetch_add(std::max<int64_t>(0, now - done), std::memory_order_relaxed);
    }
    return ok;
  }

 private:
  std::vector<at::Tensor> tensors_;       // kept alive until the collective is done
  std::shared_ptr<WorkContext> context_;  // the work may outlive its group: not the group itself
  std::atomic<int64_t> done_at_{0};       // Clock ticks when complete() ran, 0 before
  std::atomic<bool> counted_{false};
};

// --- set-up ---------------------------------------------------------------------

c10::intrusive_ptr<ShmProcessGroup> ShmProcessGroup::join(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world,
    c10::intrusive_ptr<comm::Backend> gloo, std::chrono::milliseconds timeout, bool require,
    const SegmentOptions& options) {
  // Groups made over one store in turn get generations 0, 1, ...: every rank of generation
  // g adds before any rank can finish setting up g (that needs every rank mapped).
  const int64_t joined = store->add("dtrain_shm/joined", 1);
  const std::string base = "dtrain_shm/" + std::to_string((joined - 1) / world) + "/";
  auto store_wait = [&](const std::vector<std::string>& keys, const char* what) {
    try {
      store->wait(keys, timeout);
    } catch (const c10::Error& e) {
      throw TimeoutError(std::string("shared-memory transport set-up: rank ") +
                         std::to_string(rank) + " timed out after " +
                         std::to_string(timeout.count()) + " ms waiting for " + what + " [" +
                         e.what_without_backtrace() + "]");
    }
  };

  // 1. Are we all on one host (and one /dev/shm)? Every rank reads every answer, so every
  //    rank reaches the same decision.
  const std::string me = options.host_id.empty() ? host_identity() : options.host_id;
  store->set(base + "host/" + std::to_string(rank), to_bytes(me));
  std::vector<std::string> host_keys;
  for (int r = 0; r < world; ++r) host_keys.push_back(base + "host/" + std::to_string(r));
  store_wait(host_keys, "every rank's host identity");
  for (int r = 0; r < world; ++r) {
    std::string other = to_string(store->get(host_keys[static_cast<size_t>(r)]));
    if (other == me) continue;
    if (!require) return {};
    throw UsageError(
        "init_process_group: backend \"shm\" needs every rank on one host with one /dev/shm, but "
        "rank " +
        std::to_string(r) + " is on '" + other + "' and rank " + std::to_string(rank) + " on '" +
        me + "'; use backend \"auto\" (shared memory only when all ranks are local) or \"gloo\"");
  }

  // 2. Rank 0 creates the segment; everyone maps it; the last to map unlinks the name. A
  //    rank that fails publishes why (a value starting with '!'), so every rank learns it at
  //    once and all fail - or, with "auto", all fall back to Gloo - together.
  auto failed = [&](const std::string& why) -> c10::intrusive_ptr<ShmProcessGroup> {
    if (require) throw NetworkError("init_process_group(backend \"shm\"): " + why);
    std::fprintf(stderr, "dtrain: rank %d: shared-memory backend unavailable, using Gloo: %s\n",
                 rank, why.c_str());
    return {};
  };
  std::unique_ptr<ShmSegment> seg;
  std::string name;
  if (rank == 0) {
    name = "/dtrain-" + std::to_string(::getpid()) + "-" + random_hex();
    try {
      seg = ShmSegment::create(name, world, options);
    } catch (const Error& e) {
      const std::string why = std::string("rank 0: ") + e.what();
      store->set(base + "name", to_bytes("!" + why));
      return failed(why);
    }
    store->set(base + "name", to_bytes(name));
  } else {
    store_wait({base + "name"}, "rank 0 to create the shared-memory segment");
    name = to_string(store->get(base + "name"));
    if (!name.empty() && name[0] == '!') return failed(name.substr(1));
    try {
      seg = ShmSegment::open(name, rank, world, options);
    } catch (const Error& e) {
      // Tell the others (who wait for "ready") before giving up.
      const std::string why = "rank " + std::to_string(rank) + ": " + e.what();
      store->set(base + "ready", to_bytes("!" + why));
      return failed(why);
    }
  }
  seg->attach(rank);
  if (store->add(base + "mapped", 1) == world) {
    ShmSegment::unlink(name);
    // A rank that failed to map never adds, so this and its "!..." never both happen.
    store->set(base + "ready", to_bytes("1"));
  }
  try {
    store_wait({base + "ready"}, "every rank to map the shared-memory segment");
  } catch (...) {
    ShmSegment::unlink(name);  // nobody else will, if a rank never maps it
    throw;
  }
  if (std::string ready = to_string(store->get(base + "ready")); ready != "1") {
    ShmSegment::unlink(name);
    return failed(ready.substr(1));
  }
  // 3. Watch the peers' processes.
  seg->watch_peers();
  return c10::make_intrusive<ShmProcessGroup>(rank, world, std::move(gloo), std::move(seg),
                                              timeout);
}

ShmProcessGroup::ShmProcessGroup(int rank, int world, c10::intrusive_ptr<comm::Backend> gloo,
                                 std::unique_ptr<ShmSegment> segment,
                                 std::chrono::milliseconds timeout)
    : comm::Backend(rank, world),
      gloo_(std::move(gloo)),
      segment_(std::move(segment)),
      timeout_(timeout),
      work_context_(std::make_shared<WorkContext>()) {
  // Where the ranks leave cores free, the caller's wait for a collective the worker thread runs
  // spins too (kSpareCoresWaitSpin): the two take two of the host's CPUs per rank, which
  // spare_cores() leaves (DTRAIN_SHM_WAIT_SPIN_US: another spin, 0: none).
  const auto set = param::kShmWaitSpinUs.get_if_set();
  work_context_->spin = std::chrono::microseconds(set                  ? *set
                                                  : spare_cores(world) ? kSpareCoresWaitSpin.count()
                                                                       : 0);
  work_context_->inline_runs = param::kShmInline.get_or_warn();
  work_context_->group_timeout = timeout;
  {
    MutexLock lock(work_context_->mu);
    work_context_->group = this;
  }
  worker_ = std::thread([this] { run(); });
}

ShmProcessGroup::~ShmProcessGroup() {
  {
    // After a waiter's run_inline, if one is under way; none can start after this.
    MutexLock lock(work_context_->mu);
    work_context_->group = nullptr;
  }
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  if (ops_ > 0 && param::kShmStats.get_or_warn()) {
    const auto& st = segment_->stats();
    const auto waits = work_context_->waits.load();
    std::fprintf(stderr,
                 "dtrain shm rank %d: %llu collectives, %.3f ms each (of which %.3f ms waiting for "
                 "peers in %.2f "
                 "barriers, %.2f futex sleeps), %.3f ms queued before each; first barriers "
                 "%.3f ms waiting, %.2f sleeps; %.3f ms from completion to the waiter's return "
                 "(%llu waits), %llu run by their waiter\n",
                 rank_, static_cast<unsigned long long>(ops_), 1e3 * op_seconds_ / ops_,
                 1e3 * st.wait_seconds / ops_, static_cast<double>(st.barriers) / ops_,
                 static_cast<double>(st.sleeps) / ops_, 1e3 * queued_seconds_ / ops_,
                 1e3 * st.first_wait_seconds / ops_, static_cast<double>(st.first_sleeps) / ops_,
                 waits ? 1e-6 * static_cast<double>(work_context_->handback_ns.load()) /
                             static_cast<double>(waits)
                       : 0.0,
                 static_cast<unsigned long long>(waits),
                 static_cast<unsigned long long>(inline_ops_.load()));
  }
  segment_.reset();
}

// --- the worker thread ------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ShmProcessGroup::enqueue(c10d::OpType type,
                                                        std::vector<at::Tensor> keep, Task task) {
  int64_t bytes = 0;
  for (const auto& t : keep) bytes += static_cast<int64_t>(t.nbytes());
  const char* span = type == c10d::OpType::ALLREDUCE   ? "shm all_reduce"
                     : type == c10d::OpType::BROADCAST ? "shm broadcast"
                     : type == c10d::OpType::ALLGATHER ? "shm all_gather"
                     : type == c10d::OpType::REDUCE    ? "shm reduce"
                     : type == c10d::OpType::BARRIER   ? "shm barrier"
                                                       : "shm collective";
  auto work = c10::make_intrusive<ShmWork>(rank_, type, std::move(keep), work_context_);
  if (size_ == 1) {
    // A world of one: nothing to wait for, so no hand-off to the worker thread either.
    std::exception_ptr error;
    try {
      task(Clock::now() + timeout_);
    } catch (...) {
      error = std::current_exception();
    }
    work->complete(error);
    return work;
  }
  {
    MutexLock lock(mu_);
    queue_.push_back(Item{work, std::move(task), Clock::now(), span, bytes});
  }
  cv_.notify_one();
  return work;
}

void ShmProcessGroup::run() {
  while (true) {
    Item item;
    {
      MutexLock lock(mu_);
      // Not while a waiter runs a collective itself (run_inline): one at a time, in order.
      cv_.wait(lock.native(), [&] {
        mu_.assert_held();
        return !running_ && (stop_ || !queue_.empty());
      });
      if (queue_.empty()) return;  // stop_, and nothing left to do
      item = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
    }
    execute(item);
    {
      MutexLock lock(mu_);
      running_ = false;
    }
  }
}

bool ShmProcessGroup::run_inline(const ShmWork* work) {
  Item item;
  {
    MutexLock lock(mu_);
    if (running_ || queue_.empty() || queue_.front().work.get() != work) return false;
    item = std::move(queue_.front());
    queue_.pop_front();
    running_ = true;
  }
  execute(item);
  ++inline_ops_;
  {
    MutexLock lock(mu_);
    running_ = false;
  }
  cv_.notify_all();  // the group's thread, for what was queued meanwhile
  return true;
}

void ShmProcessGroup::execute(Item& item) {
  std::exception_ptr error;
  try {
    if (!broken_.empty()) throw NetworkError(broken_);
    // As Gloo does, every collective runs under the group's timeout; a shorter per-call
    // timeout only bounds the caller's wait (dtrain::Work::wait).
    const auto start = Clock::now();
    queued_seconds_ += std::chrono::duration<double>(start - item.queued).count();
    // The op on the timeline; the segment's barriers inside it record the waits for peers,
    // so the trace splits the op into waiting and transferring (copies and reductions).
    timeline::Span span(item.span, "comm", item.bytes);  // timeline hook
    item.task(start + timeout_);
    ++ops_;
    op_seconds_ += std::chrono::duration<double>(Clock::now() - start).count();
  } catch (const std::exception& e) {
    error = std::current_exception();
    if (broken_.empty()) {
      const bool timeout = dynamic_cast<const TimeoutError*>(&e) != nullptr;
      broken_ = std::string("an earlier collective of this group ") +
                (timeout ? "timed out" : "failed") + " on this rank (" + e.what() +
                "); the group is unusable, make a new one";
      segment_->mark_broken();
    }
  }
  item.work->complete(error);
}

void ShmProcessGroup::begin(const OpDescriptor& d) {
  segment_->begin_op();
  ++seq_;
  OpDescriptor mine = d;
  mine.seq = seq_;
  segment_->slot(rank_).desc[seq_ & 1] = mine;
}

// Called right after an op's first barrier, when every rank's descriptor of this op is
// visible (and none can be overwritten before the op's next barrier).
void ShmProcessGroup::check_descriptors() {
  const OpDescriptor& mine = segment_->slot(rank_).desc[seq_ & 1];
  for (int k = 0; k < size_; ++k) {
    const OpDescriptor& o = segment_->slot(k).desc[seq_ & 1];
    if (o.seq != mine.seq || o.op != mine.op || o.dtype != mine.dtype || o.numel != mine.numel ||
        o.reduce != mine.reduce || o.root != mine.root) {
      throw UsageError(
          "collective #" + std::to_string(mine.seq) + " differs across ranks: rank " +
          std::to_string(k) + " called " + describe(o) + " but rank " + std::to_string(rank_) +
          " called " + describe(mine) +
          "; every rank must call the same collectives, with the same sizes, in the same order");
    }
  }
}

at::Tensor ShmProcessGroup::empty_pooled(at::IntArrayRef sizes, at::ScalarType dtype) {
  const auto& pool = segment_->pool();
  if (!pool || size_ == 1) return {};
  int64_t numel = 1;
  for (int64_t d : sizes) numel *= d;
  const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  void* p = pool->allocate(bytes);
  if (p == nullptr) return {};
  // The deleter keeps the pool (and its mapping) alive as long as the tensor.
  return at::from_blob(
      p, sizes, [pool](void* q) { pool->release(q); }, at::TensorOptions().dtype(dtype));
}

void ShmProcessGroup::do_allreduce(at::Tensor& t, c10d::ReduceOp op, Clock::time_point deadline) {
  const auto dtype = t.scalar_type();
  const size_t es = t.element_size();
  const size_t n = static_cast<size_t>(t.numel());
  const int world = size_;
  if (world == 1) return;  // the input is the result (an average of one value too)
  auto* data = static_cast<unsigned char*>(t.data_ptr());
  // A tensor in this rank's pool is read where it lies - unless it is small, where copying it
  // costs less than the third barrier (every rank decides alike: the size is the same on all).
  const auto& pool = segment_->pool();
  const bool may_pool = pool != nullptr && n * es > kSmallChunkBytes;
  OpDescriptor d{
      kOpAllreduce, static_cast<uint32_t>(dtype), static_cast<uint32_t>(op.op_), -1, n, 0};
  if (may_pool) d.pool_offset = pool->offset_of(data, n * es);
  const bool mine_pooled = d.pool_offset != kNoPool;
  begin(d);
  const size_t align = std::max<size_t>(1, kSliceAlignBytes / es);
  const size_t cap = segment_->slot_bytes() / es;
  std::vector<const void*> src(static_cast<size_t>(world));
  // Each rank's tensor where it lies in its pool, or null (it comes through the slots).
  std::vector<unsigned char*> pooled(static_cast<size_t>(world), nullptr);
  bool any_pooled = false, all_pooled = false;
  bool first = true;
  for (size_t off = 0; first || off < n;) {
    size_t count = std::min(cap, n - off);
    const int p = next_parity();
    unsigned char* chunk = data + off * es;
    if (!mine_pooled) copy_bytes(segment_->buffer(p, rank_), chunk, count * es);
    segment_->barrier(deadline, "all_reduce");
    if (first) {
      check_descriptors();
      all_pooled = true;
      for (int k = 0; k < world; ++k) {
        const uint64_t at = segment_->slot(k).desc[seq_ & 1].pool_offset;
        if (at != kNoPool) pooled[static_cast<size_t>(k)] = pool->region(k) + at;
        any_pooled = any_pooled || at != kNoPool;
        all_pooled = all_pooled && at != kNoPool;
      }
      // Nothing went through the slots: the whole tensor is one chunk.
      if (all_pooled) count = n;
    }
    first = false;
    // Where rank k's elements of this chunk are.
    auto from = [&](int k) -> unsigned char* {
      unsigned char* at = pooled[static_cast<size_t>(k)];
      return at != nullptr ? at + off * es : segment_->buffer(p, k);
    };
    if (!any_pooled && count * es <= kSmallChunkBytes) {
      for (int k = 0; k < world; ++k) src[static_cast<size_t>(k)] = segment_->buffer(p, k);
      reduce_into(dtype, op.op_, chunk, nullptr, src.data(), world, count);
    } else {
      // Reduce-scatter: rank k owns elements [k*slice, (k+1)*slice) of the chunk.
      size_t slice = (count + static_cast<size_t>(world) - 1) / static_cast<size_t>(world);
      slice = (slice + align - 1) / align * align;
      auto lo = [&](int k) { return std::min(count, static_cast<size_t>(k) * slice); };
      auto hi = [&](int k) { return std::min(count, static_cast<size_t>(k + 1) * slice); };
      const size_t mlo = lo(rank_), mhi = hi(rank_);
      if (mhi > mlo) {
        for (int k = 0; k < world; ++k) src[static_cast<size_t>(k)] = from(k) + mlo * es;
        if (mine_pooled) {
          // In place: this rank's tensor is where the others read the slice.
          reduce_into(dtype, op.op_, chunk + mlo * es, nullptr, src.data(), world, mhi - mlo);
        } else {
          // Into this rank's slot (for the others) and the caller's tensor, in one pass.
          reduce_into(dtype, op.op_, segment_->buffer(p, rank_) + mlo * es, chunk + mlo * es,
                      src.data(), world, mhi - mlo);
        }
      }
      segment_->barrier(deadline, "all_reduce");
      // All-gather: everyone else's reduced slices.
      for (int k = 0; k < world; ++k) {
        if (k == rank_ || hi(k) <= lo(k)) continue;
        copy_bytes(chunk + lo(k) * es, from(k) + lo(k) * es, (hi(k) - lo(k)) * es);
      }
    }
    off += count;
  }
  // A rank whose tensor is in its pool may write it as soon as this returns (the next
  // backward): not before every peer has copied its slices out of it.
  if (any_pooled) {
    segment_->barrier(deadline, "all_reduce");
    ++in_place_;
  }
}

// The senders copy each chunk into their slots; after the barrier the root reduces every
// rank's chunk, its own read in place, in rank order. A sender's next write to this parity
// comes after the next chunk's barrier, which the root passes only once it has read this one.
void ShmProcessGroup::do_reduce(at::Tensor& t, c10d::ReduceOp op, int root,
                                Clock::time_point deadline) {
  const auto dtype = t.scalar_type();
  const size_t es = t.element_size();
  const size_t n = static_cast<size_t>(t.numel());
  if (size_ == 1) return;
  begin({kOpReduce, static_cast<uint32_t>(dtype), static_cast<uint32_t>(op.op_), root, n, 0});
  auto* data = static_cast<unsigned char*>(t.data_ptr());
  const size_t cap = segment_->slot_bytes() / es;
  std::vector<const void*> src(static_cast<size_t>(size_));
  bool first = true;
  for (size_t off = 0; first || off < n;) {
    const size_t count = std::min(cap, n - off);
    const int p = next_parity();
    unsigned char* chunk = data + off * es;
    if (rank_ != root) copy_bytes(segment_->buffer(p, rank_), chunk, count * es);
    segment_->barrier(deadline, "reduce");
    if (first) check_descriptors();
    first = false;
    if (rank_ == root) {
      for (int k = 0; k < size_; ++k)
        src[static_cast<size_t>(k)] = k == rank_ ? chunk : segment_->buffer(p, k);
      reduce_into(dtype, op.op_, chunk, nullptr, src.data(), size_, count);
    }
    off += count;
  }
}

void ShmProcessGroup::do_broadcast(at::Tensor& t, int root, Clock::time_point deadline) {
  const size_t bytes = t.nbytes();
  if (size_ == 1) return;
  begin({kOpBroadcast, static_cast<uint32_t>(t.scalar_type()), 0, root,
         static_cast<uint64_t>(t.numel()), 0});
  auto* data = static_cast<unsigned char*>(t.data_ptr());
  const size_t cap = segment_->slot_bytes();
  bool first = true;
  for (size_t off = 0; first || off < bytes;) {
    const size_t count = std::min(cap, bytes - off);
    const int p = next_parity();
    if (rank_ == root) copy_bytes(segment_->buffer(p, root), data + off, count);
    segment_->barrier(deadline, "broadcast");
    if (first) check_descriptors();
    first = false;
    if (rank_ != root) copy_bytes(data + off, segment_->buffer(p, root), count);
    off += count;
  }
}

void ShmProcessGroup::do_allgather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                                   Clock::time_point deadline) {
  const size_t bytes = input.nbytes();
  begin({kOpAllgather, static_cast<uint32_t>(input.scalar_type()), 0, -1,
         static_cast<uint64_t>(input.numel()), 0});
  const auto* in = static_cast<const unsigned char*>(input.data_ptr());
  const size_t cap = segment_->slot_bytes();
  bool first = true;
  for (size_t off = 0; first || off < bytes;) {
    const size_t count = std::min(cap, bytes - off);
    const int p = next_parity();
    copy_bytes(segment_->buffer(p, rank_), in + off, count);
    segment_->barrier(deadline, "all_gather");
    if (first) check_descriptors();
    first = false;
    for (int k = 0; k < size_; ++k) {
      auto* out = static_cast<unsigned char*>(outputs[static_cast<size_t>(k)].data_ptr()) + off;
      const unsigned char* from = k == rank_ ? in + off : segment_->buffer(p, k);
      if (out != from)
        copy_bytes(out, from, count);  // an in-place gather's own chunk is there already
    }
    off += count;
  }
}

// --- the c10d interface -------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ShmProcessGroup::delegated(c10::intrusive_ptr<c10d::Work> w) {
  MutexLock lock(mu_);
  delegated_.erase(std::remove_if(delegated_.begin(), delegated_.end(),
                                  [](auto& d) { return d->isCompleted(); }),
                   delegated_.end());
  delegated_.push_back(w);
  return w;
}

c10::intrusive_ptr<c10d::Work> ShmProcessGroup::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  if (tensors.size() != 1 || !plain_cpu(tensors[0]) ||
      !reduce_supported(tensors[0].scalar_type(), opts.reduceOp.op_)) {
    return delegated(gloo_->allreduce(tensors, opts));
  }
  at::Tensor t = tensors[0];
  c10d::ReduceOp op = opts.reduceOp;
  return enqueue(c10d::OpType::ALLREDUCE, {t}, [this, t, op](Clock::time_point deadline) mutable {
    do_allreduce(t, op, deadline);
  });
}

c10::intrusive_ptr<c10d::Work> ShmProcessGroup::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  if (tensors.size() != 1 || opts.rootTensor != 0 || !plain_cpu(tensors[0]) || opts.rootRank < 0 ||
      opts.rootRank >= size_) {
    return delegated(gloo_->broadcast(tensors, opts));
  }
  at::Tensor t = tensors[0];
  const int root = static_cast<int>(opts.rootRank);
  return enqueue(c10d::OpType::BROADCAST, {t}, [this, t, root](Clock::time_point deadline) mutable {
    do_broadcast(t, root, deadline);
  });
}

c10::intrusive_ptr<c10d::Work> ShmProcessGroup::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  bool ok = inputs.size() == 1 && outputs.size() == 1 && plain_cpu(inputs[0]) &&
            outputs[0].size() == static_cast<size_t>(size_);
  if (ok) {
    for (const auto& o : outputs[0]) {
      ok = ok && plain_cpu(o) && o.scalar_type() == inputs[0].scalar_type() &&
           o.numel() == inputs[0].numel();
    }
  }
  if (!ok) return delegated(gloo_->allgather(outputs, inputs, opts));
  std::vector<at::Tensor> outs = outputs[0];
  at::Tensor in = inputs[0];
  std::vector<at::Tensor> keep = outs;
  keep.push_back(in);
  return enqueue(
      c10d::OpType::ALLGATHER, std::move(keep),
      [this, outs, in](Clock::time_point deadline) mutable { do_allgather(outs, in, deadline); });
}

c10::intrusive_ptr<c10d::Work> ShmProcessGroup::barrier(const c10d::BarrierOptions& opts) {
  // As Gloo's barrier: it also waits for this rank's earlier collectives. The shared-memory
  // ones are ahead of it in the queue; the delegated ones are waited for here.
  std::vector<c10::intrusive_ptr<c10d::Work>> prior;
  {
    MutexLock lock(mu_);
    prior.swap(delegated_);
  }
  return enqueue(c10d::OpType::BARRIER, {}, [this, prior](Clock::time_point deadline) {
    for (const auto& w : prior) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      w->wait(std::max(left, std::chrono::milliseconds(1)));
    }
    begin({kOpBarrier, 0, 0, -1, 0, 0});
    segment_->barrier(deadline, "barrier");
    check_descriptors();
  });
}

c10::intrusive_ptr<c10d::Work> ShmProcessGroup::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  return delegated(gloo_->allreduce_coalesced(tensors, opts));
}
c10::intrusive_ptr<c10d::Work> ShmProcessGroup::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& opts) {
  if (tensors.size() != 1 || opts.rootTensor != 0 || !plain_cpu(tensors[0]) ||
      !reduce_supported(tensors[0].scalar_type(), opts.reduceOp.op_) || opts.rootRank < 0 ||
      opts.rootRank >= size_) {
    return delegated(gloo_->reduce(tensors, opts));
  }
  at::Tensor t = tensors[0];
  c10d::ReduceOp op = opts.reduceOp;
  const int root = static_cast<int>(opts.rootRank);
  return enqueue(c10d::OpType::REDUCE, {t},
                 [this, t, op, root](Clock::time_point deadline) mutable {
                   do_reduce(t, op, root, deadline);
                 });
}
c10::intrusive_ptr<c10d::Work> ShmProcessGroup::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  return delegated(gloo_->_allgather_base(output, input, opts));
}
c10::intrusive_ptr<c10d::Work> ShmProcessGroup::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return delegated(gloo_->allgather_coalesced(outputs, inputs, opts));
}
c10::intrusive_ptr<c10d::Work> ShmProcessGroup::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  return delegated(gloo_->gather(outputs, inputs, opts));
}
c10::intrusive_ptr<c10d::Work> ShmProcessGroup::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  return delegated(gloo_->scatter(outputs, inputs, opts));
}
c10::intrusive_ptr<c10d::Work> ShmProcessGroup::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return delegated(gloo_->reduce_scatter(outputs, inputs, opts));
}
c10::intrusive_ptr<c10d::Work> ShmProcessGroup::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions& opts) {
  return delegated(
      gloo_->alltoall_base(output, input, output_split_sizes, input_split_sizes, opts));
}
c10::intrusive_ptr<c10d::Work> ShmProcessGroup::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions& opts) {
  return delegated(gloo_->alltoall(outputs, inputs, opts));
}
// Point to point: not collectives, so barrier() does not wait for them (nor does Gloo's).
c10::intrusive_ptr<c10d::Work> ShmProcessGroup::send(std::vector<at::Tensor>& tensors, int dst,
                                                     int tag) {
  return gloo_->send(tensors, dst, tag);
}
c10::intrusive_ptr<c10d::Work> ShmProcessGroup::recv(std::vector<at::Tensor>& tensors, int src,
                                                     int tag) {
  return gloo_->recv(tensors, src, tag);
}
c10::intrusive_ptr<c10d::Work> ShmProcessGroup::recvAnysource(std::vector<at::Tensor>& tensors,
                                                              int tag) {
  return gloo_->recvAnysource(tensors, tag);
}

}  // namespace dtrain::shm
