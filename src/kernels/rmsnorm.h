// RMSNorm over the last dimension (Llama's): no mean subtracted, no bias, eps from the config.
#pragma once
#include "kernels/op.h"

namespace anvil {

// out (N,C) = inp · rstd · weight, rstd (N) = 1/√(mean(inp²) + eps), saved for backward. In fp32
// throughout, as Hugging Face's LlamaRMSNorm computes it.
void rmsnorm_forward(KernelImpl impl, float* out, float* rstd, const float* inp, const float* weight, float eps, int N,
                     int C);
// dinp (N,C) +=, dweight (C) +=, given dout (N,C), the forward's input and its rstd.
void rmsnorm_backward(KernelImpl impl, float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C);

ANVIL_OP_IMPLEMENTATIONS(rmsnorm_forward)
ANVIL_OP_IMPLEMENTATIONS(rmsnorm_backward)

}  // namespace anvil
