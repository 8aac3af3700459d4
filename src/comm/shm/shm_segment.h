// One POSIX shared-memory segment shared by the ranks of a group on one host, and the
// barrier the shared-memory collectives are built from.
//
// The protocol, step by step:
//  1. Rank 0 creates the segment (shm_open O_EXCL, ftruncate, mmap) under a fresh name and
//     publishes the name through the group's store; the other ranks map it.
//  2. Every rank writes its pid into its slot and adds 1 to a store counter; the rank whose
//     add completes the count unlinks the name at once. From then on the segment lives only
//     as long as some rank maps it: nothing is left in /dev/shm, even if every rank is
//     SIGKILLed. (A crash between create and the last map - milliseconds at start-up - is
//     the only window in which a name can be left behind.)
//  3. Each rank opens a pidfd for every peer, so a waiting rank learns at once (at the next
//     wake-up, at most kLivenessCheck later) that a peer process exited.
//  4. barrier(): rank r stores its barrier count in its own cache line, wakes whoever sleeps
//     on it (only if someone announced it sleeps: no syscall otherwise), and waits until every
//     peer's count has reached its own - spinning for a short while, then sleeping on the
//     peer's count with futex(FUTEX_WAIT). Counts differ by at most one across ranks.
//     Stores and loads are sequentially consistent, so the data a rank wrote before its
//     barrier is visible to every rank after the barrier.
//  5. Data buffers: two generations ("parities") of one slot per rank. A collective moves its
//     payload in chunks of at most slot_bytes(); chunk i uses parity i % 2. Every chunk has
//     a barrier between its writes and its reads, and each rank's reads of chunk i finish
//     before it enters chunk i+1's first barrier, so when a rank writes chunk i+2 into the
//     same slot, nobody is still reading chunk i.
//  6. Pools (comm/shm/shm_pool.h): after the slots, one sparse region per rank where that rank
//     places tensors that live in shared memory; an all_reduce of such a tensor publishes where
//     it lies (OpDescriptor::pool_offset) and the others read it there.
//
// Every wait ends by the caller's deadline (TimeoutError), when a peer's process exited
// (NetworkError), or when a peer left or broke the group (NetworkError).
//
// Thread safety: one thread at a time per ShmSegment object (the group's worker thread).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/shm/shm_pool.h"

namespace dtrain::shm {

using Clock = std::chrono::steady_clock;

// What a collective says about itself before its first barrier, so ranks that called
// different collectives (or the same one with different sizes) fail with a clear message
// instead of exchanging garbage.
struct OpDescriptor {
  uint32_t op = 0;      // ShmOp
  uint32_t dtype = 0;   // at::ScalarType
  uint32_t reduce = 0;  // c10d::ReduceOp for all_reduce
  int32_t root = -1;    // broadcast
  uint64_t numel = 0;
  uint64_t seq = 0;  // the collective's number in this group (1, 2, ...)
  // Where this rank's tensor lies in its pool (all_reduce), or kNoPool. Differs across ranks.
  uint64_t pool_offset = kNoPool;
};

// Per-rank control block, one cache line (two, to keep the descriptors off the hot line).
struct alignas(64) RankSlot {
  std::atomic<uint32_t> arrived{0};   // barriers passed + 1 (the futex word)
  std::atomic<uint32_t> sleepers{0};  // peers sleeping on `arrived`
  std::atomic<int32_t> pid{0};
  std::atomic<uint32_t> state{0};  // SlotState
  char pad0[48];
  OpDescriptor desc[2];  // by collective parity (seq % 2)
};

enum SlotState : uint32_t { kDetached = 0, kAttached = 1, kLeft = 2, kBroken = 3 };

struct Header {
  uint64_t magic;
  uint32_t world;
  uint32_t version;
  uint64_t slot_bytes;
  uint64_t data_offset;
  uint64_t pool_offset;  // where the pools start (after the slots), page-aligned
  uint64_t pool_bytes;   // one rank's pool
  uint64_t total_bytes;
};

struct SegmentOptions {
  // Bytes of one rank's buffer in one parity. Default: $DTRAIN_SHM_SLOT_BYTES, else 4 MiB
  // (32 MiB / world size from 9 ranks up, at least 64 KiB).
  size_t slot_bytes = 0;
  // How long a waiting rank spins before sleeping on a futex. Default: $DTRAIN_SHM_SPIN_US
  // (0 = sleep at once), else 3 ms where the ranks and their intra-op threads
  // (OMP_NUM_THREADS) leave half this process's CPUs free (kSpareCoresSpin), else 20 us (with
  // fewer cores than ranks, spinning only takes the core from the rank it waits for).
  std::chrono::microseconds spin{-1};
  // How long a rank spins in the later barriers of a collective (after its first, every peer is
  // inside the collective: what it waits for is a peer's share of the work, or a peer that has
  // not woken up yet). Default: $DTRAIN_SHM_INNER_SPIN_US, else `spin`.
  std::chrono::microseconds inner_spin{-1};
  // Bytes of one rank's pool (6. above); 0: no pools. Default: $DTRAIN_SHM_POOL_BYTES, else
  // 1 GiB (virtual: pages are taken only for what is placed there), or none where the process's
  // address space is limited (RLIMIT_AS); at most 256 GiB / world.
  int64_t pool_bytes = -1;
  // This rank's host identity (host_identity() if empty). For tests of the fallback.
  std::string host_id;
};

class ShmSegment {
 public:
  // Creates (rank 0) or maps (others) the segment. `name` is the shm_open name ("/...").
  static std::unique_ptr<ShmSegment> create(const std::string& name, int world,
                                            const SegmentOptions& o);
  static std::unique_ptr<ShmSegment> open(const std::string& name, int rank, int world,
                                          const SegmentOptions& o);
  ~ShmSegment();  // marks this rank as left (waking peers that wait for it) and unmaps
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  // Step 2 of the protocol: publish this rank's pid and state. rank 0 calls it too.
  void attach(int rank);
  // Step 3: open a pidfd for each peer (after every rank attached).
  void watch_peers();
  // Removes the name (idempotent; ENOENT is fine).
  static void unlink(const std::string& name);

