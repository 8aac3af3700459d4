#include "comm/shm/shm_segment.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/params.h"
#include "dtrain/error.h"
#include "dtrain/timeline.h"

namespace dtrain::shm {

namespace {

constexpr uint64_t kMagic = 0x6474726e73686d31ull;  // "dtrnshm1"
constexpr uint32_t kVersion = 2;                    // 2: the pools
constexpr size_t kDefaultSlotBytes = 4u << 20;
constexpr std::chrono::microseconds kDefaultSpin{param::kShmSpinUs.fallback};
// A sleeping waiter wakes up this often to check that the peer it waits for is alive.
constexpr auto kLivenessCheck = std::chrono::milliseconds(50);

std::string errno_text(int e) {
  return std::string(std::strerror(e)) + " (errno " + std::to_string(e) + ")";
}

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

// The segment's layout: control, slots, then the pools. Returns the total bytes.
size_t layout_bytes(int world, size_t slot_bytes, size_t pool_bytes, size_t* data_offset,
                    size_t* pool_offset) {
  size_t control = sizeof(Header) + 64 + sizeof(RankSlot) * static_cast<size_t>(world);
  *data_offset = round_up(control, 4096);
  *pool_offset = *data_offset + 2 * static_cast<size_t>(world) * slot_bytes;
  return *pool_offset + static_cast<size_t>(world) * pool_bytes;
}

// One rank's pool (SegmentOptions::pool_bytes), page-aligned. Every rank maps every rank's
// pool: under a limit on address space (ulimit -v) that could fail a group's set-up, so there
// the default is none (DTRAIN_SHM_POOL_BYTES still sets one).
size_t pool_bytes_for(int world, const SegmentOptions& o) {
  int64_t want = o.pool_bytes;
  if (want < 0) {
    rlimit as{};
    const bool limited = ::getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY;
    want = param::kShmPoolBytes.get_if_set().value_or(limited ? 0 : param::kShmPoolBytes.get());
  }
  const int64_t most = (int64_t{256} << 30) / world;
  return round_up(static_cast<size_t>(std::min(want, most)), 4096);
}

long futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const timespec* ts) {
  // Shared (not FUTEX_PRIVATE_FLAG): the word lives in memory mapped by several processes.
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, val, ts, nullptr, 0);
}

bool reached(uint32_t value, uint32_t target) { return static_cast<int32_t>(value - target) >= 0; }

int pidfd_open(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  errno = ENOSYS;
  return -1;
#endif
}

// Maps the control block and the slots (the pools are mapped by ShmPool). Closes `fd` when it
// fails.
void* map_fd(int fd, size_t bytes, const std::string& name) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    ::close(fd);
    throw NetworkError("shared-memory transport: cannot map " + name + " (" +
                       std::to_string(bytes) + " bytes): " + errno_text(e) +
                       "; is /dev/shm full? (backend \"gloo\" avoids it)");
  }
  return p;
}

}  // namespace

// Whether this host's ranks, with their intra-op threads, leave at least half the CPUs this
// process may run on free: a spinning waiter then takes no core a peer computes on, and skips
// the futex sleep and wake-up (each tens of microseconds on a VM) that the ranks' skew
// otherwise costs every collective (kSpareCoresSpin: what it gained). Elsewhere short spins: on
// a busy machine spinning delays the very rank it waits for.
bool spare_cores(int world) {
  cpu_set_t set;
  CPU_ZERO(&set);
  long cpus = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
  if (cpus <= 0) cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
  long threads = cpus;  // libtorch's default: one intra-op thread per CPU
  if (const char* omp = std::getenv("OMP_NUM_THREADS"); omp && *omp) {
    char* end = nullptr;
    const long n = std::strtol(omp, &end, 10);
    if (end && *end == '\0' && n > 0) threads = n;
  }
  return 2L * world * threads <= cpus;
}

SegmentOptions segment_options_from_env() {
  SegmentOptions o;
  if (const auto v = param::kShmSlotBytes.get_if_set()) o.slot_bytes = static_cast<size_t>(*v);
  if (const auto v = param::kShmSpinUs.get_if_set()) o.spin = std::chrono::microseconds(*v);
  if (const auto v = param::kShmInnerSpinUs.get_if_set())
    o.inner_spin = std::chrono::microseconds(*v);
  return o;
}

ShmSegment::ShmSegment(std::string name, int world, void* base, size_t bytes,
                       const SegmentOptions& o)
    : name_(std::move(name)),
      world_(world),
      base_(base),
      bytes_(bytes),
      slot_bytes_(static_cast<Header*>(base)->slot_bytes),
      spin_(o.spin.count() >= 0  ? o.spin
            : spare_cores(world) ? kSpareCoresSpin
                                 : kDefaultSpin),
      inner_spin_(o.inner_spin.count() >= 0 ? o.inner_spin : spin_),
      pidfds_(static_cast<size_t>(world), -1) {}

