// Element-wise reductions of several equally long source arrays into one destination, for
// the shared-memory all_reduce. Sources are combined in the order given (rank order), so
// every rank that reduces the same chunk gets bitwise the same result. float16 and
// bfloat16 accumulate in float32 and round once.
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace dtrain::shm {

template <typename T>
using Acc = std::conditional_t<std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16>, float, T>;

struct Sum {
  template <typename A>
  static A apply(A a, A b) { return a + b; }
};
struct Prod {
  template <typename A>
  static A apply(A a, A b) { return a * b; }
};
struct Min {
  template <typename A>
  static A apply(A a, A b) { return std::min(a, b); }
};
struct Max {
  template <typename A>
  static A apply(A a, A b) { return std::max(a, b); }
};

// dst[i] = src[0][i] op src[1][i] op ... op src[n-1][i]. dst may alias one of the sources
// element for element (it is written only after every source element i was read).
template <typename T, typename Op>
void reduce_n(T* dst, const T* const* src, int n, size_t count) {
  using A = Acc<T>;
  if (n == 2) {
    const T* a = src[0];
    const T* b = src[1];
    for (size_t i = 0; i < count; ++i) dst[i] = static_cast<T>(Op::apply(static_cast<A>(a[i]), static_cast<A>(b[i])));
    return;
  }
  constexpr size_t kBlock = 1024;
  A acc[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t m = std::min(kBlock, count - base);
    const T* s0 = src[0] + base;
    for (size_t i = 0; i < m; ++i) acc[i] = static_cast<A>(s0[i]);
    for (int k = 1; k < n; ++k) {
      const T* sk = src[k] + base;
      for (size_t i = 0; i < m; ++i) acc[i] = Op::apply(acc[i], static_cast<A>(sk[i]));
    }
    T* d = dst + base;
    for (size_t i = 0; i < m; ++i) d[i] = static_cast<T>(acc[i]);
  }
}

inline bool reduce_supported(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kBFloat16:
    case at::kChar:
    case at::kByte:
    case at::kShort:
    case at::kInt:
    case at::kLong:
      return true;
    default:
      return false;
  }
}

inline bool reduce_supported(c10d::ReduceOp::RedOpType op) {
  return op == c10d::ReduceOp::SUM || op == c10d::ReduceOp::PRODUCT || op == c10d::ReduceOp::MIN ||
         op == c10d::ReduceOp::MAX;
}

template <typename T>
void reduce_typed(void* dst, const void* const* src, int n, size_t count, c10d::ReduceOp::RedOpType op) {
  auto d = static_cast<T*>(dst);
  auto s = reinterpret_cast<const T* const*>(src);
  switch (op) {
    case c10d::ReduceOp::SUM:
      return reduce_n<T, Sum>(d, s, n, count);
    case c10d::ReduceOp::PRODUCT:
      return reduce_n<T, Prod>(d, s, n, count);
    case c10d::ReduceOp::MIN:
      return reduce_n<T, Min>(d, s, n, count);
    case c10d::ReduceOp::MAX:
      return reduce_n<T, Max>(d, s, n, count);
    default:
      break;
  }
}

// REQUIRES: reduce_supported(dtype) and reduce_supported(op).
inline void reduce_into(at::ScalarType dtype, c10d::ReduceOp::RedOpType op, void* dst, const void* const* src, int n,
                   size_t count) {
  switch (dtype) {
    case at::kFloat: return reduce_typed<float>(dst, src, n, count, op);
    case at::kDouble: return reduce_typed<double>(dst, src, n, count, op);
    case at::kHalf: return reduce_typed<c10::Half>(dst, src, n, count, op);
    case at::kBFloat16: return reduce_typed<c10::BFloat16>(dst, src, n, count, op);
    case at::kChar: return reduce_typed<int8_t>(dst, src, n, count, op);
    case at::kByte: return reduce_typed<uint8_t>(dst, src, n, count, op);
    case at::kShort: return reduce_typed<int16_t>(dst, src, n, count, op);
    case at::kInt: return reduce_typed<int32_t>(dst, src, n, count, op);
    case at::kLong: return reduce_typed<int64_t>(dst, src, n, count, op);
    default: break;
  }
}

}  // namespace dtrain::shm
