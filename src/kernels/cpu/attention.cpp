// Causal attention in tiles with an online softmax (flash-attention style): the T×T score matrix
// is never formed. Forward keeps a running max and sum per query row while it walks key tiles;
// backward rebuilds each probability from the saved log-sum-exp. Work is split by (batch, head)
// so every gradient row has one owner and sums run in a fixed order.
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/attention.h"

namespace anvil::cpu {
namespace {

constexpr int kKeyTile = 32;    // keys whose K and V rows stay in L1 while a query tile walks them
constexpr int kQueryTile = 32;  // queries that share one pass over the key tiles

inline float dot(const float* a, const float* b, int n) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int d = 0; d < n; d++) s += a[d] * b[d];
  return s;
}

inline void axpy(float* y, float a, const float* x, int n) {
#pragma omp simd
  for (int d = 0; d < n; d++) y[d] += a * x[d];
}

}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
  const int HS = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const int q_tiles = (T + kQueryTile - 1) / kQueryTile;
#pragma omp parallel for collapse(3) schedule(dynamic)
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int qt = 0; qt < q_tiles; qt++) {
        const int q0 = qt * kQueryTile, q1 = std::min(T, q0 + kQueryTile);
        const long row_stride = 3L * C;
        const float* base = qkv + static_cast<long>(b) * T * row_stride + h * HS;
        float m[kQueryTile], l[kQueryTile], s[kKeyTile];
        for (int i = q0; i < q1; i++) {
          m[i - q0] = -INFINITY;
          l[i - q0] = 0.0f;
          std::memset(out + (static_cast<long>(b) * T + i) * C + h * HS, 0, sizeof(float) * HS);
        }
        for (int k0 = 0; k0 < q1; k0 += kKeyTile) {
          const int k1 = std::min(q1, k0 + kKeyTile);
          for (int i = std::max(q0, k0); i < q1; i++) {
            const float* qi = base + i * row_stride;
            float* acc = out + (static_cast<long>(b) * T + i) * C + h * HS;
            const int jend = std::min(k1, i + 1);
            float tile_max = -INFINITY;
            for (int j = k0; j < jend; j++) {
              s[j - k0] = scale * dot(qi, base + j * row_stride + C, HS);
              tile_max = std::max(tile_max, s[j - k0]);
            }
            const float m_new = std::max(m[i - q0], tile_max);
            const float correction = std::exp(m[i - q0] - m_new);
            if (correction != 1.0f) {
#pragma omp simd
              for (int d = 0; d < HS; d++) acc[d] *= correction;
            }
            float sum = l[i - q0] * correction;
            for (int j = k0; j < jend; j++) {
              const float p = std::exp(s[j - k0] - m_new);
              sum += p;
              axpy(acc, p, base + j * row_stride + 2 * C, HS);
            }
            m[i - q0] = m_new;
            l[i - q0] = sum;
          }
        }
        for (int i = q0; i < q1; i++) {
          float* o = out + (static_cast<long>(b) * T + i) * C + h * HS;
          const float inv = 1.0f / l[i - q0];
#pragma omp simd
          for (int d = 0; d < HS; d++) o[d] *= inv;
          lse[(static_cast<long>(b) * NH + h) * T + i] = m[i - q0] + std::log(l[i - q0]);
        }
      }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int T, int C, int NH) {
  const int HS = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const long row_stride = 3L * C;
#pragma omp parallel
  {
    // Per-thread row terms, kept between calls so a training step does not allocate.
    thread_local std::vector<float> D;
    if (D.size() < static_cast<size_t>(T)) D.resize(T);
#pragma omp for collapse(2) schedule(dynamic)
    for (int b = 0; b < B; b++)
      for (int h = 0; h < NH; h++) {
        const float* base = qkv + static_cast<long>(b) * T * row_stride + h * HS;
        float* dbase = dqkv + static_cast<long>(b) * T * row_stride + h * HS;
        const float* lse_bh = lse + (static_cast<long>(b) * NH + h) * T;
        for (int t = 0; t < T; t++) {
          float* r = dbase + t * row_stride;
          std::memset(r, 0, sizeof(float) * HS);
          std::memset(r + C, 0, sizeof(float) * HS);
          std::memset(r + 2 * C, 0, sizeof(float) * HS);
          const long o = (static_cast<long>(b) * T + t) * C + h * HS;
          D[t] = dot(dout + o, out + o, HS);  // Σ_j P_ij dP_ij, the softmax backward's row term
        }
        for (int q0 = 0; q0 < T; q0 += kQueryTile) {
          const int q1 = std::min(T, q0 + kQueryTile);
          for (int k0 = 0; k0 < q1; k0 += kKeyTile) {
            const int k1 = std::min(q1, k0 + kKeyTile);
            for (int i = std::max(q0, k0); i < q1; i++) {
              const float* qi = base + i * row_stride;
              const float* doi = dout + (static_cast<long>(b) * T + i) * C + h * HS;
              float* dqi = dbase + i * row_stride;
              const int jend = std::min(k1, i + 1);
              for (int j = k0; j < jend; j++) {
                const float* kj = base + j * row_stride + C;
                const float p = std::exp(scale * dot(qi, kj, HS) - lse_bh[i]);
                const float dp = dot(doi, kj + C, HS);
                const float ds = p * (dp - D[i]) * scale;
                float* dkj = dbase + j * row_stride + C;
                axpy(dkj + C, p, doi, HS);  // dV_j
                axpy(dqi, ds, kj, HS);
                axpy(dkj, ds, qi, HS);
              }
            }
          }
        }
      }
  }
}

}  // namespace anvil::cpu
