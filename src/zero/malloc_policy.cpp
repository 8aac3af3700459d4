// ZeRO's malloc policy (malloc_policy.h).
#include "zero/malloc_policy.h"

#include <cstdlib>
#include <mutex>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace dtrain::zero::detail {

void keep_large_buffers_unmapped() {
#if defined(__GLIBC__)
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr) ::mallopt(M_MMAP_THRESHOLD, 1 << 20);
  });
#endif
}

}  // namespace dtrain::zero::detail
