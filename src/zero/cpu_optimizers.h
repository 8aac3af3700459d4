// DeepSpeed's CPU optimizers beside its CPU Adam (optimizer.cpp's cpu_adam_step): the ones
// DeepSpeed 0.19.8 builds with offload_optimizer for "Adagrad" (DeepSpeedCPUAdagrad) and "Lion"
// (DeepSpeedCPULion). Each is one pass over flat arrays, operation by operation as its
// csrc kernel, in the element type (DeepSpeed's take lr, betas, eps and weight decay as float).
// Thread-safe for disjoint arrays; split over libtorch's intra-op threads.
//
// cpu_adagrad_step:
//   g = fma(p, weight_decay, g)          only when weight_decay > 0 (L2 decay)
//   v = fma(g, g, v)                     the running sum of squares ("exp_avg_sq")
//   p = fma(g / (sqrt(v) + eps), -lr, p)
// except over the last n mod W elements (W: the SIMD width DeepSpeed builds its op with on this
// CPU, 16 with AVX-512, 8 with AVX2; all of them where it builds it scalar), where its scalar
// loop rounds the last product before the add: p = (g / (sqrt(v) + eps)) * -lr + p. So an array
// DeepSpeed steps as one tensor (a stage 1-2 partition) comes out bit for bit as DeepSpeed's.
// No lr_decay and no initial accumulator (its constructor has neither); the step count does not
// enter the update.
//
// cpu_lion_step (its SIMD and scalar loops round alike):
//   c = fma(g, 1 - beta1, m * beta1)
//   p = fma(p, 1 - lr * weight_decay, -copysign(lr, c))   (p - copysign(lr, c) without decay)
//   m = fma(g, 1 - beta2, m * beta2)     the momentum ("exp_avg")
#pragma once

#include <cstdint>

namespace dtrain::zero::detail {

void cpu_adagrad_step(float* param, const float* grad, float* exp_avg_sq, int64_t n, double lr,
                      double eps, double weight_decay);
void cpu_adagrad_step(double* param, const double* grad, double* exp_avg_sq, int64_t n, double lr,
                      double eps, double weight_decay);

void cpu_lion_step(float* param, const float* grad, float* exp_avg, int64_t n, double lr,
                   double beta1, double beta2, double weight_decay);
void cpu_lion_step(double* param, const double* grad, double* exp_avg, int64_t n, double lr,
                   double beta1, double beta2, double weight_decay);

}  // namespace dtrain::zero::detail
