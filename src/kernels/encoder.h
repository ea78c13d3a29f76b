// Token + position embedding. Dimension letters: B batch, T time, C channels, V vocabulary.
#pragma once
#include <cstdint>

namespace anvil {

// out (B,T,C) = wte[tokens[b,t]] + wpe[t]. tokens (B,T) in [0, V); wte (V,C); wpe (>=T, C).
void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                     int T, int C);
// dwte (V,C) += and dwpe (>=T, C) += the gradient of out, given dout (B,T,C).
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                      int T, int C);

namespace ref {
void encoder_forward(float*, const int32_t*, const float*, const float*, int, int, int);
void encoder_backward(float*, float*, const float*, const int32_t*, int, int, int);
}  // namespace ref
namespace cpu {
void encoder_forward(float*, const int32_t*, const float*, const float*, int, int, int);
void encoder_backward(float*, float*, const float*, const int32_t*, int, int, int);
}  // namespace cpu
namespace gpu {  // device pointers; kernels/gpu/, one source for CUDA and HIP
void encoder_forward(float*, const int32_t*, const float*, const float*, int, int, int);
void encoder_backward(float*, float*, const float*, const int32_t*, int, int, int);
}  // namespace gpu

}  // namespace anvil
