// LayerNorm over the last dimension with eps 1e-5 (GPT-2's and PyTorch's default).
#pragma once
#include "kernels/op.h"

namespace anvil {

constexpr float kLayerNormEps = 1e-5f;

// out (N,C) = (inp - mean) * rstd * weight + bias; mean (N) = and rstd (N) = are saved for backward.
// bias may be null (MPT's no_bias: none added), and then so is dbias.
void layernorm_forward(KernelImpl impl, float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C);
// dinp (N,C) +=, dweight (C) +=, dbias (C) +=, given dout (N,C) and the forward's inputs and saves.
void layernorm_backward(KernelImpl impl, float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C);

// layernorm_backward of B sequences of T rows, each forming its own parameter gradients (a
// microbatch-invariant model's): sequence b's at dweight + b·grads_stride and dbias +
// b·grads_stride, each the bits layernorm_backward of its rows alone gives. On the GPU one pass
// over every row; elsewhere a sequence at a time.
void layernorm_backward_sequences(KernelImpl impl, float* dinp, float* dweight, float* dbias, size_t grads_stride,
                                  const float* dout, const float* inp, const float* weight, const float* mean,
                                  const float* rstd, int B, int T, int C);

ANVIL_OP_IMPLEMENTATIONS(layernorm_forward)
ANVIL_OP_IMPLEMENTATIONS(layernorm_backward)
namespace gpu {
::anvil::detail::WithoutImpl<decltype(::anvil::layernorm_backward_sequences)>::type layernorm_backward_sequences;
}

}  // namespace anvil
