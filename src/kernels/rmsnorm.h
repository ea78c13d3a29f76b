// RMSNorm over the last dimension (Llama's): no mean subtracted, no bias, eps from the config.
#pragma once
#include "kernels/op.h"

namespace anvil {

// out (N,C) = inp · rstd · weight, rstd (N) = 1/√(mean(inp²) + eps), saved for backward. In fp32
// throughout, as Hugging Face's LlamaRMSNorm computes it.
void rmsnorm_forward(KernelImpl impl, float* out, float* rstd, const float* inp, const float* weight, float eps, int N,
                     int C);
// dinp (N,C) +=, dweight (C) += (null: not formed), given dout (N,C), the forward's input and its
// rstd. The weight's gradient is each column's terms dout·inp·rstd summed over the rows in double,
// then added to dweight once.
void rmsnorm_backward(KernelImpl impl, float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C);
// Those sums alone: sums (C) += each column's terms over the N rows, in row order. Rows split
// among ranks (sequence parallelism) add up, one rank's after another's, to the sums of all the
// rows at once; on the CPU, whose rmsnorm_backward sums the rows in that order too (fp32 terms),
// float(dweight + sums) is then its weight gradient to the bit.
void rmsnorm_weight_sums(KernelImpl impl, double* sums, const float* dout, const float* inp, const float* rstd, int N,
                         int C);

// rmsnorm_backward of B sequences of T rows, each forming its own weight gradient at dweight +
// b·grads_stride, the bits rmsnorm_backward of its rows alone gives (as
// layernorm_backward_sequences).
void rmsnorm_backward_sequences(KernelImpl impl, float* dinp, float* dweight, size_t grads_stride, const float* dout,
                                const float* inp, const float* weight, const float* rstd, int B, int T, int C);

ANVIL_OP_IMPLEMENTATIONS(rmsnorm_forward)
ANVIL_OP_IMPLEMENTATIONS(rmsnorm_backward)
ANVIL_OP_IMPLEMENTATIONS(rmsnorm_weight_sums)
namespace gpu {
::anvil::detail::WithoutImpl<decltype(::anvil::rmsnorm_backward_sequences)>::type rmsnorm_backward_sequences;
}

}  // namespace anvil
