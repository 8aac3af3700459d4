#include "comm/shm/shm_pool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <string>

#include "dtrain/error.h"

namespace dtrain::shm {

namespace {

// `bytes` rounded up to whole pages (what fallocate reserves and a hole punch gives back).
size_t whole_pages(size_t bytes) {
  constexpr size_t kPage = 4096;
  return (bytes + kPage - 1) / kPage * kPage;
}

}  // namespace

ShmPool::ShmPool(int fd, size_t file_offset, size_t bytes_per_rank, int world, int rank)
    : fd_(fd),
      file_offset_(file_offset),
      bytes_per_rank_(bytes_per_rank),
      world_(world),
      rank_(rank) {
  // No MAP_POPULATE: the regions are sparse until their owners place tensors in them.
  void* p = ::mmap(nullptr, bytes_per_rank_ * static_cast<size_t>(world_), PROT_READ | PROT_WRITE,
                   MAP_SHARED, fd_, static_cast<off_t>(file_offset_));
  if (p == MAP_FAILED) {
    const int e = errno;
    ::close(fd_);
    throw NetworkError("shared-memory transport: cannot map the segment's pools (" +
                       std::to_string(bytes_per_rank_) + " bytes x " + std::to_string(world_) +
                       " ranks): " + std::strerror(e) +
                       "; set DTRAIN_SHM_POOL_BYTES=0 to go without them");
  }
  base_ = static_cast<unsigned char*>(p);
  MutexLock lock(mu_);
  free_[0] = bytes_per_rank_;
}

ShmPool::~ShmPool() {
  ::munmap(base_, bytes_per_rank_ * static_cast<size_t>(world_));
  ::close(fd_);
}

unsigned char* ShmPool::region(int k) const {
  return base_ + static_cast<size_t>(k) * bytes_per_rank_;
}

off_t ShmPool::file_position(size_t off) const {
  return static_cast<off_t>(file_offset_ + static_cast<size_t>(rank_) * bytes_per_rank_ + off);
}

uint64_t ShmPool::offset_of(const void* p, size_t bytes) const {
  const auto* lo = region(rank_);
  const auto* q = static_cast<const unsigned char*>(p);
  if (q < lo || bytes > bytes_per_rank_ || static_cast<size_t>(q - lo) > bytes_per_rank_ - bytes)
    return kNoPool;
  return static_cast<uint64_t>(q - lo);
}

void* ShmPool::allocate(size_t bytes) {
  const size_t len = whole_pages(std::max<size_t>(bytes, 1));
  MutexLock lock(mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < len) continue;
    const size_t off = it->first;
    // Reserve the pages now: without room in /dev/shm this fails here, not as a SIGBUS later.
    if (::posix_fallocate(fd_, file_position(off), static_cast<off_t>(len)) != 0) return nullptr;
    const size_t rest = it->second - len;
    free_.erase(it);
    if (rest > 0) free_[off + len] = rest;
    used_[off] = len;
    return region(rank_) + off;
  }
  return nullptr;
}

void ShmPool::release(void* p) {
  const auto off = static_cast<size_t>(static_cast<unsigned char*>(p) - region(rank_));
  MutexLock lock(mu_);
  const auto it = used_.find(off);
  if (it == used_.end()) return;
  size_t start = off, len = it->second;
  used_.erase(it);
  // The pages go back to /dev/shm (the range reads as zeros until it is placed again).
  ::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, file_position(start),
              static_cast<off_t>(len));
  // Merge with the free neighbours.
  auto next = free_.lower_bound(start);
  if (next != free_.end() && start + len == next->first) {
    len += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      len += prev->second;
      free_.erase(prev);
    }
  }
  free_[start] = len;
}

}  // namespace dtrain::shm
