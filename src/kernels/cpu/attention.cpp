// Causal attention in query blocks, each a few single-threaded products (kernels/cpu/gemm.h):
// for 64 queries, their scores against every key up to the block's last
// position (64 × keys, in L2), the masked softmax in place, then the output as probabilities ×
// values. The T×T matrix is never formed. Backward rebuilds each block's probabilities from the
// saved log-sum-exp, and an attention-dropout mask from its key. Forward work is split by
// (sequence, query head, query block) and backward by (sequence, key/value head), which walks its
// group of query heads in order: every gradient row has one owner and every sum runs in a fixed
// order, whatever the thread count.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/attention.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/vec_math.h"

namespace anvil::cpu {
namespace {

constexpr int kQueryBlock = 64;

// Row i of a block's scores s[0..keys) (key j against query valid - 1): scaled, with ALiBi's
// slope·(j - i) added (slope 0 without), masked outside [first, valid) (first: the start of the
// query's example), turned into probabilities in place (zeros outside); returns the row's
// log-sum-exp.
ANVIL_CPU_CLONES float softmax_row(float* s, int first, int valid, int keys, float scale, float slope) {
  const int i = valid - 1;
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int j = first; j < valid; j++) {
    s[j] = s[j] * scale + slope * static_cast<float>(j - i);
    mx = std::max(mx, s[j]);
  }
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int j = first; j < valid; j++) {
    const float e = exp_approx(s[j] - mx);
    s[j] = e;
    sum += e;
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (int j = first; j < valid; j++) s[j] *= inv;
  std::fill(s, s + first, 0.0f);
  std::fill(s + valid, s + keys, 0.0f);
  return mx + std::log(sum);
}

// From row i's raw scores s and dP = dO·Vᵀ: p = e^(scale·s + slope·(j - i) - lse) in s, and the
// score gradient dS = scale · p · (dP - D) in dp; zeros past valid.
ANVIL_CPU_CLONES void softmax_backward_row(float* s, float* dp, int first, int valid, int keys, float scale,
                                           float slope, float lse, float D) {
  const int i = valid - 1;
#pragma omp simd
  for (int j = first; j < valid; j++) {
    // The bias moves into the subtrahend so that without ALiBi (slope 0) the exponent is exactly
    // scale·s - lse, formed as it always was.
    const float p = exp_approx(scale * s[j] - (lse - slope * static_cast<float>(j - i)));
    s[j] = p;
    dp[j] = scale * p * (dp[j] - D);
  }
  std::fill(s, s + first, 0.0f);
  std::fill(dp, dp + first, 0.0f);
  std::fill(s + valid, s + keys, 0.0f);
  std::fill(dp + valid, dp + keys, 0.0f);
}

// Attention dropout of row i (head h) of a block, in place on its probabilities: kept ones scaled
// by 1/(1-p), dropped ones zeroed, as dropout_keep decides for the sequence's stream.
ANVIL_CPU_CLONES void dropout_row(float* s, int first, int valid, const DropoutSite& d, uint64_t stream, int h, int i,
                                  int T) {
  const float keep_scale = d.scale();
  const uint32_t threshold = d.threshold();
  const uint64_t base = attention_dropout_index(h, i, 0, T);
#pragma omp simd
  for (int j = first; j < valid; j++)
    s[j] = dropout_keep(stream, base + static_cast<uint64_t>(j), threshold) ? s[j] * keep_scale : 0.0f;
}

// softmax_backward_row under attention dropout: with m_j the kept factor (0 or 1/(1-p)), the
// value gradient reads p·m (into s) and the scores' gradient is scale · p · (m·dP - D).
ANVIL_CPU_CLONES void softmax_backward_row_dropout(float* s, float* dp, int first, int valid, int keys, float scale,
                                                   float slope, float lse, float D, const DropoutSite& d,
                                                   uint64_t stream, int h, int T) {
  const int i = valid - 1;
  const float keep_scale = d.scale();
  const uint32_t threshold = d.threshold();
  const uint64_t base = attention_dropout_index(h, i, 0, T);
#pragma omp simd
  for (int j = first; j < valid; j++) {
    const float p = exp_approx(scale * s[j] - (lse - slope * static_cast<float>(j - i)));
    const float m = dropout_keep(stream, base + static_cast<uint64_t>(j), threshold) ? keep_scale : 0.0f;
    s[j] = p * m;
    dp[j] = scale * p * (dp[j] * m - D);
  }
  std::fill(s, s + first, 0.0f);
  std::fill(dp, dp + first, 0.0f);
  std::fill(s + valid, s + keys, 0.0f);
  std::fill(dp + valid, dp + keys, 0.0f);
}

inline float dot(const float* a, const float* b, int n) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int d = 0; d < n; d++) s += a[d] * b[d];
  return s;
}

