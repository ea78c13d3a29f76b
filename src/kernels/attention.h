// Causal multi-head self-attention on a fused qkv tensor. NH heads of HS = C/NH channels; the
// scores are scaled by 1/√HS and position i attends to positions j <= i.
#pragma once

namespace anvil {

// out (B,T,C) = softmax(q kᵀ/√HS + causal mask) v per head, with qkv (B,T,3C) holding q, k, v
// side by side (head h at channels h·HS .. h·HS+HS-1 of each). lse (B,NH,T) = the log-sum-exp of
// each score row, saved so the backward pass can rebuild probabilities without storing T×T.
void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH);
// dqkv (B,T,3C) = the gradient wrt qkv, given dout (B,T,C), the forward's qkv, out and lse.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int T, int C, int NH);

namespace ref {  // forms the full T×T score matrix per head
void attention_forward(float*, float*, const float*, int, int, int, int);
void attention_backward(float*, const float*, const float*, const float*, const float*, int, int,
                        int, int);
}  // namespace ref
namespace cpu {  // query blocks of sgemms; never forms T×T
void attention_forward(float*, float*, const float*, int, int, int, int);
void attention_backward(float*, const float*, const float*, const float*, const float*, int, int,
                        int, int);
}  // namespace cpu
namespace gpu {  // device pointers; kernels/gpu/, one source for CUDA and HIP
void attention_forward(float*, float*, const float*, int, int, int, int);
void attention_backward(float*, const float*, const float*, const float*, const float*, int, int,
                        int, int);
}  // namespace gpu

}  // namespace anvil
