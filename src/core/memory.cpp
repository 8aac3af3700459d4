#include "core/memory.h"

#include <sys/mman.h>

#include <cstdint>

namespace dtrain::detail {

void advise_huge_pages(const void* data, std::size_t size) {
  constexpr std::size_t kMin = std::size_t{4} << 20;
  constexpr std::uintptr_t kPage = 4096;
  if (data == nullptr || size < kMin) return;
  auto begin = (reinterpret_cast<std::uintptr_t>(data) + kPage - 1) & ~(kPage - 1);
  auto end = (reinterpret_cast<std::uintptr_t>(data) + size) & ~(kPage - 1);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

std::string large_string(std::size_t n) {
  std::string s;
  s.reserve(n);
  advise_huge_pages(s.data(), n);
  s.resize(n);
  return s;
}

}  // namespace dtrain::detail
