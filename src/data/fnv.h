// 64-bit FNV-1a: a stable hash (the same on every build and machine), for names and digests
// that outlive the process (shared cache entries, the table digest in elastic positions).
#pragma once

#include <cstdint>
#include <string_view>

namespace dtrain::data::detail {

inline uint64_t fnv1a(std::string_view s, uint64_t h = 14695981039346656037ull) {
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace dtrain::data::detail
