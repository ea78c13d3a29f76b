// LayerNorm over the last dimension with eps 1e-5 (GPT-2's and PyTorch's default).
#pragma once

namespace anvil {

constexpr float kLayerNormEps = 1e-5f;

// out (N,C) = (inp - mean) * rstd * weight + bias; mean (N) = and rstd (N) = are saved for backward.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C);
// dinp (N,C) +=, dweight (C) +=, dbias (C) +=, given dout (N,C) and the forward's inputs and saves.
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C);

namespace ref {
void layernorm_forward(float*, float*, float*, const float*, const float*, const float*, int, int);
void layernorm_backward(float*, float*, float*, const float*, const float*, const float*,
                        const float*, const float*, int, int);
}  // namespace ref
namespace cpu {
void layernorm_forward(float*, float*, float*, const float*, const float*, const float*, int, int);
void layernorm_backward(float*, float*, float*, const float*, const float*, const float*,
                        const float*, const float*, int, int);
}  // namespace cpu
namespace gpu {  // device pointers; kernels/gpu/, one source for CUDA and HIP
void layernorm_forward(float*, float*, float*, const float*, const float*, const float*, int, int);
void layernorm_backward(float*, float*, float*, const float*, const float*, const float*,
                        const float*, const float*, int, int);
}  // namespace gpu

}  // namespace anvil
