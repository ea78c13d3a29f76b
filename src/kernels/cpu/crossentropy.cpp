// Fused softmax cross-entropy: one thread per row block, probabilities rebuilt from the saved
// log-sum-exp in backward instead of being stored (N×V floats saved).
#include <cmath>

#include "kernels/crossentropy.h"

namespace anvil::cpu {

void crossentropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets,
                          int N, int V) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float* x = logits + static_cast<long>(n) * V;
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int v = 0; v < V; v++) mx = std::max(mx, x[v]);
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int v = 0; v < V; v++) sum += std::exp(x[v] - mx);
    const float l = mx + std::log(sum);
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
    const float l = lse[n];
#pragma omp simd
    for (int v = 0; v < V; v++) dx[v] = dloss * std::exp(x[v] - l);
    dx[targets[n]] -= dloss;
  }
}

}  // namespace anvil::cpu
