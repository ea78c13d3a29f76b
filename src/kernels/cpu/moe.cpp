// The mixture-of-experts ops on the CPU (kernels/moe.h): tokens split across OpenMP threads, each
// token's sums over its choices in order, so the thread count never changes a bit.
#include <algorithm>
#include <cmath>

#include "kernels/moe.h"

namespace anvil::cpu {

namespace {
// The chosen probabilities' p-norm (1 when norm_p is 0: not normalised).
float choice_norm(const float* probs, const int32_t* experts, int k, float norm_p) {
  if (norm_p <= 0) return 1.0f;
  float sum = 0;
  for (int j = 0; j < k; j++) sum += std::pow(probs[experts[j]], norm_p);
  return std::pow(sum, 1.0f / norm_p);
}
}  // namespace

void moe_route(float* probs, int32_t* experts, float* weights, const float* logits, int N, int E, int k,
               float norm_p) {
#pragma omp parallel for schedule(static)
  for (long t = 0; t < N; t++) {
    const float* x = logits + t * E;
    float* p = probs + t * E;
    const float max = *std::max_element(x, x + E);
    float sum = 0;
    for (int e = 0; e < E; e++) sum += p[e] = std::exp(x[e] - max);
    for (int e = 0; e < E; e++) p[e] /= sum;
    int32_t* chosen = experts + t * k;
    moe_top_k(chosen, x, E, k);
    const float norm = choice_norm(p, chosen, k, norm_p);
    for (int j = 0; j < k; j++) weights[t * k + j] = p[chosen[j]] / norm;
  }
}

void moe_route_backward(float* dlogits, const float* probs, const int32_t* experts, const float* weights,
                        const float* dweights, const float* dprobs, int N, int E, int k, float norm_p) {
#pragma omp parallel for schedule(static)
  for (long t = 0; t < N; t++) {
    const float* p = probs + t * E;
    float* d = dlogits + t * E;  // the probabilities' gradient first, then the logits'
    for (int e = 0; e < E; e++) d[e] = dprobs ? dprobs[t * E + e] : 0.0f;
    const int32_t* chosen = experts + t * k;
    const float* w = weights + t * k;
    const float* dw = dweights + t * k;
    float dot = 0;
    for (int j = 0; j < k; j++) dot += dw[j] * w[j];
    const float norm = choice_norm(p, chosen, k, norm_p);
    for (int j = 0; j < k; j++)
      d[chosen[j]] += (dw[j] - (norm_p > 0 ? dot * std::pow(w[j], norm_p - 1.0f) : 0.0f)) / norm;
    float s = 0;
    for (int e = 0; e < E; e++) s += p[e] * d[e];
    for (int e = 0; e < E; e++) d[e] = p[e] * (d[e] - s);
  }
}

void gather_rows(float* out, const float* inp, const int32_t* rows, long n_rows, int C) {
#pragma omp parallel for schedule(static)
  for (long r = 0; r < n_rows; r++) std::copy_n(inp + static_cast<long>(rows[r]) * C, C, out + r * C);
}

void moe_combine(float* out, const float* y, const int32_t* slots, const float* weights, int N, int k, int C,
                 bool accumulate) {
#pragma omp parallel for schedule(static)
  for (long t = 0; t < N; t++) {
    float* o = out + t * C;
    if (!accumulate) std::fill_n(o, C, 0.0f);
    for (int j = 0; j < k; j++) {
      const long s = slots[t * k + j];
      if (s < 0) continue;
      const float w = weights ? weights[t * k + j] : 1.0f;
      const float* ys = y + s * C;
#pragma omp simd
      for (int c = 0; c < C; c++) o[c] += w * ys[c];
    }
  }
}

void moe_combine_backward(float* dy, float* dweights, const float* dout, const float* y, const int32_t* slots,
                          const int32_t* slot_tokens, const int32_t* slot_choices, const float* weights, int N, int k,
                          int C, long S) {
#pragma omp parallel for schedule(static)
  for (long s = 0; s < S; s++) {
    const long t = slot_tokens[s];
    const float w = weights[t * k + slot_choices[s]];
    const float* d = dout + t * C;
    float* o = dy + s * C;
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = w * d[c];
  }
#pragma omp parallel for schedule(static)
  for (long t = 0; t < N; t++)
    for (int j = 0; j < k; j++) {
      const long s = slots[t * k + j];
      float dot = 0;
      if (s >= 0) {
        const float *d = dout + t * C, *ys = y + s * C;
#pragma omp simd reduction(+ : dot)
        for (int c = 0; c < C; c++) dot += d[c] * ys[c];
      }
      dweights[t * k + j] = dot;
    }
}

}  // namespace anvil::cpu
