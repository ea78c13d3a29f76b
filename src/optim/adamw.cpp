// AdamW as PyTorch computes it (bias corrections folded into the step size and the denominator),
// and the global gradient norm summed over fixed chunks.
#include "optim/adamw.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace anvil {

AdamW::AdamW(const OptimizerConfig& cfg, const std::vector<ParamTensor>& layout, size_t num_params)
    : AdamW(cfg, layout, 0, num_params) {}

AdamW::AdamW(const OptimizerConfig& cfg, const std::vector<ParamTensor>& layout, size_t lo, size_t hi)
    : cfg_(cfg), layout_(layout), lo_(lo), hi_(hi), m_(hi - lo, 0.0f), v_(hi - lo, 0.0f) {
  ANVIL_CHECK(lo <= hi, "optimizer range [{}, {}) is empty the wrong way round", lo, hi);
  ANVIL_CHECK(cfg.name == "adamw" || cfg.name == "decoupled_adamw",
              "optimizer.name '{}' is not supported: expected 'decoupled_adamw' or 'adamw'", cfg.name);
}

void AdamW::step(float* params, const float* grads, double lr) {
  t_++;
  const float beta1 = static_cast<float>(cfg_.beta1), beta2 = static_cast<float>(cfg_.beta2);
  const float eps = static_cast<float>(cfg_.eps);
  const double bc1 = 1.0 - std::pow(cfg_.beta1, static_cast<double>(t_));
  const double bc2 = 1.0 - std::pow(cfg_.beta2, static_cast<double>(t_));
  const float step_size = static_cast<float>(lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const double decay_rate = cfg_.name == "adamw" ? lr * cfg_.weight_decay
                                                 : (cfg_.lr > 0 ? lr / cfg_.lr : 1.0) * cfg_.weight_decay;
  for (const ParamTensor& t : layout_) {
    const size_t a = std::max(lo_, t.offset), b = std::min(hi_, t.offset + t.numel);
    if (a >= b) continue;
    const float keep = t.weight_decay ? static_cast<float>(1.0 - decay_rate) : 1.0f;
    float* p = params + (a - lo_);
    const float* g = grads + (a - lo_);
    float* m = m_.data() + (a - lo_);
    float* v = v_.data() + (a - lo_);
    const long n = static_cast<long>(b - a);
#pragma omp parallel for simd schedule(static)
    for (long i = 0; i < n; i++) {
      p[i] *= keep;
      m[i] = beta1 * m[i] + (1.0f - beta1) * g[i];
      v[i] = beta2 * v[i] + (1.0f - beta2) * g[i] * g[i];
      p[i] -= step_size * m[i] / (std::sqrt(v[i]) / bc2_sqrt + eps);
    }
  }
}

double grad_sum_of_squares(const float* grads, size_t n) {
  // Partial sums over fixed 64K-element chunks, then added in chunk order: the same bits for
  // any number of threads.
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
    for (size_t i = lo; i < hi; i++) s += static_cast<double>(grads[i]) * grads[i];
    partial[c] = s;
  }
  double sum = 0;
  for (long c = 0; c < chunks; c++) sum += partial[c];
  return sum;
}

float clip_coefficient(double norm, double max_norm) {
  return max_norm > 0 && norm > max_norm ? static_cast<float>(max_norm / (norm + 1e-6)) : 1.0f;
}

void scale_grads(float* grads, size_t n, float coef) {
  if (coef == 1.0f) return;
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) grads[i] *= coef;
}

double clip_grad_norm(float* grads, size_t n, double max_norm) {
  const double norm = std::sqrt(grad_sum_of_squares(grads, n));
  scale_grads(grads, n, clip_coefficient(norm, max_norm));
  return norm;
}

}  // namespace anvil
