// Residual connection: an element-wise sum whose backward passes the gradient to both inputs.
#pragma once

namespace anvil {

// out (N) = a (N) + b (N). out may alias a or b.
void residual_forward(float* out, const float* a, const float* b, long N);
// da (N) += dout; db (N) += dout.
void residual_backward(float* da, float* db, const float* dout, long N);

namespace ref {
void residual_forward(float*, const float*, const float*, long);
void residual_backward(float*, float*, const float*, long);
}  // namespace ref
namespace cpu {
void residual_forward(float*, const float*, const float*, long);
void residual_backward(float*, float*, const float*, long);
}  // namespace cpu
namespace gpu {  // device pointers; kernels/gpu/, one source for CUDA and HIP
void residual_forward(float*, const float*, const float*, long);
void residual_backward(float*, float*, const float*, long);
}  // namespace gpu

}  // namespace anvil
