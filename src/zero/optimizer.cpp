// The CPU Adam of ZeRO-Offload: one pass over flat arrays, plain loops the compiler vectorises
// (built with -fno-math-errno so sqrt vectorises; AVX2/AVX-512 clones chosen at run time),
// split over threads in chunks. DeepSpeed's CPU Adam formulas and constants (within float32
// noise of torch::optim::Adam).
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

#include "dtrain/zero.h"
#include "zero/cpu_optimizers.h"

namespace dtrain::zero {
namespace {

// One function per type (multiversioned functions cannot be templates). DeepSpeed's CPU Adam
// (csrc/adam/cpu_adam_impl.cpp) operation by operation: every constant in the element type
// (1 - beta as T(1) - T(beta), not T(1 - beta)), the decoupled decay p += (-lr * wd) * p, the
// denominator sqrt(v) * (1 / sqrt(bc2)) + eps, the update p += (m / denom) * (-lr / bc1).
#define DTRAIN_ADAM_CHUNK(NAME, T)                                                               \
  __attribute__((target_clones("avx512f", "avx2", "default"))) void NAME(                        \
      T* __restrict p, const T* __restrict g, T* __restrict m, T* __restrict v, int64_t n, T b1, \
      T b2, T eps, T step_size, T inv_sqrt_bc2, T wd, T w_decay, bool adamw, T omb1, T omb2) {   \
    for (int64_t i = 0; i < n; ++i) {                                                            \
      T pi = p[i];                                                                               \
      T gi = g[i];                                                                               \
      if (!adamw && wd > 0) gi = pi * wd + gi;                                                   \
      T mi = gi * omb1 + m[i] * b1;                                                              \
      T vi = (gi * gi) * omb2 + v[i] * b2;                                                       \
      m[i] = mi;                                                                                 \
      v[i] = vi;                                                                                 \
      T upd = mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);                                         \
      if (adamw && wd > 0) pi = w_decay * pi + pi;                                               \
      p[i] = upd * step_size + pi;                                                               \
    }                                                                                            \
  }
DTRAIN_ADAM_CHUNK(adam_chunk_f, float)
DTRAIN_ADAM_CHUNK(adam_chunk_d, double)
inline void adam_chunk(float* p, const float* g, float* m, float* v, int64_t n, float b1, float b2,
                       float eps, float ss, float inv, float wd, float w_decay, bool adamw,
                       float omb1, float omb2) {
  adam_chunk_f(p, g, m, v, n, b1, b2, eps, ss, inv, wd, w_decay, adamw, omb1, omb2);
}
inline void adam_chunk(double* p, const double* g, double* m, double* v, int64_t n, double b1,
                       double b2, double eps, double ss, double inv, double wd, double w_decay,
                       bool adamw, double omb1, double omb2) {
  adam_chunk_d(p, g, m, v, n, b1, b2, eps, ss, inv, wd, w_decay, adamw, omb1, omb2);
}

template <typename T>
void adam(T* p, const T* g, T* m, T* v, int64_t n, int64_t step, double lr, double b1, double b2,
          double eps, double wd, bool adamw, int threads, bool bias_correction) {
  // beta^step as DeepSpeed accumulates it: a running product in T.
  T b1t = 1, b2t = 1;
  if (step <= (int64_t(1) << 20)) {
    for (int64_t s = 0; s < step; ++s) b1t *= T(b1), b2t *= T(b2);
  } else {  // long past mattering (and what DeepSpeed computes after a jump in the step)
    b1t = T(std::pow(T(b1), step));
    b2t = T(std::pow(T(b2), step));
  }
  const T bc1 = bias_correction ? T(1) - b1t : T(1);
  const T inv = bias_correction ? T(1) / std::sqrt(T(1) - b2t) : T(1);
  const T step_size = -T(lr) / bc1, w_decay = -T(lr) * T(wd);
  const T omb1 = T(1) - T(b1), omb2 = T(1) - T(b2);
  const int nt = threads > 0 ? threads : at::get_num_threads();
  // Chunks of >= 64k elements (a chunk of each array stays in L2), at most one per thread.
  const int64_t grain = std::max<int64_t>(65536, (n + nt - 1) / nt);
  if (nt <= 1 || n <= grain) {
    adam_chunk(p, g, m, v, n, T(b1), T(b2), T(eps), step_size, inv, T(wd), w_decay, adamw, omb1,
               omb2);
    return;
  }
  at::parallel_for(0, n, grain, [&](int64_t lo, int64_t hi) {
    adam_chunk(p + lo, g + lo, m + lo, v + lo, hi - lo, T(b1), T(b2), T(eps), step_size, inv, T(wd),
               w_decay, adamw, omb1, omb2);
  });
}

}  // namespace

