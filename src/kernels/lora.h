// LoRA's branch joining a product's output: the branch's (N, cols) result, scaled, added into a
// block of columns of the product's (N, ld) output (Llama's q_proj adapts the first columns of
// the fused qkv product), and the scaled gradient read back out of that block.
#pragma once
#include "kernels/op.h"

namespace anvil {

// out[n·ld + c] += scale · delta[n·cols + c], for n < N, c < cols (cols <= ld).
void lora_delta_forward(KernelImpl impl, float* out, long ld, const float* delta, int N, int cols, float scale);
// ddelta[n·cols + c] = scale · dout[n·ld + c].
void lora_delta_backward(KernelImpl impl, float* ddelta, const float* dout, long ld, int N, int cols, float scale);

ANVIL_OP_IMPLEMENTATIONS(lora_delta_forward)
ANVIL_OP_IMPLEMENTATIONS(lora_delta_backward)

}  // namespace anvil
