// The optimizer's element-wise work on the CPU: OpenMP over elements, fixed chunks for the sum.
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/optimizer.h"

namespace anvil::cpu {

namespace {

[[gnu::always_inline]] inline void adamw_element(float& p, float g_in, float& m, float& v, float keep,
                                                 const AdamWStep& s) {
  const float g = g_in * s.grad_scale;
  p *= keep;
  m = s.beta1 * m + (1.0f - s.beta1) * g;
  v = s.beta2 * v + (1.0f - s.beta2) * g * g;
  p -= s.step_size * m / (std::sqrt(v) / s.bc2_sqrt + s.eps);
}

// (double)v with the same rounding, from the two 32-bit halves, each converted exactly: the sum
// is the one rounding. Unlike a direct conversion it vectorises without AVX-512's vcvtqq2pd.
[[gnu::always_inline]] inline double int64_to_double(int64_t v) {
  const double high = static_cast<double>(static_cast<int32_t>(v >> 32)) * 4294967296.0;
  const double low = static_cast<double>(static_cast<int32_t>(static_cast<uint32_t>(v) ^ 0x80000000u)) + 2147483648.0;
  return high + low;
}

// Compiled per instruction set (ANVIL_CPU_CLONES) for vector width (124M parameters' update: 80
// ms a step in SSE2, 50-60 in AVX). This file is compiled with -ffp-contract=off, so that where
// FMA exists GCC does not fuse the moments' updates: every clone gives the reference's bits.
ANVIL_CPU_CLONES void adamw_range(float* p, const float* g, float* m, float* v, size_t lo, size_t hi, float keep,
                                  const AdamWStep& s) {
#pragma omp simd
  for (size_t i = lo; i < hi; i++) adamw_element(p[i], g[i], m[i], v[i], keep, s);
}

ANVIL_CPU_CLONES void adamw_fixed_range(float* p, const int64_t* acc, double inverse_scale, float* m, float* v,
                                        size_t lo, size_t hi, float keep, const AdamWStep& s) {
#pragma omp simd
  for (size_t i = lo; i < hi; i++)
    adamw_element(p[i], static_cast<float>(int64_to_double(acc[i]) * inverse_scale), m[i], v[i], keep, s);
}

}  // namespace

void adamw_update(float* p, const float* g, float* m, float* v, size_t, const AdamWTensor* tensors, int n_tensors,
                  const AdamWStep& s) {
  for (int k = 0; k < n_tensors; k++) {
    const AdamWTensor& t = tensors[k];
    float* pt = p + t.offset;
    float* mt = m + t.offset;
    float* vt = v + t.offset;
    const float* gt = g + t.offset;
    over_threads(t.count, [&](size_t lo, size_t hi) { adamw_range(pt, gt, mt, vt, lo, hi, t.keep, s); });
  }
}

void adamw_update_fixed(float* p, const int64_t* acc, float* m, float* v, size_t, const AdamWTensor* tensors,
                        int n_tensors, const AdamWStep& s) {
  for (int k = 0; k < n_tensors; k++) {
    const AdamWTensor& t = tensors[k];
    const double inverse_scale = std::ldexp(1.0, -t.exponent);  // a power of two: the product is exact
    float* pt = p + t.offset;
    float* mt = m + t.offset;
    float* vt = v + t.offset;
    const int64_t* at = acc + t.offset;
    over_threads(t.count, [&](size_t lo, size_t hi) {
      adamw_fixed_range(pt, at, inverse_scale, mt, vt, lo, hi, t.keep, s);
    });
  }
}

double sum_of_squares(const float* x, size_t n) {
  constexpr size_t kChunk = 1 << 16;
  const long chunks = static_cast<long>((n + kChunk - 1) / kChunk);
  // Kept between calls so that a step does not allocate; the OpenMP workers write through a
  // plain pointer (a thread_local would give each worker its own, empty, copy).
  thread_local std::vector<double> partial_sums;
  if (partial_sums.size() < static_cast<size_t>(chunks)) partial_sums.resize(chunks);
  double* partial = partial_sums.data();
#pragma omp parallel for schedule(static)
  for (long c = 0; c < chunks; c++) {
    const size_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
    double s = 0;
    for (size_t i = lo; i < hi; i++) s += static_cast<double>(x[i]) * x[i];
    partial[c] = s;
  }
  double sum = 0;
  for (long c = 0; c < chunks; c++) sum += partial[c];
  return sum;
}

bool scale_values_check_finite(float* x, size_t n, float coef) {
  int bad = 0;
#pragma omp parallel for simd reduction(| : bad)
  for (size_t i = 0; i < n; i++) {
    x[i] *= coef;
    bad |= !std::isfinite(x[i]);
  }
  return bad == 0;
}

}  // namespace anvil::cpu
