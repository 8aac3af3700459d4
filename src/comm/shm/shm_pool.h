// The shared-memory segment's pools: one region per rank, in which that rank places tensors
// that live in shared memory - DDP's gradient buckets - so that the shared-memory all_reduce
// reads and writes them where they are instead of copying them into its slots and back
// (comm/shm/shm_group.h). Every rank maps every region; only its owner allocates in one.
//
// The regions are a sparse part of the segment's file: a range's pages are reserved
// (fallocate) when a tensor is placed there and given back (a hole punched) when it is freed,
// so a /dev/shm without room makes allocate() return nullptr - the caller then uses private
// memory - instead of a SIGBUS at the first write. The pool outlives the group while any tensor
// placed in it does (it is held by a shared_ptr that each tensor's deleter keeps).
//
// Thread safety: allocate() and release() may be called from any thread.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>

#include "core/thread_annotations.h"

namespace dtrain::shm {

// OpDescriptor::pool_offset of a tensor that is not in its rank's pool.
constexpr uint64_t kNoPool = ~uint64_t{0};

class ShmPool {
 public:
  // Maps `world` regions of `bytes_per_rank` at `file_offset` of the segment's file `fd`
  // (page-aligned), and takes `fd` over (closed by the destructor). Throws NetworkError when the
  // mapping fails.
  ShmPool(int fd, size_t file_offset, size_t bytes_per_rank, int world, int rank);
  ~ShmPool();
  ShmPool(const ShmPool&) = delete;
  ShmPool& operator=(const ShmPool&) = delete;

  // `bytes` (rounded up to whole pages) in this rank's region, its pages reserved; nullptr when
  // the region has no such free range or /dev/shm no room.
  void* allocate(size_t bytes) DTRAIN_EXCLUDES(mu_);
  // Gives back what allocate() returned (its pages to /dev/shm).
  void release(void* p) DTRAIN_EXCLUDES(mu_);

  // Rank k's region (readable and writable by every rank).
  unsigned char* region(int k) const;
  // Where [p, p + bytes) lies in this rank's region, or kNoPool when it does not lie there.
  uint64_t offset_of(const void* p, size_t bytes) const;

 private:
  // Where offset `off` of this rank's region is in the segment's file.
  off_t file_position(size_t off) const;

  int fd_;
  size_t file_offset_;
  size_t bytes_per_rank_;
  int world_;
  int rank_;
  unsigned char* base_ = nullptr;
  Mutex mu_;
  std::map<size_t, size_t> free_ DTRAIN_GUARDED_BY(mu_);  // offset in this rank's region -> length
  std::map<size_t, size_t> used_ DTRAIN_GUARDED_BY(mu_);
};

}  // namespace dtrain::shm