// Per-thread block scratch, grown once and kept, so that a training step does not allocate.
float* scratch(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

// Head h's ALiBi slope, 0 without ALiBi.
float slope_of(const AttentionHeads& a, int h) {
  return a.alibi ? alibi_slope(a.layer_head(h), a.layer_heads(), a.alibi_bias_max) : 0.0f;
}

}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, const int32_t* positions, int B, int T,
                       AttentionHeads heads) {
  const int HS = heads.head_size, NH = heads.n_heads, C = heads.q_channels();
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  // The query blocks keep their places whatever first_query is (those wholly before it are
  // skipped), so that a row's products have the same shapes, and so bits, either way.
  const int first_block = heads.first_query / kQueryBlock;
  const int blocks = (T + kQueryBlock - 1) / kQueryBlock - first_block;
  const int ld = heads.qkv_channels();
#pragma omp parallel
  {
    thread_local std::vector<float> s_buf;
    float* S = scratch(s_buf, static_cast<size_t>(kQueryBlock) * T);
#pragma omp for collapse(3) schedule(dynamic)
    for (int b = 0; b < B; b++)
      for (int h = 0; h < NH; h++)
        for (int qb = 0; qb < blocks; qb++) {
          const int q0 = (first_block + qb) * kQueryBlock, rows = std::min(kQueryBlock, T - q0), keys = q0 + rows;
          const float* seq = qkv + static_cast<long>(b) * T * ld;
          const float* Q = seq + static_cast<long>(q0) * ld + h * HS;
          const float* K = seq + C + (h / heads.group()) * HS;
          const float* V = K + heads.kv_channels();
          const float slope = slope_of(heads, h);
          // S (rows × keys) = Q Kᵀ
          gemm(GemmPrecision::fp32, rows, keys, HS, {Q, ld, 1}, {K, 1, ld}, S, keys, false);
          float* lse_bh = lse + (static_cast<long>(b) * NH + h) * T;
          for (int i = 0; i < rows; i++)
            lse_bh[q0 + i] = softmax_row(S + static_cast<long>(i) * keys, attention_first_key(positions, b, T, q0 + i, heads.window),
                                         q0 + i + 1, keys, scale, slope);
          if (heads.dropout.active()) {
            const uint64_t stream = dropout_stream(heads.dropout.key, heads.dropout.first_sample + b);
            for (int i = 0; i < rows; i++)
              dropout_row(S + static_cast<long>(i) * keys, attention_first_key(positions, b, T, q0 + i, heads.window), q0 + i + 1,
                          heads.dropout, stream, heads.layer_head(h), q0 + i, T);
          }
          // out rows (rows × HS) = P V
          gemm(GemmPrecision::fp32, rows, HS, keys, {S, keys, 1}, {V, ld, 1},
               out + (static_cast<long>(b) * T + q0) * C + h * HS, C, false);
        }
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                        const int32_t* positions, int B, int T, AttentionHeads heads) {
  const int HS = heads.head_size, NH = heads.n_heads, C = heads.q_channels();
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const int ld = heads.qkv_channels();
#pragma omp parallel
  {
    thread_local std::vector<float> s_buf, dp_buf, d_buf;
    float* S = scratch(s_buf, static_cast<size_t>(kQueryBlock) * T);
    float* dP = scratch(dp_buf, static_cast<size_t>(kQueryBlock) * T);
    float* D = scratch(d_buf, static_cast<size_t>(T));
#pragma omp for collapse(2) schedule(dynamic)
    for (int b = 0; b < B; b++)
      for (int kv = 0; kv < heads.n_kv_heads; kv++) {
        const long seq = static_cast<long>(b) * T * ld;
        const float* K = qkv + seq + C + kv * HS;
        const float* V = K + heads.kv_channels();
        float* dK = dqkv + seq + C + kv * HS;
        float* dV = dK + heads.kv_channels();
        for (int t = 0; t < T; t++) {
          std::memset(dK + static_cast<long>(t) * ld, 0, sizeof(float) * HS);
          std::memset(dV + static_cast<long>(t) * ld, 0, sizeof(float) * HS);
        }
        const uint64_t stream = dropout_stream(heads.dropout.key, heads.dropout.first_sample + b);
        for (int h = kv * heads.group(); h < (kv + 1) * heads.group(); h++) {
          const float* Q = qkv + seq + h * HS;
          float* dQ = dqkv + seq + h * HS;
          const float* dO = dout + static_cast<long>(b) * T * C + h * HS;
          const float* lse_bh = lse + (static_cast<long>(b) * NH + h) * T;
          const float slope = slope_of(heads, h);
          for (int t = 0; t < T; t++) {
            const long o = static_cast<long>(t) * C;
            D[t] = dot(dO + o, out + static_cast<long>(b) * T * C + h * HS + o, HS);  // Σ_j P_ij dP_ij
          }
          for (int q0 = 0; q0 < T; q0 += kQueryBlock) {
            const int rows = std::min(kQueryBlock, T - q0), keys = q0 + rows;
            const float* Qb = Q + static_cast<long>(q0) * ld;
            const float* dOb = dO + static_cast<long>(q0) * C;
            gemm(GemmPrecision::fp32, rows, keys, HS, {Qb, ld, 1}, {K, 1, ld}, S, keys, false);
            gemm(GemmPrecision::fp32, rows, keys, HS, {dOb, C, 1}, {V, 1, ld}, dP, keys, false);
            for (int i = 0; i < rows; i++) {
              float* s_row = S + static_cast<long>(i) * keys;
              float* dp_row = dP + static_cast<long>(i) * keys;
              const int first = attention_first_key(positions, b, T, q0 + i, heads.window);
              if (heads.dropout.active())
                softmax_backward_row_dropout(s_row, dp_row, first, q0 + i + 1, keys, scale, slope, lse_bh[q0 + i],
                                             D[q0 + i], heads.dropout, stream, heads.layer_head(h), T);
              else
                softmax_backward_row(s_row, dp_row, first, q0 + i + 1, keys, scale, slope, lse_bh[q0 + i], D[q0 + i]);
            }
            // dQ (rows × HS) = dS K; dK (keys × HS) += dSᵀ Q; dV (keys × HS) += Pᵀ dO
            gemm(GemmPrecision::fp32, rows, HS, keys, {dP, keys, 1}, {K, ld, 1}, dQ + static_cast<long>(q0) * ld, ld,
                 false);
            gemm(GemmPrecision::fp32, keys, HS, rows, {dP, 1, keys}, {Qb, ld, 1}, dK, ld, true);
            gemm(GemmPrecision::fp32, keys, HS, rows, {S, 1, keys}, {dOb, C, 1}, dV, ld, true);
          }
        }
      }
  }
}

}  // namespace anvil::cpu
