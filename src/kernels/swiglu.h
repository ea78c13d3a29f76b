// SwiGLU (Llama's MLP activation): silu(gate) · up, with gate and up side by side in one row, as
// one matrix product (the fused gate and up projections) writes them.
#pragma once
#include "core/dtype.h"
#include "kernels/op.h"

namespace anvil {

// out (N,F) = silu(gate) · up, where inp (N,2F) holds gate in columns [0,F) and up in [F,2F) of
// each row, and silu(x) = x·sigmoid(x). Rounded to d as it is written (as gelu_forward).
void swiglu_forward(KernelImpl impl, float* out, const float* inp, int N, int F, ComputeDtype d);
// dinp (N,2F) = the gradient wrt inp given dout (N,F): dgate = dout·up·silu'(gate), dup = dout·silu(gate);
// rounded to d as it is written.
void swiglu_backward(KernelImpl impl, float* dinp, const float* inp, const float* dout, int N, int F, ComputeDtype d);

ANVIL_OP_IMPLEMENTATIONS(swiglu_forward)
ANVIL_OP_IMPLEMENTATIONS(swiglu_backward)

}  // namespace anvil
