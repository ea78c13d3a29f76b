// Softmax cross-entropy over the vocabulary. Probabilities are never stored: evaluation needs
// only the losses, and training takes losses and gradient in one op that writes the gradient
// over the logits.
#pragma once
#include <cstdint>

#include "core/targets.h"  // kIgnoreIndex: a target with this value contributes no loss

namespace anvil {

// losses (N) = lse - logits[target] per row (0 where target == kIgnoreIndex); lse (N) = the
// log-sum-exp of each row of logits (N,V). Targets must be in [0, V) or kIgnoreIndex.
void crossentropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets,
                          int N, int V);
// Training: losses (N) = as crossentropy_forward, and dlogits (N,V) = dloss · (softmax(logits) -
// onehot(target)), rows with an ignored target = 0. dloss is the weight of each row's loss in the
// objective (1 / target tokens in the global batch). dlogits may alias logits.
void crossentropy_forward_backward(float* losses, float* dlogits, const float* logits,
                                   const int32_t* targets, float dloss, int N, int V);

namespace ref {
void crossentropy_forward(float*, float*, const float*, const int32_t*, int, int);
// The gradient from the saved lse, separately: the specification the fused form is built from.
void crossentropy_backward(float* dlogits, const float* logits, const float* lse,
                           const int32_t* targets, float dloss, int N, int V);
void crossentropy_forward_backward(float*, float*, const float*, const int32_t*, float, int, int);
}  // namespace ref
namespace cpu {  // one exp per logit in the training form
void crossentropy_forward(float*, float*, const float*, const int32_t*, int, int);
void crossentropy_forward_backward(float*, float*, const float*, const int32_t*, float, int, int);
}  // namespace cpu
namespace gpu {  // device pointers; kernels/gpu/, one source for CUDA and HIP
void crossentropy_forward(float*, float*, const float*, const int32_t*, int, int);
void crossentropy_forward_backward(float*, float*, const float*, const int32_t*, float, int, int);
}  // namespace gpu

}  // namespace anvil