void cpu_adam_step(float* p, const float* g, float* m, float* v, int64_t n, int64_t step, double lr,
                   double b1, double b2, double eps, double wd, bool adamw, int threads,
                   bool bias_correction) {
  adam<float>(p, g, m, v, n, step, lr, b1, b2, eps, wd, adamw, threads, bias_correction);
}
void cpu_adam_step(double* p, const double* g, double* m, double* v, int64_t n, int64_t step,
                   double lr, double b1, double b2, double eps, double wd, bool adamw, int threads,
                   bool bias_correction) {
  adam<double>(p, g, m, v, n, step, lr, b1, b2, eps, wd, adamw, threads, bias_correction);
}

namespace detail {
namespace {

// DeepSpeed's CPU Adagrad (csrc/adagrad/cpu_adagrad.cpp, includes/cpu_adagrad.h) runs its SIMD loop
// (simd_fma for all three multiply-adds) over the largest multiple of its SIMD width, then a
// scalar loop over the rest, as GCC compiled it there: the decay and the sum of squares
// contracted to fused multiply-adds, the update's product rounded on its own (it is also stored
// into the gradient). std::fma here, and the tail on its own, give the same roundings.
#define DTRAIN_ADAGRAD_CHUNK(NAME, T)                                                      \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void NAME( \
      T* __restrict p, const T* __restrict g, T* __restrict v, int64_t n, T wd, T eps,     \
      T step_size) {                                                                       \
    for (int64_t i = 0; i < n; ++i) {                                                      \
      T pi = p[i];                                                                         \
      T gi = g[i];                                                                         \
      if (wd > 0) gi = std::fma(pi, wd, gi);                                               \
      const T vi = std::fma(gi, gi, v[i]);                                                 \
      gi = gi / (std::sqrt(vi) + eps);                                                     \
      p[i] = std::fma(gi, step_size, pi);                                                  \
      v[i] = vi;                                                                           \
    }                                                                                      \
  }
DTRAIN_ADAGRAD_CHUNK(adagrad_chunk_f, float)
DTRAIN_ADAGRAD_CHUNK(adagrad_chunk_d, double)
inline void adagrad_chunk(float* p, const float* g, float* v, int64_t n, float wd, float eps,
                          float ss) {
  adagrad_chunk_f(p, g, v, n, wd, eps, ss);
}
inline void adagrad_chunk(double* p, const double* g, double* v, int64_t n, double wd, double eps,
                          double ss) {
  adagrad_chunk_d(p, g, v, n, wd, eps, ss);
}

// The scalar loop's elements: the update's product rounded before the add. GCC would contract
// the two statements into one multiply-add (-ffp-contract=fast, its default); clang contracts
// within one expression only.
#if defined(__clang__)
#define DTRAIN_NO_FP_CONTRACT
#else
#define DTRAIN_NO_FP_CONTRACT __attribute__((optimize("fp-contract=off")))
#endif
template <typename T>
DTRAIN_NO_FP_CONTRACT void adagrad_tail(T* p, const T* g, T* v, int64_t n, T wd, T eps,
                                        T step_size) {
  for (int64_t i = 0; i < n; ++i) {
    T gi = g[i];
    if (wd > 0) gi = std::fma(p[i], wd, gi);
    const T vi = std::fma(gi, gi, v[i]);
    gi = gi / (std::sqrt(vi) + eps);
    const T update = gi * step_size;
    p[i] = update + p[i];
    v[i] = vi;
  }
}

// The SIMD width DeepSpeed's CPU ops are built with on this machine (op_builder's simd_width():
// AVX-512 16 floats, AVX2 8), 0 where it builds them scalar.
int64_t deepspeed_simd_width() {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) return 16;
  if (__builtin_cpu_supports("avx2")) return 8;
#endif
  return 0;
}

