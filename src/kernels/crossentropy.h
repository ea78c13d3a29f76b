// Softmax cross-entropy over the vocabulary. Probabilities are never stored: evaluation needs
// only the losses, and training takes losses and gradient in one op that writes the gradient
// over the logits. Under amp the logits are the output of a 16-bit matrix product and their
// gradient the input of the next: both ops take that dtype and round as they read the logits and
// write the gradient, which saves two passes over the largest tensor of the step.
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "core/targets.h"  // kIgnoreIndex: a target with this value contributes no loss
#include "kernels/op.h"

namespace anvil {

// In both, x = the logits (N,V) rounded to dtype d (round_to_dtype; kFp32: as they are).
// losses (N) = lse - x[target] per row (0 where target == kIgnoreIndex); lse (N) = the
// log-sum-exp of each row of x. Targets must be in [0, V) or kIgnoreIndex.
void crossentropy_forward(KernelImpl impl, float* losses, float* lse, const float* logits, const int32_t* targets,
                          int N, int V, ComputeDtype d);
// Training: losses (N) = as crossentropy_forward, and dlogits (N,V) = dloss · (softmax(x) -
// onehot(target)) rounded to d, rows with an ignored target = 0. dloss is the weight of each
// row's loss in the objective (1 / target tokens in the global batch). dlogits may alias logits.
void crossentropy_forward_backward(KernelImpl impl, float* losses, float* dlogits, const float* logits,
                                   const int32_t* targets, float dloss, int N, int V, ComputeDtype d);

// cpu: one exp per logit in the training form.
ANVIL_OP_IMPLEMENTATIONS(crossentropy_forward)
ANVIL_OP_IMPLEMENTATIONS(crossentropy_forward_backward)
namespace ref {
// The gradient from the saved lse, separately: the specification the fused form is built from.
void crossentropy_backward(float* dlogits, const float* logits, const float* lse,
                           const int32_t* targets, float dloss, int N, int V, ComputeDtype d);
}  // namespace ref

}  // namespace anvil
