// Softmax cross-entropy: rows split across threads; probabilities are never stored (N×V floats
// saved). Training's fused form writes e^(x - max) over the logits and scales it in place, so
// each logit costs one exp.
#include <algorithm>
#include <cmath>

#include "kernels/crossentropy.h"
#include "kernels/cpu/vec_math.h"

namespace anvil::cpu {
namespace {

ANVIL_CPU_CLONES float row_max(const float* x, int V) {
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int v = 0; v < V; v++) mx = std::max(mx, x[v]);
  return mx;
}

// Row sums run over 2048-element blocks in float (vectorised), the block sums added in double:
// a plain float sum over a 50257-word vocabulary loses ~1e-4 of relative precision, which would
// go straight into every probability. The order is fixed, so the bits are too.
constexpr int kSumBlock = 2048;

ANVIL_CPU_CLONES float row_sum_exp(const float* x, float shift, int V) {
  double total = 0;
  for (int v0 = 0; v0 < V; v0 += kSumBlock) {
    const int v1 = std::min(V, v0 + kSumBlock);
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int v = v0; v < v1; v++) sum += exp_approx(x[v] - shift);
    total += sum;
  }
  return static_cast<float>(total);
}

// dx[v] = e^(x[v] - shift); returns the sum, blocked as in row_sum_exp. dx may alias x.
ANVIL_CPU_CLONES float row_exp_store(float* dx, const float* x, float shift, int V) {
  double total = 0;
  for (int v0 = 0; v0 < V; v0 += kSumBlock) {
    const int v1 = std::min(V, v0 + kSumBlock);
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int v = v0; v < v1; v++) {
      const float e = exp_approx(x[v] - shift);
      dx[v] = e;
      sum += e;
    }
    total += sum;
  }
  return static_cast<float>(total);
}

ANVIL_CPU_CLONES void row_scale(float* x, float scale, int V) {
#pragma omp simd
  for (int v = 0; v < V; v++) x[v] *= scale;
}

}  // namespace

void crossentropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets,
                          int N, int V) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float* x = logits + static_cast<long>(n) * V;
    const float mx = row_max(x, V);
    const float l = mx + std::log(row_sum_exp(x, mx, V));
    lse[n] = l;
    losses[n] = targets[n] == kIgnoreIndex ? 0.0f : l - x[targets[n]];
  }
}

void crossentropy_forward_backward(float* losses, float* dlogits, const float* logits,
                                   const int32_t* targets, float dloss, int N, int V) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float* x = logits + static_cast<long>(n) * V;
    float* dx = dlogits + static_cast<long>(n) * V;
    const int32_t target = targets[n];
    if (target == kIgnoreIndex) {
      losses[n] = 0.0f;
      std::fill(dx, dx + V, 0.0f);
      continue;
    }
    const float x_target = x[target];  // read before dx (maybe x itself) is overwritten
    const float mx = row_max(x, V);
    const float sum = row_exp_store(dx, x, mx, V);
    losses[n] = mx + std::log(sum) - x_target;
    row_scale(dx, dloss / sum, V);
    dx[target] -= dloss;
  }
}

}  // namespace anvil::cpu