template <typename T>
void adagrad(T* p, const T* g, T* v, int64_t n, double lr, double eps, double wd) {
  // DeepSpeed passes lr, eps and weight_decay as float and negates the rate in it.
  const T step_size = -1 * T(lr);
  const int64_t width = deepspeed_simd_width();
  const int64_t simd = width > 0 ? n - n % width : 0;
  adagrad_tail(p + simd, g + simd, v + simd, n - simd, T(wd), T(eps), step_size);
  const int nt = at::get_num_threads();
  const int64_t grain = std::max<int64_t>(65536, (simd + nt - 1) / nt);
  if (nt <= 1 || simd <= grain) return adagrad_chunk(p, g, v, simd, T(wd), T(eps), step_size);
  at::parallel_for(0, simd, grain, [&](int64_t lo, int64_t hi) {
    adagrad_chunk(p + lo, g + lo, v + lo, hi - lo, T(wd), T(eps), step_size);
  });
}

// DeepSpeed's CPU Lion (csrc/lion/cpu_lion_impl.cpp, includes/cpu_lion.h): its SIMD loop and its
// scalar loop (compiled with the multiply-adds contracted) round alike.
#define DTRAIN_LION_CHUNK(NAME, T)                                                            \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void NAME(    \
      T* __restrict p, const T* __restrict g, T* __restrict m, int64_t n, T b1, T b2, T omb1, \
      T omb2, T lr, T after_decay, bool decay) {                                              \
    for (int64_t i = 0; i < n; ++i) {                                                         \
      const T gi = g[i], mi = m[i];                                                           \
      const T c = std::fma(gi, omb1, mi * b1);                                                \
      const T update = std::signbit(c) ? lr : -lr;                                            \
      p[i] = decay ? std::fma(p[i], after_decay, update) : p[i] + update;                     \
      m[i] = std::fma(gi, omb2, mi * b2);                                                     \
    }                                                                                         \
  }
DTRAIN_LION_CHUNK(lion_chunk_f, float)
DTRAIN_LION_CHUNK(lion_chunk_d, double)
inline void lion_chunk(float* p, const float* g, float* m, int64_t n, float b1, float b2,
                       float omb1, float omb2, float lr, float after, bool decay) {
  lion_chunk_f(p, g, m, n, b1, b2, omb1, omb2, lr, after, decay);
}
inline void lion_chunk(double* p, const double* g, double* m, int64_t n, double b1, double b2,
                       double omb1, double omb2, double lr, double after, bool decay) {
  lion_chunk_d(p, g, m, n, b1, b2, omb1, omb2, lr, after, decay);
}

template <typename T>
void lion(T* p, const T* g, T* m, int64_t n, double lr, double beta1, double beta2, double wd) {
  const T b1 = T(beta1), b2 = T(beta2), omb1 = T(1) - b1, omb2 = T(1) - b2, alpha = T(lr);
  const T after = std::fma(-alpha, T(wd), T(1));  // 1 - lr * weight_decay
  const bool decay = T(wd) > 0;
  const int nt = at::get_num_threads();
  const int64_t grain = std::max<int64_t>(65536, (n + nt - 1) / nt);
  if (nt <= 1 || n <= grain) return lion_chunk(p, g, m, n, b1, b2, omb1, omb2, alpha, after, decay);
  at::parallel_for(0, n, grain, [&](int64_t lo, int64_t hi) {
    lion_chunk(p + lo, g + lo, m + lo, hi - lo, b1, b2, omb1, omb2, alpha, after, decay);
  });
}

}  // namespace

void cpu_lion_step(float* p, const float* g, float* m, int64_t n, double lr, double beta1,
                   double beta2, double wd) {
  lion<float>(p, g, m, n, lr, beta1, beta2, wd);
}
void cpu_lion_step(double* p, const double* g, double* m, int64_t n, double lr, double beta1,
                   double beta2, double wd) {
  lion<double>(p, g, m, n, lr, beta1, beta2, wd);
}

void cpu_adagrad_step(float* p, const float* g, float* v, int64_t n, double lr, double eps,
                      double wd) {
  adagrad<float>(p, g, v, n, lr, eps, wd);
}
void cpu_adagrad_step(double* p, const double* g, double* v, int64_t n, double lr, double eps,
                      double wd) {
  adagrad<double>(p, g, v, n, lr, eps, wd);
}

}  // namespace detail
}  // namespace dtrain::zero
