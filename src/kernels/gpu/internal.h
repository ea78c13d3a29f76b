// What the GPU op sources share (device code and GPU host code only).
#pragma once
#include <cstdint>

#include "kernels/attention.h"

namespace anvil::gpu {

// out + b·stride (C) = (+= with accumulate) the column sums of x's rows [b·T, (b + 1)·T) (rows
// ld >= C apart), in a fixed order, for b < B: each group's sums those of a call on its rows alone.
void column_sums(float* out, const float* x, long ld, int B, int T, int C, size_t stride, bool accumulate);

// `vectors` runs of len floats, ld >= len apart, as 16-bit values of dtype d (bf16 or fp16;
// rounded to nearest even as round_to_dtype rounds, so exact for values of d) into vectors_out >=
// vectors runs ld_out >= len apart (a multiple of 4; out 8-byte aligned), the values past each
// run's len and the runs past `vectors` zero: the matrix products' operands, padded for the
// library's aligned kernels (matmul.cpp).
void narrow_to_16(uint16_t* out, long ld_out, const float* x, long ld, long vectors, int len, long vectors_out,
                  ComputeDtype d);

// Column-major GEMMs, fp32 in, out and compute (no tensor-core mode): count
// products D_i = alpha·op(A_i)·op(B_i) + beta·D_i, the i-th operands stride_* floats apart.
struct Strided {
  const float* p;
  int ld;
  long long stride;
};
void gemm_fp32_batched(bool trans_a, bool trans_b, int m, int n, int k, float alpha, Strided A, Strided B, float beta,
                       float* D, int ldd, long long stride_d, int count);

// Tests: the *_sequences products one sequence at a time, as where the library cannot run one
// sequence's algorithm batched, or gives the batch other bits.
void matmul_split_batches(bool split);
// Tests: each shape's first batch found to have other bits than the products one at a time (the
// warning, the outputs of the products one at a time, and that shape one at a time from then on).
void matmul_batches_differ(bool differ);

// Attention's element-wise steps over the scores (count, T, T) of `count` query heads of sequence
// b from head h0 on, row-major per head (ops.cu): the causal softmax of scale·S (+ ALiBi) in place
// with each row's log-sum-exp into lse (count·T), times the attention-dropout factor m (1 without
// dropout, else 0 or 1/(1-p)); and, from the recomputed scores S and dP = dout·Vᵀ, S = P∘m and
// dP = scale · P ∘ (m∘dP - D). D (NH·T) = row sums of dout ∘ out over all NH heads of C channels.
// positions: the sequence's T positions (kernels/positions.h), or null; keys before a query's
// example are masked like those after it.
void attention_softmax(float* S, float* lse, const int32_t* positions, int T, int count, float scale,
                       const AttentionHeads& heads, int h0, int b);
// Attention on tensor cores (flash_attention.cu): what attention_forward/backward run when the
// heads allow 16-bit operands and have a head size the kernels are built for (16, 32, 64, 128).
bool flash_attention_supported(const AttentionHeads& heads);
void flash_attention_forward(float* out, float* lse, const float* qkv, const int32_t* positions, int B, int T,
                             const AttentionHeads& heads);
void flash_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                              const int32_t* positions, int B, int T, const AttentionHeads& heads);
void attention_delta(float* D, const float* dout, const float* out, int T, int C, int NH);
void attention_dsoftmax(float* S, float* dP, const float* lse, const float* D, const int32_t* positions, int T,
                        int count, float scale, const AttentionHeads& heads, int h0, int b);

}  // namespace anvil::gpu
