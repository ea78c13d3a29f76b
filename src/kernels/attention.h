// Causal self-attention on a fused qkv tensor, with grouped-query heads, ALiBi and a sliding window
// as options: position i attends to positions j <= i of its own example (j >= i - p(b,i),
// kernels/positions.h: every j <= i when examples are not packed) and, with a window of W keys, to
// none before i - W + 1; scores scaled by 1/√head_size.
#pragma once
#include <cmath>

#include "core/dtype.h"
#include "kernels/dropout.h"
#include "kernels/op.h"
#include "kernels/positions.h"

namespace anvil {

// The heads of one attention layer. n_heads query heads of head_size channels share n_kv_heads
// key/value heads (n_kv_heads divides n_heads; each key/value head serves n_heads/n_kv_heads
// consecutive query heads: grouped-query attention, multi-query when 1, multi-head when equal).
// With alibi, the score of query i and key j gets slope_h·(j - i) added after scaling (ALiBi, as
// MPT does it; alibi_slope below).
// With dropout active, each probability P_ij of head h in sequence b is kept (and scaled by
// 1/(1-p)) or dropped after the softmax, as dropout_keep decides for element
// attention_dropout_index(h, i, j, T) of sequence dropout.first_sample + b; lse stays the
// undropped softmax's, and the backward pass regenerates the mask.
// operands: the least precise dtype the products inside attention may take their operands in.
// Under amp_bf16/amp_fp16 (docs/precision.md) q, k, v and dout are 16-bit values already, and an
// implementation may also round the probabilities and score gradients it multiplies to that dtype,
// as FlashAttention on tensor cores does (the GPU's flash kernels); scores, softmax statistics,
// lse and every sum stay fp32. It permits rounding, never requires it: ref and cpu compute in fp32.
struct AttentionHeads {
  int n_heads, n_kv_heads, head_size;
  bool alibi = false;
  float alibi_bias_max = 8.0f;
  // Mistral's sliding window: query i sees keys i - window + 1 .. i (as transformers masks it,
  // kv > q - window); 0: the whole causal context.
  int window = 0;
  DropoutSite dropout{};
  ComputeDtype operands = ComputeDtype::kFp32;
  // The forward pass's first query row: the rows of out and lse before it may be left unwritten
  // (the keys and values of every row are read). An evaluation that kept a prefix's keys and
  // values (Model::keep_prefix) asks only for the rows after it. A row that is computed has the
  // bits it has with first_query 0. The backward pass takes 0 only.
  int first_query = 0;
  // Under tensor parallelism these heads are one rank's share of the layer's all_heads (0: the
  // whole layer's), from its head first_head on: the layer's head index keys the ALiBi slopes and
  // the dropout masks, so each head gets the values it gets in the whole layer.
  int first_head = 0, all_heads = 0;

  ANVIL_HOST_DEVICE int layer_head(int h) const { return first_head + h; }
  ANVIL_HOST_DEVICE int layer_heads() const { return all_heads ? all_heads : n_heads; }
  ANVIL_HOST_DEVICE int group() const { return n_heads / n_kv_heads; }
  ANVIL_HOST_DEVICE int q_channels() const { return n_heads * head_size; }
  ANVIL_HOST_DEVICE int kv_channels() const { return n_kv_heads * head_size; }
  // A fused qkv row: the queries of every head, then the keys, then the values.
  ANVIL_HOST_DEVICE int qkv_channels() const { return q_channels() + 2 * kv_channels(); }
};

// ALiBi's slope for head h of n_heads, as LLM Foundry and Hugging Face's MPT form them: with n the
// power of two at or above n_heads, slope_k = 1/2^(k·bias_max/n) for k = 1..n, in fp32; when n >
// n_heads, heads take the even k first and then the odd ones. Host and device alike.
ANVIL_HOST_DEVICE inline float alibi_slope(int h, int n_heads, float bias_max) {
  int n = 1;
  while (n < n_heads) n *= 2;
  const int k = n == n_heads ? h + 1 : h < n / 2 ? 2 * h + 2 : 2 * (h - n / 2) + 1;
  return 1.0f / exp2f(static_cast<float>(k) * (bias_max / static_cast<float>(n)));
}

// The first key query i of sequence b sees: the start of its example, or the window's start.
ANVIL_HOST_DEVICE inline int attention_first_key(const int32_t* positions, int b, int T, int i, int window) {
  const int first = i - position_of(positions, b, T, i);
  return window > 0 && i - window + 1 > first ? i - window + 1 : first;
}

ANVIL_HOST_DEVICE inline uint64_t attention_dropout_index(int h, int i, int j, int T) {
  return (static_cast<uint64_t>(h) * static_cast<uint64_t>(T) + static_cast<uint64_t>(i)) * static_cast<uint64_t>(T) +
         static_cast<uint64_t>(j);
}

// out (B,T,q_channels) = softmax(q kᵀ/√HS [+ ALiBi] + causal mask) v per query head, from qkv
// (B,T,qkv_channels). lse (B,n_heads,T) = the log-sum-exp of each score row, saved so the backward
// pass can rebuild probabilities without storing T×T.
void attention_forward(KernelImpl impl, float* out, float* lse, const float* qkv, const int32_t* positions, int B,
                       int T, AttentionHeads heads);
// dqkv (B,T,qkv_channels) = the gradient wrt qkv, given dout (B,T,q_channels), the forward's qkv,
// out and lse. A key/value head's gradient sums its query heads' contributions in head order.
void attention_backward(KernelImpl impl, float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, const int32_t* positions, int B, int T, AttentionHeads heads);

// ref: forms the full T×T score matrix per head; cpu: query blocks of sgemms; never forms T×T.
ANVIL_OP_IMPLEMENTATIONS(attention_forward)
ANVIL_OP_IMPLEMENTATIONS(attention_backward)

}  // namespace anvil
