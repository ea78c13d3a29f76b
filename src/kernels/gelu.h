// GELU, tanh approximation (GPT-2's): 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
#pragma once

namespace anvil {

// out (N) = gelu(inp (N)). out may alias inp.
void gelu_forward(float* out, const float* inp, long N);
// dinp (N) = gelu'(inp) · dout. dinp may alias dout.
void gelu_backward(float* dinp, const float* inp, const float* dout, long N);

namespace ref {
void gelu_forward(float*, const float*, long);
void gelu_backward(float*, const float*, const float*, long);
}  // namespace ref
namespace cpu {
void gelu_forward(float*, const float*, long);
void gelu_backward(float*, const float*, const float*, long);
}  // namespace cpu
namespace gpu {  // device pointers; kernels/gpu/, one source for CUDA and HIP
void gelu_forward(float*, const float*, long);
void gelu_backward(float*, const float*, const float*, long);
}  // namespace gpu

}  // namespace anvil