  int rank() const { return rank_; }
  int world() const { return world_; }
  size_t slot_bytes() const { return slot_bytes_; }
  // How long a waiter spins before it sleeps in a collective's first barrier, and in its later
  // ones.
  std::chrono::microseconds spin() const { return spin_; }
  std::chrono::microseconds inner_spin() const { return inner_spin_; }
  // Rank k's buffer in parity p.
  unsigned char* buffer(int parity, int k) const;
  RankSlot& slot(int k) const;
  // The pools, or nullptr when the segment has none. Shared: tensors placed there keep it.
  const std::shared_ptr<ShmPool>& pool() const { return pool_; }

  // The next barrier is a collective's first (its peers may still be computing); the ones
  // after it, until the next begin_op(), are its later barriers (the peers are inside it).
  void begin_op() { op_first_ = true; }
  // Step 4. `what` names the collective for error messages.
  void barrier(Clock::time_point deadline, const char* what);
  // Marks this rank broken (after an error): peers waiting for it fail at once.
  void mark_broken();

  // Counters for tuning ($DTRAIN_SHM_STATS=1 prints them when the group is destroyed).
  struct Stats {
    uint64_t barriers = 0;
    uint64_t sleeps = 0;      // futex waits
    double wait_seconds = 0;  // inside barrier(), waiting for peers
    // Of those, in the collectives' first barriers (the ranks' skew when they call it).
    uint64_t first_sleeps = 0;
    double first_wait_seconds = 0;
  };
  const Stats& stats() const { return stats_; }

 private:
  ShmSegment(std::string name, int world, void* base, size_t bytes, const SegmentOptions& o);
  // Maps the pools of the segment whose file is `fd` (taking `fd` over), at `rank`.
  void open_pool(int fd, int rank);
  void wait_for(int k, uint32_t target, std::chrono::microseconds spin, Clock::time_point deadline,
                const char* what);
  void check_peer(int k, const char* what);

  std::string name_;
  int rank_ = -1;
  int world_;
  void* base_;
  size_t bytes_;
  size_t slot_bytes_;
  std::chrono::microseconds spin_;
  std::chrono::microseconds inner_spin_;
  bool op_first_ = true;
  uint32_t epoch_ = 0;  // barriers entered by this rank
  Stats stats_;
  std::vector<int> pidfds_;
  std::shared_ptr<ShmPool> pool_;
};

// Defaults from the environment (documented in SegmentOptions).
SegmentOptions segment_options_from_env();

// Where the ranks leave cores free (spare_cores), a waiter keeps a CPU no peer needs: how long it
// spins before it sleeps in a collective's barriers, and in the caller's wait for a collective
// the backend's thread runs. Measured at 8 ranks on the 16-core H200 machine (2026-11-28, the
// example's MLP): 84.4k samples/s, against 76.1k with 200 us in the first barrier and 1 ms in the
// later ones and the wait, and 70.9k with 200 us everywhere (and no run by the waiter) - the
// ranks' skew is milliseconds there, and a sleeping rank pays its wake-up on top of it.
constexpr std::chrono::microseconds kSpareCoresSpin{3000};
constexpr std::chrono::microseconds kSpareCoresWaitSpin{5000};

// One step of a spin-wait: tells the CPU this thread only polls.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Whether `world` ranks on this host, each with its intra-op threads (OMP_NUM_THREADS, else one
// per CPU), leave at least half the CPUs this process may run on free: where they do, waiting
// ranks spin longer before they sleep.
bool spare_cores(int world);

}  // namespace dtrain::shm
