// Causal multi-head self-attention on a fused qkv tensor. NH heads of HS = C/NH channels; the
// scores are scaled by 1/√HS and position i attends to positions j <= i.
#pragma once
#include "kernels/op.h"

namespace anvil {

// out (B,T,C) = softmax(q kᵀ/√HS + causal mask) v per head, with qkv (B,T,3C) holding q, k, v
// side by side (head h at channels h·HS .. h·HS+HS-1 of each). lse (B,NH,T) = the log-sum-exp of
// each score row, saved so the backward pass can rebuild probabilities without storing T×T.
void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH);
// dqkv (B,T,3C) = the gradient wrt qkv, given dout (B,T,C), the forward's qkv, out and lse.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int T, int C, int NH);

// ref: forms the full T×T score matrix per head; cpu: query blocks of sgemms; never forms T×T.
ANVIL_OP_IMPLEMENTATIONS(attention_forward)
ANVIL_OP_IMPLEMENTATIONS(attention_backward)

}  // namespace anvil