std::unique_ptr<ShmSegment> ShmSegment::create(const std::string& name, int world,
                                               const SegmentOptions& o) {
  // Default slot: 4 MiB, smaller for many ranks so the segment stays within ~32 MiB.
  size_t slot =
      o.slot_bytes
          ? o.slot_bytes
          : std::max<size_t>(64 << 10, std::min(kDefaultSlotBytes, (size_t{32} << 20) / world));
  slot = round_up(slot, 4096);
  const size_t pool = pool_bytes_for(world, o);
  size_t data_offset = 0, pool_offset = 0;
  const size_t total = layout_bytes(world, slot, pool, &data_offset, &pool_offset);
  int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw NetworkError("shared-memory transport: shm_open(" + name +
                       ") failed: " + errno_text(errno));
  }
  // The file is as long as the whole layout, but only the control block and the slots take
  // pages now - reserved by posix_fallocate, so a /dev/shm too small for them (containers
  // often have 64 MB) is an error here, not a SIGBUS mid-collective. The pools stay sparse
  // until tensors are placed there (ShmPool reserves their pages then).
  int e = ::ftruncate(fd, static_cast<off_t>(total)) != 0 ? errno : 0;
  if (e == 0) e = ::posix_fallocate(fd, 0, static_cast<off_t>(pool_offset));
  if (e != 0) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    throw NetworkError("shared-memory transport: cannot size " + name + " to " +
                       std::to_string(pool_offset) + " bytes: " + errno_text(e) +
                       "; is /dev/shm full? (backend \"gloo\" avoids it)");
  }
  void* base;
  try {
    base = map_fd(fd, pool_offset, name);
  } catch (...) {
    ::shm_unlink(name.c_str());
    throw;
  }
  // A fresh tmpfs file is zero-filled: every atomic starts at 0 (kDetached, no sleepers).
  auto* h = static_cast<Header*>(base);
  h->world = static_cast<uint32_t>(world);
  h->version = kVersion;
  h->slot_bytes = slot;
  h->data_offset = data_offset;
  h->pool_offset = pool_offset;
  h->pool_bytes = pool;
  h->total_bytes = total;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  h->magic = kMagic;
  std::unique_ptr<ShmSegment> seg(new ShmSegment(name, world, base, pool_offset, o));
  seg->open_pool(fd, 0);
  return seg;
}

std::unique_ptr<ShmSegment> ShmSegment::open(const std::string& name, int rank, int world,
                                             const SegmentOptions& o) {
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    throw NetworkError(
        "shared-memory transport: rank " + std::to_string(rank) + " cannot open " + name +
        " that rank 0 created: " + errno_text(errno) +
        "; are all ranks on one host with one /dev/shm? (backend \"gloo\" avoids it)");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(sizeof(Header))) {
    ::close(fd);
    throw NetworkError("shared-memory transport: " + name + " is not a dtrain segment (size " +
                       std::to_string(st.st_size) + ")");
  }
  // The control block first (its header says how long the rest is).
  const size_t head = round_up(sizeof(Header), 4096);
  if (static_cast<size_t>(st.st_size) < head) {
    ::close(fd);
    throw NetworkError("shared-memory transport: " + name + " is not a dtrain segment (size " +
                       std::to_string(st.st_size) + ")");
  }
  void* probe = map_fd(fd, head, name);
  const Header h = *static_cast<const Header*>(probe);
  ::munmap(probe, head);
  size_t data_offset = 0, pool_offset = 0;
  if (h.magic != kMagic || h.version != kVersion || h.world != static_cast<uint32_t>(world) ||
      h.total_bytes != static_cast<uint64_t>(st.st_size) ||
      layout_bytes(world, h.slot_bytes, h.pool_bytes, &data_offset, &pool_offset) !=
          h.total_bytes ||
      data_offset != h.data_offset || pool_offset != h.pool_offset) {
    ::close(fd);
    throw NetworkError("shared-memory transport: " + name + " has an unexpected header (world " +
                       std::to_string(h.world) + ", expected " + std::to_string(world) +
                       "); another job's segment, or a different dtrain version?");
  }
  void* base = map_fd(fd, pool_offset, name);
  std::unique_ptr<ShmSegment> seg(new ShmSegment(name, world, base, pool_offset, o));
  seg->open_pool(fd, rank);
  return seg;
}

void ShmSegment::open_pool(int fd, int rank) {
  const auto* h = static_cast<const Header*>(base_);
  if (h->pool_bytes == 0) {
    ::close(fd);
    return;
  }
  pool_ = std::make_shared<ShmPool>(fd, h->pool_offset, h->pool_bytes, world_, rank);
}

ShmSegment::~ShmSegment() {
  if (rank_ >= 0) {
    RankSlot& me = slot(rank_);
    uint32_t expected = kAttached;
    me.state.compare_exchange_strong(expected, kLeft);
    // Sleepers wake up, see the state, and fail instead of waiting out their timeout.
    futex(&me.arrived, FUTEX_WAKE, INT_MAX, nullptr);
  }
  for (int fd : pidfds_) {
    if (fd >= 0) ::close(fd);
  }
  ::munmap(base_, bytes_);
}

void ShmSegment::unlink(const std::string& name) { ::shm_unlink(name.c_str()); }

