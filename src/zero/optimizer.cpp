// The CPU Adam of ZeRO-Offload: one pass over flat arrays, plain loops the compiler vectorises
// (built with -fno-math-errno so sqrt vectorises; AVX2/AVX-512 clones chosen at run time),
// split over threads in chunks. PyTorch's Adam formulas, so results match torch::optim::Adam.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

#include "dtrain/zero.h"

namespace dtrain::zero {
namespace {

// One function per type (multiversioned functions cannot be templates).
#define DTRAIN_ADAM_CHUNK(NAME, T)                                                               \
  __attribute__((target_clones("avx512f", "avx2", "default"))) void NAME(                        \
      T* __restrict p, const T* __restrict g, T* __restrict m, T* __restrict v, int64_t n, T b1, \
      T b2, T eps, T step_size, T sqrt_bc2, T wd, T decay, bool adamw, T omb1, T omb2) {         \
    if (adamw) {                                                                                 \
      for (int64_t i = 0; i < n; ++i) {                                                          \
        T pi = p[i] * decay;                                                                     \
        T gi = g[i];                                                                             \
        T mi = m[i] * b1 + omb1 * gi;                                                            \
        T vi = v[i] * b2 + omb2 * gi * gi;                                                       \
        m[i] = mi;                                                                               \
        v[i] = vi;                                                                               \
        p[i] = pi - step_size * mi / (std::sqrt(vi) / sqrt_bc2 + eps);                           \
      }                                                                                          \
    } else {                                                                                     \
      for (int64_t i = 0; i < n; ++i) {                                                          \
        T pi = p[i];                                                                             \
        T gi = g[i] + wd * pi;                                                                   \
        T mi = m[i] * b1 + omb1 * gi;                                                            \
        T vi = v[i] * b2 + omb2 * gi * gi;                                                       \
        m[i] = mi;                                                                               \
        v[i] = vi;                                                                               \
        p[i] = pi - step_size * mi / (std::sqrt(vi) / sqrt_bc2 + eps);                           \
      }                                                                                          \
    }                                                                                            \
  }
DTRAIN_ADAM_CHUNK(adam_chunk_f, float)
DTRAIN_ADAM_CHUNK(adam_chunk_d, double)
inline void adam_chunk(float* p, const float* g, float* m, float* v, int64_t n, float b1, float b2,
                       float eps, float ss, float inv, float wd, float decay, bool adamw,
                       float omb1, float omb2) {
  adam_chunk_f(p, g, m, v, n, b1, b2, eps, ss, inv, wd, decay, adamw, omb1, omb2);
}
inline void adam_chunk(double* p, const double* g, double* m, double* v, int64_t n, double b1,
                       double b2, double eps, double ss, double inv, double wd, double decay,
                       bool adamw, double omb1, double omb2) {
  adam_chunk_d(p, g, m, v, n, b1, b2, eps, ss, inv, wd, decay, adamw, omb1, omb2);
}

template <typename T>
void adam(T* p, const T* g, T* m, T* v, int64_t n, int64_t step, double lr, double b1, double b2,
          double eps, double wd, bool adamw, int threads) {
  const double bc1 = 1 - std::pow(b1, double(step)), bc2 = 1 - std::pow(b2, double(step));
  const T step_size = T(lr / bc1), inv = T(std::sqrt(bc2));
  const T decay = T(1 - lr * wd);
  const int nt = threads > 0 ? threads : at::get_num_threads();
  // Chunks of >= 64k elements (a chunk of each array stays in L2), at most one per thread.
  const int64_t grain = std::max<int64_t>(65536, (n + nt - 1) / nt);
  if (nt <= 1 || n <= grain) {
    adam_chunk(p, g, m, v, n, T(b1), T(b2), T(eps), step_size, inv, T(wd), decay, adamw, T(1 - b1),
               T(1 - b2));
    return;
  }
  at::parallel_for(0, n, grain, [&](int64_t lo, int64_t hi) {
    adam_chunk(p + lo, g + lo, m + lo, v + lo, hi - lo, T(b1), T(b2), T(eps), step_size, inv, T(wd),
               decay, adamw, T(1 - b1), T(1 - b2));
  });
}

}  // namespace

void cpu_adam_step(float* p, const float* g, float* m, float* v, int64_t n, int64_t step, double lr,
                   double b1, double b2, double eps, double wd, bool adamw, int threads) {
  adam<float>(p, g, m, v, n, step, lr, b1, b2, eps, wd, adamw, threads);
}
void cpu_adam_step(double* p, const double* g, double* m, double* v, int64_t n, int64_t step,
                   double lr, double b1, double b2, double eps, double wd, bool adamw,
                   int threads) {
  adam<double>(p, g, m, v, n, step, lr, b1, b2, eps, wd, adamw, threads);
}

}  // namespace dtrain::zero
