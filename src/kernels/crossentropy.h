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

// The vocabulary cut among ranks (tensor parallelism's vocabulary-parallel LM head, where each
// rank holds some columns of the logits): the same results in three steps around two exchanges
// of a few floats per row. In each, logits (N,V) are this rank's columns of the rows, and targets
// (N) a column of them, or -1 where the row's target is another rank's, or kIgnoreIndex.
// 1. maxes (N) = each row's largest logit, rounded to d; picked (N) = the target's logit rounded
//    to d where the rank holds it, else -inf. The elementwise maximum of both over the ranks is
//    the whole row's maximum and its target's logit.
void crossentropy_slice_max(KernelImpl impl, float* maxes, float* picked, const float* logits, const int32_t* targets,
                            int N, int V, ComputeDtype d);
// 2. sums (N, ceil(V / kCrossentropySumBlock)) = the sum of e^(x - shifts[n]) over each block of
//    kCrossentropySumBlock columns; exps (N,V) = each e^(x - shifts[n]), or null (evaluation). exps
//    may alias logits.
void crossentropy_slice_sums(KernelImpl impl, float* sums, float* exps, const float* logits, const float* shifts,
                             int N, int V, ComputeDtype d);
// 3. From every rank's block sums of the rows (N, NB), in vocabulary order: losses (N) = lse -
//    picked (0 on ignored rows), lse (N) = shifts + log(the row's sum), or null; and (training,
//    else null) dlogits (N,V), holding step 2's exps, = dloss · (exps / sum - onehot(target))
//    rounded to d, 0 on ignored rows. Where every rank's columns start at a multiple of
//    kCrossentropySumBlock, the CPU's losses, lse and gradient are its crossentropy_forward(_backward)'s
//    to the bit.
void crossentropy_slice_finish(KernelImpl impl, float* losses, float* lse, float* dlogits, const float* sums, int NB,
                               const float* shifts, const float* picked, const int32_t* targets, float dloss, int N,
                               int V, ComputeDtype d);
// The columns a block sum spans: a row's sum is the sum of its blocks' in vocabulary order (on the
// CPU each block summed in float, the blocks in double).
constexpr int kCrossentropySumBlock = 2048;

// cpu: one exp per logit in the training form.
ANVIL_OP_IMPLEMENTATIONS(crossentropy_forward)
ANVIL_OP_IMPLEMENTATIONS(crossentropy_forward_backward)
ANVIL_OP_IMPLEMENTATIONS(crossentropy_slice_max)
ANVIL_OP_IMPLEMENTATIONS(crossentropy_slice_sums)
ANVIL_OP_IMPLEMENTATIONS(crossentropy_slice_finish)
namespace ref {
// The gradient from the saved lse, separately: the specification the fused form is built from.
void crossentropy_backward(float* dlogits, const float* logits, const float* lse,
                           const int32_t* targets, float dloss, int N, int V, ComputeDtype d);
}  // namespace ref

}  // namespace anvil
