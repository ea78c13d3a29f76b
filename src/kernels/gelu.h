// GELU, tanh approximation (GPT-2's): 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
#pragma once
#include "kernels/op.h"

namespace anvil {

// out (N) = gelu(inp (N)). out may alias inp.
void gelu_forward(float* out, const float* inp, long N);
// dinp (N) = gelu'(inp) · dout. dinp may alias dout.
void gelu_backward(float* dinp, const float* inp, const float* dout, long N);

ANVIL_OP_IMPLEMENTATIONS(gelu_forward)
ANVIL_OP_IMPLEMENTATIONS(gelu_backward)

}  // namespace anvil