RankSlot& ShmSegment::slot(int k) const {
  auto* first =
      reinterpret_cast<RankSlot*>(static_cast<char*>(base_) + round_up(sizeof(Header), 64));
  return first[k];
}

unsigned char* ShmSegment::buffer(int parity, int k) const {
  const auto* h = static_cast<const Header*>(base_);
  size_t index = static_cast<size_t>(parity) * static_cast<size_t>(world_) + static_cast<size_t>(k);
  return static_cast<unsigned char*>(base_) + h->data_offset + index * slot_bytes_;
}

void ShmSegment::attach(int rank) {
  rank_ = rank;
  RankSlot& me = slot(rank);
  me.pid.store(static_cast<int32_t>(::getpid()));
  me.state.store(kAttached);
}

void ShmSegment::watch_peers() {
  const pid_t self = ::getpid();
  for (int k = 0; k < world_; ++k) {
    pid_t pid = slot(k).pid.load();
    if (k == rank_ || pid == self) continue;            // ranks as threads of this process
    pidfds_[static_cast<size_t>(k)] = pidfd_open(pid);  // -1: fall back to kill(pid, 0)
  }
}

void ShmSegment::mark_broken() {
  if (rank_ < 0) return;
  RankSlot& me = slot(rank_);
  me.state.store(kBroken);
  futex(&me.arrived, FUTEX_WAKE, INT_MAX, nullptr);
}

void ShmSegment::check_peer(int k, const char* what) {
  RankSlot& peer = slot(k);
  const int32_t pid = peer.pid.load();
  bool dead = false;
  int fd = pidfds_[static_cast<size_t>(k)];
  if (fd >= 0) {
    pollfd p{fd, POLLIN, 0};
    dead = ::poll(&p, 1, 0) > 0;  // a pidfd is readable once its process exited
  } else if (pid > 0 && pid != ::getpid()) {
    dead = ::kill(pid, 0) != 0 && errno == ESRCH;
  }
  const std::string who = "rank " + std::to_string(k) + " (pid " + std::to_string(pid) + ")";
  if (dead) {
    throw NetworkError("lost the connection to a peer rank: " + who + " exited while rank " +
                       std::to_string(rank_) + " waited for it in " + what +
                       " (shared-memory transport)");
  }
  uint32_t state = peer.state.load();
  if (state == kLeft) {
    throw NetworkError("lost the connection to a peer rank: " + who +
                       " left the group (destroyed it) while rank " + std::to_string(rank_) +
                       " waited for it in " + what +
                       " (shared-memory transport); every rank must call the same collectives");
  }
  if (state == kBroken) {
    throw NetworkError("lost the connection to a peer rank: " + who +
                       " gave up on the group after an error while rank " + std::to_string(rank_) +
                       " waited for it in " + what + " (shared-memory transport)");
  }
}

void ShmSegment::wait_for(int k, uint32_t target, std::chrono::microseconds spin,
                          Clock::time_point deadline, const char* what) {
  RankSlot& peer = slot(k);
  if (reached(peer.arrived.load(), target)) return;
  if (spin.count() > 0) {
    const auto spin_end = Clock::now() + spin;
    for (int i = 1;; ++i) {
      cpu_relax();
      if (reached(peer.arrived.load(), target)) return;
      if ((i & 63) == 0 && Clock::now() >= spin_end) break;
    }
  }
  while (true) {
    auto now = Clock::now();
    if (now >= deadline) {
      check_peer(k, what);  // a dead peer explains the wait better than a timeout
      throw TimeoutError("timed out in the shared-memory transport: rank " + std::to_string(rank_) +
                         " waited for rank " + std::to_string(k) + " in " + what);
    }
    auto slice = std::min<Clock::duration>(deadline - now, kLivenessCheck);
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(slice).count();
    timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    peer.sleepers.fetch_add(1);
    ++stats_.sleeps;
    if (op_first_) ++stats_.first_sleeps;
    uint32_t seen = peer.arrived.load();
    if (!reached(seen, target)) futex(&peer.arrived, FUTEX_WAIT, seen, &ts);
    peer.sleepers.fetch_sub(1);
    if (reached(peer.arrived.load(), target)) return;
    check_peer(k, what);
  }
}

void ShmSegment::barrier(Clock::time_point deadline, const char* what) {
  const uint32_t target = ++epoch_;
  RankSlot& me = slot(rank_);
  me.arrived.store(target);
  if (me.sleepers.load() != 0) futex(&me.arrived, FUTEX_WAKE, INT_MAX, nullptr);
  const auto t0 = Clock::now();
  const auto spin = op_first_ ? spin_ : inner_spin_;
  {
    timeline::Span span(timeline::kWaitForPeers, "comm");  // timeline hook
    for (int k = 0; k < world_; ++k) {
      if (k != rank_) wait_for(k, target, spin, deadline, what);
    }
  }
  ++stats_.barriers;
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  stats_.wait_seconds += waited;
  if (op_first_) stats_.first_wait_seconds += waited;
  op_first_ = false;
}

}  // namespace dtrain::shm
