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

// Row sums run over blocks of kCrossentropySumBlock elements in float (vectorised), the block sums
// added in double: a plain float sum over a 50257-word vocabulary loses ~1e-4 of relative
// precision, which would go straight into every probability. The order is fixed, so the bits are
// too, and a vocabulary cut at block boundaries (the slice ops) sums the same blocks.
template <ComputeDtype D>
ANVIL_CPU_CLONES float block_sum_exp(const float* x, float shift, int n) {
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int v = 0; v < n; v++) sum += exp_approx(round_value(x[v], D) - shift);
  return sum;
}

// dx[v] = e^(x[v] - shift), x rounded to D; returns their sum. dx may alias x.
template <ComputeDtype D>
ANVIL_CPU_CLONES float block_exp_store(float* dx, const float* x, float shift, int n) {
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int v = 0; v < n; v++) {
    const float e = exp_approx(round_value(x[v], D) - shift);
    dx[v] = e;
    sum += e;
  }
  return sum;
}

int sum_blocks(int V) { return (V + kCrossentropySumBlock - 1) / kCrossentropySumBlock; }

// A block's sum, its exps stored where dx is not null.
template <ComputeDtype D>
float block_sum(float* dx, const float* x, float shift, int v0, int V) {
  const int n = std::min(V - v0, kCrossentropySumBlock);
  return dx ? block_exp_store<D>(dx + v0, x + v0, shift, n) : block_sum_exp<D>(x + v0, shift, n);
}

template <ComputeDtype D>
float row_sum(float* dx, const float* x, float shift, int V) {
  double total = 0;
  for (int v0 = 0; v0 < V; v0 += kCrossentropySumBlock) total += block_sum<D>(dx, x, shift, v0, V);
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
    const float l = mx + std::log(row_sum<D>(nullptr, x, mx, V));
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
    const float sum = row_sum<D>(dx, x, mx, V);
    losses[n] = mx + std::log(sum) - x_target;
    const float scale = dloss / sum, e_target = dx[target];
    row_scale<D>(dx, scale, V);
    dx[target] = round_value(e_target * scale - dloss, D);  // rounded once, after the subtraction
  }
}

template <ComputeDtype D>
void slice_max_rows(float* maxes, float* picked, const float* logits, const int32_t* targets, int N, int V) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float* x = logits + static_cast<long>(n) * V;
    maxes[n] = round_value(row_max(x, V), D);
    picked[n] = targets[n] >= 0 && targets[n] < V ? round_value(x[targets[n]], D) : -INFINITY;
  }
}

template <ComputeDtype D>
void slice_sums_rows(float* sums, float* exps, const float* logits, const float* shifts, int N, int V) {
  const int NB = sum_blocks(V);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float* x = logits + static_cast<long>(n) * V;
    float* dx = exps ? exps + static_cast<long>(n) * V : nullptr;
    for (int k = 0; k < NB; k++)
      sums[static_cast<long>(n) * NB + k] = block_sum<D>(dx, x, shifts[n], k * kCrossentropySumBlock, V);
  }
}

// The arithmetic of forward_rows and forward_backward_rows, from the row's sums.
template <ComputeDtype D>
void slice_finish_rows(float* losses, float* lse, float* dlogits, const float* sums, int NB, const float* shifts,
                       const float* picked, const int32_t* targets, float dloss, int N, int V) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    double total = 0;
    for (int k = 0; k < NB; k++) total += sums[static_cast<long>(n) * NB + k];
    const float sum = static_cast<float>(total), mx = shifts[n];
    const int32_t target = targets[n];
    if (lse) lse[n] = mx + std::log(sum);
    float* dx = dlogits ? dlogits + static_cast<long>(n) * V : nullptr;
    if (target == kIgnoreIndex) {
      losses[n] = 0.0f;
      if (dx) std::fill(dx, dx + V, 0.0f);
      continue;
    }
    losses[n] = mx + std::log(sum) - picked[n];
    if (!dx) continue;
    const bool here = target >= 0 && target < V;
    const float scale = dloss / sum, e_target = here ? dx[target] : 0.0f;
    row_scale<D>(dx, scale, V);
    if (here) dx[target] = round_value(e_target * scale - dloss, D);
  }
}

}  // namespace

// The row loop's instance for the dtype.
#define ANVIL_BY_DTYPE(d, rows, ...)                                     \
  switch (d) {                                                          \
    case ComputeDtype::kFp32: return rows<ComputeDtype::kFp32>(__VA_ARGS__); \
    case ComputeDtype::kBf16: return rows<ComputeDtype::kBf16>(__VA_ARGS__); \
    case ComputeDtype::kFp16: return rows<ComputeDtype::kFp16>(__VA_ARGS__); \
  }

void crossentropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets, int N, int V,
                          ComputeDtype d) {
  ANVIL_BY_DTYPE(d, forward_rows, losses, lse, logits, targets, N, V);
}

void crossentropy_forward_backward(float* losses, float* dlogits, const float* logits, const int32_t* targets,
                                   float dloss, int N, int V, ComputeDtype d) {
  ANVIL_BY_DTYPE(d, forward_backward_rows, losses, dlogits, logits, targets, dloss, N, V);
}

void crossentropy_slice_max(float* maxes, float* picked, const float* logits, const int32_t* targets, int N, int V,
                            ComputeDtype d) {
  ANVIL_BY_DTYPE(d, slice_max_rows, maxes, picked, logits, targets, N, V);
}

void crossentropy_slice_sums(float* sums, float* exps, const float* logits, const float* shifts, int N, int V,
                             ComputeDtype d) {
  ANVIL_BY_DTYPE(d, slice_sums_rows, sums, exps, logits, shifts, N, V);
}

void crossentropy_slice_finish(float* losses, float* lse, float* dlogits, const float* sums, int NB,
                               const float* shifts, const float* picked, const int32_t* targets, float dloss, int N,
                               int V, ComputeDtype d) {
  ANVIL_BY_DTYPE(d, slice_finish_rows, losses, lse, dlogits, sums, NB, shifts, picked, targets, dloss, N, V);
}
#undef ANVIL_BY_DTYPE

}  // namespace anvil::cpu
