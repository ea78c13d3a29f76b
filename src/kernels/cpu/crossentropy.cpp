// Fused softmax cross-entropy: one thread per row block, probabilities rebuilt from the saved
// log-sum-exp in backward instead of being stored (N×V floats saved).
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

ANVIL_CPU_CLONES float row_sum_exp(const float* x, float shift, int V) {
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int v = 0; v < V; v++) sum += exp_approx(x[v] - shift);
  return sum;
}

ANVIL_CPU_CLONES void row_softmax_scaled(float* dx, const float* x, float lse, float scale, int V) {
#pragma omp simd
  for (int v = 0; v < V; v++) dx[v] = scale * exp_approx(x[v] - lse);
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

void crossentropy_backward(float* dlogits, const float* logits, const float* lse,
                           const int32_t* targets, float dloss, int N, int V) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float* x = logits + static_cast<long>(n) * V;
    float* dx = dlogits + static_cast<long>(n) * V;
    if (targets[n] == kIgnoreIndex) {
#pragma omp simd
      for (int v = 0; v < V; v++) dx[v] = 0.0f;
      continue;
    }
    row_softmax_scaled(dx, x, lse[n], dloss, V);
    dx[targets[n]] -= dloss;
  }
}

}  // namespace anvil::cpu
