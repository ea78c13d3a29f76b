// GELU in its two forms: the tanh approximation (GPT-2's, PyTorch's approximate='tanh')
// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), and the exact 0.5·x·(1 + erf(x/√2)) (PyTorch's
// default, and so LLM Foundry's MPT ffn_act_fn).
#pragma once
#include "core/dtype.h"
#include "kernels/op.h"

namespace anvil {

enum class GeluForm { kTanh, kErf };

// out (N) = gelu(inp (N)), rounded to d as it is written (amp's rounding of a matrix product's
// input, docs/precision.md, without a pass of its own; kFp32: as computed). out may alias inp.
void gelu_forward(KernelImpl impl, float* out, const float* inp, long N, GeluForm form, ComputeDtype d);
// dinp (N) = gelu'(inp) · dout, rounded to d as it is written. dinp may alias dout.
void gelu_backward(KernelImpl impl, float* dinp, const float* inp, const float* dout, long N, GeluForm form,
                   ComputeDtype d);

ANVIL_OP_IMPLEMENTATIONS(gelu_forward)
ANVIL_OP_IMPLEMENTATIONS(gelu_backward)

}  // namespace anvil
