// The element-wise work of the optimizer step: the AdamW update, the gradient's sum of squares
// (for clipping by global norm) and the loss scale's removal. Arrays are op memory (kernels/buffer.h).
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/op.h"

namespace anvil {

// One AdamW step, as PyTorch computes it, on the clipped gradient g = grad_scale · g_in:
// p *= keep (decoupled weight decay); m = β1·m + (1-β1)·g; v = β2·v + (1-β2)·g²;
// p -= step_size · m / (√v / bc2_sqrt + eps).
struct AdamWStep {
  float beta1, beta2, eps;
  float step_size;   // lr / (1 - β1^t)
  float bc2_sqrt;    // √(1 - β2^t)
  float grad_scale;  // the clipping coefficient (1: none), applied as the gradient is read
};
// One tensor of the step: elements [offset, offset + count) of the arrays, its keep (1 - decay
// rate, or 1 for a tensor that does not decay) and, for a fixed-point gradient, its exponent.
struct AdamWTensor {
  uint64_t offset, count;
  float keep;
  int32_t exponent;
};
// p (n) =, m (n) =, v (n) = updated in place from g (n), which is left as it was, every tensor of
// tensors (n_tensors, op memory: in order of offset, disjoint, within [0, n)) at once: one launch
// on the GPU, however many tensors. Elements outside every tensor are left alone.
void adamw_update(KernelImpl impl, float* p, const float* g, float* m, float* v, size_t n, const AdamWTensor* tensors,
                  int n_tensors, const AdamWStep& s);
// The same, with g_in read from a fixed-point gradient (kernels/fixed_point.h), tensor by tensor
// at its exponent e: g_in[i] = (float)((double)acc[i] · 2^-e), the float that the accumulator
// stands for. So the deterministic mode needs no fp32 copy of the gradient.
void adamw_update_fixed(KernelImpl impl, float* p, const int64_t* acc, float* m, float* v, size_t n,
                        const AdamWTensor* tensors, int n_tensors, const AdamWStep& s);

// Σ x² over x (n), in double: fixed 64K-element chunks, each summed in double, added in chunk
// order, so the value does not depend on the thread count.
double sum_of_squares(KernelImpl impl, const float* x, size_t n);
// x (n) *= coef; returns whether every result is finite.
bool scale_values_check_finite(KernelImpl impl, float* x, size_t n, float coef);

ANVIL_OP_IMPLEMENTATIONS(adamw_update)
ANVIL_OP_IMPLEMENTATIONS(adamw_update_fixed)
ANVIL_OP_IMPLEMENTATIONS(sum_of_squares)
ANVIL_OP_IMPLEMENTATIONS(scale_values_check_finite)

}  // namespace anvil
