// Where DeepSpeed 0.19.8 skips an optimizer step whose gradients hold inf or NaN, shared by the
// config parser (dtrain::core) and the engine.
#pragma once

#include "dtrain/zero_config.h"

namespace dtrain::zero {

// Whether a step whose gradients hold inf or NaN is skipped (parameters, optimizer state and
// scheduler unchanged, counted in skipped_steps) rather than applied, as DeepSpeed's optimizer
// for this config does: fp16 at every stage (its loss scaler's overflow); bf16 at stage 0
// (FP16_Optimizer over bf16) and with BF16_Optimizer (stage 1, fp32 accumulation, no offload);
// every dtype at stage 3 (an invalid gradient norm); at stages 1-2 bf16.check_grad_overflow
// (default true) under bf16, zero_optimization.compute_grad_norm (default true) under fp32.
// Only fp32 at stage 0 (the plain torch optimizer) applies such a step. Read from Config::raw
// as the parser read it (parse_config validated the values).
bool skips_nonfinite_steps(const Config& c);

// What DeepSpeed 0.19.8's engine.get_global_grad_norm() returns after a step for this config:
// its optimizer's _global_grad_norm (inf after an overflow), or None where that optimizer has
// none. The norm is the global 2-norm of the averaged gradients before clipping.
enum class GradNormReport {
  kNone,         // None: the plain torch optimizer (fp32 at stage 0), or compute_grad_norm false
                 // at stages 1-2
  kUnscaled,     // the norm: the ZeRO optimizer at stages 1-2 (divided by the loss scale before
                 // its update), BF16_Optimizer
  kScaled,       // times the loss scale before its update: FP16_UnfusedOptimizer (stage 0, an
                 // optimizer other than FusedAdam)
  kAfterUpdate,  // divided by the loss scale after its update (so halved at a step where the
                 // scale doubles): FP16_Optimizer (stage 0, FusedAdam), stage 3
};
GradNormReport grad_norm_report(const Config& c);

}  // namespace dtrain::zero
