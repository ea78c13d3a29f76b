// The optimizer's element-wise work on the CPU: OpenMP over elements, fixed chunks for the sum.
#include <cmath>
#include <vector>

#include "kernels/optimizer.h"

namespace anvil::cpu {

namespace {
template <class Gradient>
void adamw(float* p, const Gradient& g, float* m, float* v, size_t n, const AdamWStep& s) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) {
    const float gi = g(i) * s.grad_scale;
    p[i] *= s.keep;
    m[i] = s.beta1 * m[i] + (1.0f - s.beta1) * gi;
    v[i] = s.beta2 * v[i] + (1.0f - s.beta2) * gi * gi;
    p[i] -= s.step_size * m[i] / (std::sqrt(v[i]) / s.bc2_sqrt + s.eps);
  }
}
}  // namespace

void adamw_update(float* p, const float* g, float* m, float* v, size_t n, const AdamWStep& s) {
  adamw(p, [g](size_t i) { return g[i]; }, m, v, n, s);
}

void adamw_update_fixed(float* p, const int64_t* acc, int e, float* m, float* v, size_t n, const AdamWStep& s) {
  const double inverse_scale = std::ldexp(1.0, -e);  // a power of two: the product is exact
  adamw(p, [acc, inverse_scale](size_t i) { return static_cast<float>(static_cast<double>(acc[i]) * inverse_scale); },
        m, v, n, s);
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
