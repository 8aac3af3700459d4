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
using Acc =
    std::conditional_t<std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16>, float, T>;

struct Sum {
  template <typename A>
  static A apply(A a, A b) {
    return a + b;
  }
};
struct Prod {
  template <typename A>
  static A apply(A a, A b) {
    return a * b;
  }
};
struct Min {
  template <typename A>
  static A apply(A a, A b) {
    return std::min(a, b);
  }
};
struct Max {
  template <typename A>
  static A apply(A a, A b) {
    return std::max(a, b);
  }
};

// dst[i] = src[0][i] op src[1][i] op ... op src[n-1][i], divided by n for Avg; also into
// dst2[i] if dst2 is not null (one pass instead of a reduction and a copy). dst and dst2 may
// alias a source element for element (element i is written after every source element i
// was read).
template <typename T, typename Op, bool kAvg>
void reduce_n(T* dst, T* dst2, const T* const* src, int n, size_t count) {
  using A = Acc<T>;
  const A div = static_cast<A>(n);
  auto finish = [div](A v) { return static_cast<T>(kAvg ? v / div : v); };
  if (n == 2) {
    const T* a = src[0];
    const T* b = src[1];
    if (dst2 == nullptr) {
      for (size_t i = 0; i < count; ++i)
        dst[i] = finish(Op::apply(static_cast<A>(a[i]), static_cast<A>(b[i])));
    } else {
      for (size_t i = 0; i < count; ++i) {
        const T v = finish(Op::apply(static_cast<A>(a[i]), static_cast<A>(b[i])));
        dst[i] = v;
        dst2[i] = v;
      }
    }
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
    for (size_t i = 0; i < m; ++i) d[i] = finish(acc[i]);
    if (dst2 != nullptr) {
      T* d2 = dst2 + base;
      for (size_t i = 0; i < m; ++i) d2[i] = finish(acc[i]);
    }
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

// AVG (sum, then divide by the number of ranks) only for floating-point dtypes: an integer
// average would truncate (Gloo has no AVG at all).
inline bool reduce_supported(at::ScalarType t, c10d::ReduceOp::RedOpType op) {
  if (!reduce_supported(t)) return false;
  if (op == c10d::ReduceOp::AVG) return at::isFloatingType(t);
  return op == c10d::ReduceOp::SUM || op == c10d::ReduceOp::PRODUCT || op == c10d::ReduceOp::MIN ||
         op == c10d::ReduceOp::MAX;
}

template <typename T>
void reduce_typed(void* dst, void* dst2, const void* const* src, int n, size_t count,
                  c10d::ReduceOp::RedOpType op) {
  auto d = static_cast<T*>(dst);
  auto d2 = static_cast<T*>(dst2);
  auto s = reinterpret_cast<const T* const*>(src);
  switch (op) {
    case c10d::ReduceOp::SUM:
      return reduce_n<T, Sum, false>(d, d2, s, n, count);
    case c10d::ReduceOp::AVG:
      if constexpr (std::is_floating_point_v<Acc<T>>)
        return reduce_n<T, Sum, true>(d, d2, s, n, count);
      break;
    case c10d::ReduceOp::PRODUCT:
      return reduce_n<T, Prod, false>(d, d2, s, n, count);
    case c10d::ReduceOp::MIN:
      return reduce_n<T, Min, false>(d, d2, s, n, count);
    case c10d::ReduceOp::MAX:
      return reduce_n<T, Max, false>(d, d2, s, n, count);
    default:
      break;
  }
}

// REQUIRES: reduce_supported(dtype, op). dst2 may be null.
inline void reduce_into(at::ScalarType dtype, c10d::ReduceOp::RedOpType op, void* dst, void* dst2,
                        const void* const* src, int n, size_t count) {
  switch (dtype) {
    case at::kFloat:
      return reduce_typed<float>(dst, dst2, src, n, count, op);
    case at::kDouble:
      return reduce_typed<double>(dst, dst2, src, n, count, op);
    case at::kHalf:
      return reduce_typed<c10::Half>(dst, dst2, src, n, count, op);
    case at::kBFloat16:
      return reduce_typed<c10::BFloat16>(dst, dst2, src, n, count, op);
    case at::kChar:
      return reduce_typed<int8_t>(dst, dst2, src, n, count, op);
    case at::kByte:
      return reduce_typed<uint8_t>(dst, dst2, src, n, count, op);
    case at::kShort:
      return reduce_typed<int16_t>(dst, dst2, src, n, count, op);
    case at::kInt:
      return reduce_typed<int32_t>(dst, dst2, src, n, count, op);
    case at::kLong:
      return reduce_typed<int64_t>(dst, dst2, src, n, count, op);
    default:
      break;
  }
}

}  // namespace dtrain::shm
