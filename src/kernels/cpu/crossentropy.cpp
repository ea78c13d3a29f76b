// Softmax cross-entropy: rows split across threads; probabilities are never stored (N×V floats
// saved). Training's fused form writes e^(x - max) over the logits and scales it in place, so
// each logit costs one exp. The amp rounding of logits and gradient happens in the same passes
// (the row loops are compiled once per dtype, so the fp32 loops carry no rounding).
#include <algorithm>
#include <cmath>

#include "kernels/crossentropy.h"
#include "kernels/cpu/round_value.h"
#include "kernels/cpu/vec_math.h"

namespace anvil::cpu {
namespace {

// Written as a select: GCC does not vectorise std::max's reduction (it stayed a scalar loop that
// took more time than the exps).
ANVIL_CPU_CLONES float row_max(const float* x, int V) {
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int v = 0; v < V; v++) mx = x[v] > mx ? x[v] : mx;
  return mx;
}

// Row sums run over 2048-element blocks in float (vectorised), the block sums added in double:
// a plain float sum over a 50257-word vocabulary loses ~1e-4 of relative precision, which would
// go straight into every probability. The order is fixed, so the bits are too.
constexpr int kSumBlock = 2048;

template <ComputeDtype D>
ANVIL_CPU_CLONES float row_sum_exp(const float* x, float shift, int V) {
  double total = 0;
  for (int v0 = 0; v0 < V; v0 += kSumBlock) {
    const int v1 = std::min(V, v0 + kSumBlock);
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int v = v0; v < v1; v++) sum += exp_approx(round_value(x[v], D) - shift);
    total += sum;
  }
  return static_cast<float>(total);
}

// dx[v] = e^(x[v] - shift), x rounded to D; returns the sum, blocked as in row_sum_exp. dx may
// alias x.
template <ComputeDtype D>
ANVIL_CPU_CLONES float row_exp_store(float* dx, const float* x, float shift, int V) {
  double total = 0;
  for (int v0 = 0; v0 < V; v0 += kSumBlock) {
    const int v1 = std::min(V, v0 + kSumBlock);
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int v = v0; v < v1; v++) {
      const float e = exp_approx(round_value(x[v], D) - shift);
      dx[v] = e;
      sum += e;
    }
    total += sum;
  }
  return static_cast<float>(total);
}

template <ComputeDtype D>
ANVIL_CPU_CLONES void row_scale(float* x, float scale, int V) {
#pragma omp simd
  for (int v = 0; v < V; v++) x[v] = round_value(x[v] * scale, D);
}

// Rounding is monotonic, so the largest rounded logit is the largest logit rounded.
template <ComputeDtype D>
void forward_rows(float* losses, float* lse, const float* logits, const int32_t* targets, int N, int V) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float* x = logits + static_cast<long>(n) * V;
    const float mx = round_value(row_max(x, V), D);
    const float l = mx + std::log(row_sum_exp<D>(x, mx, V));
    lse[n] = l;
    losses[n] = targets[n] == kIgnoreIndex ? 0.0f : l - round_value(x[targets[n]], D);
  }
}

template <ComputeDtype D>
void forward_backward_rows(float* losses, float* dlogits, const float* logits, const int32_t* targets, float dloss,
                           int N, int V) {
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
    const float x_target = round_value(x[target], D);  // read before dx (maybe x itself) is overwritten
    const float mx = round_value(row_max(x, V), D);
    const float sum = row_exp_store<D>(dx, x, mx, V);
    losses[n] = mx + std::log(sum) - x_target;
    const float scale = dloss / sum, e_target = dx[target];
    row_scale<D>(dx, scale, V);
    dx[target] = round_value(e_target * scale - dloss, D);  // rounded once, after the subtraction
  }
}

}  // namespace

void crossentropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets,
                          int N, int V, ComputeDtype d) {
  switch (d) {
    case ComputeDtype::kFp32: return forward_rows<ComputeDtype::kFp32>(losses, lse, logits, targets, N, V);
    case ComputeDtype::kBf16: return forward_rows<ComputeDtype::kBf16>(losses, lse, logits, targets, N, V);
    case ComputeDtype::kFp16: return forward_rows<ComputeDtype::kFp16>(losses, lse, logits, targets, N, V);
  }
}

void crossentropy_forward_backward(float* losses, float* dlogits, const float* logits,
                                   const int32_t* targets, float dloss, int N, int V, ComputeDtype d) {
  switch (d) {
    case ComputeDtype::kFp32:
      return forward_backward_rows<ComputeDtype::kFp32>(losses, dlogits, logits, targets, dloss, N, V);
    case ComputeDtype::kBf16:
      return forward_backward_rows<ComputeDtype::kBf16>(losses, dlogits, logits, targets, dloss, N, V);
    case ComputeDtype::kFp16:
      return forward_backward_rows<ComputeDtype::kFp16>(losses, dlogits, logits, targets, dloss, N, V);
  }
}

}  // namespace anvil::cpu
