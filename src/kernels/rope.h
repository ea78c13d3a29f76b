// Rotary position embedding (RoPE, Llama's), in Hugging Face's rotate-half convention: a head's
// channel i and channel i + HS/2 form a pair, rotated by the angle t·inv_freq[i] at position t.
// Weights exported to or imported from Hugging Face therefore need no permutation of q and k.
#pragma once
#include "core/rope.h"
#include "kernels/op.h"
#include "kernels/positions.h"

namespace anvil {

// inv_freq[i] is rope_inv_freq(freqs, i, HS) (core/rope.h: theta^(-2i/HS) and transformers'
// rope_scaling); the angle t·inv_freq[i] is the fp32 product, as in transformers.

// x holds B·T rows, row_stride floats apart (row b·T + t at position p(b,t), kernels/positions.h);
// the first n_heads heads of HS channels in each (the query heads and then the key heads of a
// fused qkv row) are rotated in place: x[i] = x[i]·cos - x[i + HS/2]·sin and x[i + HS/2] =
// x[i + HS/2]·cos + x[i]·sin, for i < HS/2 (HS even). The rest of each row is left as it is.
void rope_forward(KernelImpl impl, float* x, const int32_t* positions, int B, int T, int row_stride, int n_heads,
                  int HS, const RopeFrequencies& freqs);
// The gradient through it, in place on dx laid out as x: the rotation by the opposite angle.
void rope_backward(KernelImpl impl, float* dx, const int32_t* positions, int B, int T, int row_stride, int n_heads,
                   int HS, const RopeFrequencies& freqs);

ANVIL_OP_IMPLEMENTATIONS(rope_forward)
ANVIL_OP_IMPLEMENTATIONS(rope_backward)

}  // namespace anvil
