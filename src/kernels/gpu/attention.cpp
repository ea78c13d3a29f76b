// Causal attention on the GPU: with 16-bit operands and the head sizes flash_attention.cu is built
// for, its tensor-core kernels; otherwise fp32 GEMMs over many heads of a sequence at once (strided
// batches), with the softmax and its gradient in kernels (ops.cu). With one query head per
// key/value head, one batch spans every head; with grouped-query heads, a batch spans one key/value
// head's group (the key and value operands repeat with stride 0). The scores of a batch live in
// scratch and are recomputed in the backward pass from the saved log-sum-exp, so nothing T×T is
// kept between the passes. The GEMMs multiply in fp32 whatever the matmul operand mode:
// probabilities and score gradients are not 16-bit values.
#include <cmath>

#include "device/device.h"
#include "kernels/attention.h"
#include "kernels/gpu/internal.h"

namespace anvil::gpu {
namespace {

// One batch's scores, their gradient, and one sequence's row sums D.
GpuScratch scores, dscores, delta;
float* floats(GpuScratch& s, size_t n) { return static_cast<float*>(s.get(n * sizeof(float))); }

// How the query heads are batched (see the file comment), and where batch c's operands start
// within a sequence's qkv rows (row-major, as in attention.h; the GEMMs below are column-major,
// hence the transposes).
struct Batches {
  explicit Batches(const AttentionHeads& a)
      : heads(a),
        size(a.group() == 1 ? a.n_heads : a.group()),
        count(a.n_heads / size),
        kv_stride(a.group() == 1 ? a.head_size : 0) {}
  AttentionHeads heads;
  int size, count;
  long long kv_stride;
  int first_head(int c) const { return c * size; }
  long q(int c) const { return static_cast<long>(first_head(c)) * heads.head_size; }
  long k(int c) const { return heads.q_channels() + static_cast<long>(first_head(c) / heads.group()) * heads.head_size; }
  long v(int c) const { return k(c) + heads.kv_channels(); }
};

// S (T_q, T_k) = Q Kᵀ for batch c's heads  <=>  Sᵀ = K · Qᵀ
void scores_forward(float* S, const float* x, const Batches& t, int c, int T) {
  const int ld = t.heads.qkv_channels();
  gemm_fp32_batched(true, false, T, T, t.heads.head_size, 1.0f, {x + t.k(c), ld, t.kv_stride},
                    {x + t.q(c), ld, t.heads.head_size}, 0.0f, S, T, static_cast<long long>(T) * T, t.size);
}

}  // namespace

// Every query row is computed, whatever heads.first_query asks (its contract allows it).
void attention_forward(float* out, float* lse, const float* qkv, const int32_t* positions, int B, int T,
                       AttentionHeads heads) {
  if (flash_attention_supported(heads)) return flash_attention_forward(out, lse, qkv, positions, B, T, heads);
  const int HS = heads.head_size, NH = heads.n_heads, C = heads.q_channels(), ld = heads.qkv_channels();
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const long long TT = static_cast<long long>(T) * T;
  const Batches batches(heads);
  float* S = floats(scores, static_cast<size_t>(batches.size) * TT);
  for (int b = 0; b < B; b++) {
    const float* x = qkv + static_cast<size_t>(b) * T * ld;
    for (int c = 0; c < batches.count; c++) {
      const int h0 = batches.first_head(c);
      scores_forward(S, x, batches, c, T);
      attention_softmax(S, lse + (static_cast<size_t>(b) * NH + h0) * T, positions ? positions + b * T : nullptr, T,
                        batches.size, scale, heads, h0, b);
      // out (T_q, HS) = P V  <=>  outᵀ = Vᵀ · Pᵀ
      gemm_fp32_batched(false, false, HS, T, T, 1.0f, {x + batches.v(c), ld, batches.kv_stride}, {S, T, TT}, 0.0f,
                        out + static_cast<size_t>(b) * T * C + h0 * HS, C, HS, batches.size);
    }
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                        const int32_t* positions, int B, int T, AttentionHeads heads) {
  if (flash_attention_supported(heads))
    return flash_attention_backward(dqkv, dout, qkv, out, lse, positions, B, T, heads);
  const int HS = heads.head_size, NH = heads.n_heads, C = heads.q_channels(), ld = heads.qkv_channels();
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const long long TT = static_cast<long long>(T) * T;
  const Batches batches(heads);
  float* S = floats(scores, static_cast<size_t>(batches.size) * TT);
  float* dP = floats(dscores, static_cast<size_t>(batches.size) * TT);
  float* D = floats(delta, static_cast<size_t>(NH) * T);
  // A key/value head's gradient sums its query heads' terms, one product each, in head order;
  // without groups, one product covers the batch.
  const int terms = heads.group() == 1 ? 1 : heads.group(), term_batch = heads.group() == 1 ? batches.size : 1;
  for (int b = 0; b < B; b++) {
    const size_t row3 = static_cast<size_t>(b) * T * ld, row = static_cast<size_t>(b) * T * C;
    const float* x = qkv + row3;
    float* dx = dqkv + row3;
    attention_delta(D, dout + row, out + row, T, C, NH);
    for (int c = 0; c < batches.count; c++) {
      const int h0 = batches.first_head(c);
      const float* dO = dout + row + h0 * HS;
      scores_forward(S, x, batches, c, T);
      // dP (T_q, T_k) = dO Vᵀ  <=>  dPᵀ = V · dOᵀ
      gemm_fp32_batched(true, false, T, T, HS, 1.0f, {x + batches.v(c), ld, batches.kv_stride}, {dO, C, HS}, 0.0f, dP,
                        T, TT, batches.size);
      // S = P (times the dropout mask), dP = scale·dS
      attention_dsoftmax(S, dP, lse + (static_cast<size_t>(b) * NH + h0) * T, D + static_cast<size_t>(h0) * T,
                         positions ? positions + b * T : nullptr, T, batches.size, scale, heads, h0, b);
      // dQ = dS K  <=>  dQᵀ = Kᵀ · dSᵀ
      gemm_fp32_batched(false, false, HS, T, T, 1.0f, {x + batches.k(c), ld, batches.kv_stride}, {dP, T, TT}, 0.0f,
                        dx + batches.q(c), ld, HS, batches.size);
      for (int g = 0; g < terms; g++) {
        const float beta = g == 0 ? 0.0f : 1.0f;
        // dK = dSᵀ Q  <=>  dKᵀ = Qᵀ · dS
        gemm_fp32_batched(false, true, HS, T, T, 1.0f, {x + batches.q(c) + g * HS, ld, HS}, {dP + g * TT, T, TT},
                          beta, dx + batches.k(c), ld, HS, term_batch);
        // dV = Pᵀ dO  <=>  dVᵀ = dOᵀ · P
        gemm_fp32_batched(false, true, HS, T, T, 1.0f, {dO + g * HS, C, HS}, {S + g * TT, T, TT}, beta,
                          dx + batches.v(c), ld, HS, term_batch);
      }
    }
  }
}

}  // namespace anvil::gpu
