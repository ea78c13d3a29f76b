// AdamW as PyTorch computes it (bias corrections folded into the step size and the denominator),
// and clipping by the global gradient norm; the element-wise work is kernels/optimizer.h's.
#include "optim/adamw.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/optimizer.h"
#include "kernels/round.h"

namespace anvil {

AdamW::AdamW(KernelImpl impl, const OptimizerConfig& cfg, const std::vector<ParamTensor>& layout, size_t num_params)
    : AdamW(impl, cfg, layout, 0, num_params) {}

AdamW::AdamW(KernelImpl impl, const OptimizerConfig& cfg, const std::vector<ParamTensor>& layout, size_t lo, size_t hi)
    : impl_(impl), cfg_(cfg), layout_(layout), lo_(lo), hi_(hi) {
  ANVIL_CHECK(lo <= hi, "optimizer range [{}, {}) is empty the wrong way round", lo, hi);
  m_.assign_zeros(impl_, hi - lo);
  v_.assign_zeros(impl_, hi - lo);
}

AdamWStep AdamW::begin_step(double lr, float grad_scale, const std::vector<int>* exponents) {
  t_++;
  const float beta1 = static_cast<float>(cfg_.beta1), beta2 = static_cast<float>(cfg_.beta2);
  const float eps = static_cast<float>(cfg_.eps);
  const double bc1 = cfg_.bias_correction ? 1.0 - std::pow(cfg_.beta1, static_cast<double>(t_)) : 1.0;
  const double bc2 = cfg_.bias_correction ? 1.0 - std::pow(cfg_.beta2, static_cast<double>(t_)) : 1.0;
  const float step_size = static_cast<float>(lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const double decay_rate = cfg_.name == OptimizerKind::kAdamW ? lr * cfg_.weight_decay
                                                 : (cfg_.lr > 0 ? lr / cfg_.lr : 1.0) * cfg_.weight_decay;
  tensors_host_.clear();
  for (size_t k = 0; k < layout_.size(); k++) {
    const ParamTensor& t = layout_[k];
    const size_t a = std::max(lo_, t.offset), b = std::min(hi_, t.offset + t.numel);
    if (a >= b) continue;
    const float keep = t.weight_decay ? static_cast<float>(1.0 - decay_rate) : 1.0f;
    tensors_host_.push_back({a - lo_, b - a, keep, exponents ? (*exponents)[k] : 0});
  }
  if (tensors_.size() < tensors_host_.size()) tensors_.assign_zeros(impl_, tensors_host_.size());
  op_copy_from_host(impl_, tensors_.data(), tensors_host_.data(), tensors_host_.size() * sizeof(AdamWTensor));
  return AdamWStep{beta1, beta2, eps, step_size, bc2_sqrt, grad_scale};
}

void AdamW::step(float* params, const float* grads, double lr, float grad_scale) {
  const AdamWStep s = begin_step(lr, grad_scale, nullptr);
  adamw_update(impl_, params, grads, m_.data(), v_.data(), hi_ - lo_, tensors_.data(),
               static_cast<int>(tensors_host_.size()), s);
  hold(params);
}

void AdamW::step(float* params, const int64_t* fixed, const std::vector<int>& exponents, double lr,
                 float grad_scale) {
  ANVIL_CHECK(exponents.size() == layout_.size(), "{} fixed-point exponents for {} tensors", exponents.size(),
              layout_.size());
  const AdamWStep s = begin_step(lr, grad_scale, &exponents);
  adamw_update_fixed(impl_, params, fixed, m_.data(), v_.data(), hi_ - lo_, tensors_.data(),
                     static_cast<int>(tensors_host_.size()), s);
  hold(params);
}

bool AdamW::hold(float* params) {
  // DeepSpeed's bf16 master weights and optimizer states: the step's arithmetic in fp32, each
  // result rounded to the nearest bf16 (ties to even) as it is stored.
  if (cfg_.master_weights_dtype == StateDtype::kBf16)
    for (const ParamTensor& t : layout_) {
      const size_t a = std::max(lo_, t.offset), b = std::min(hi_, t.offset + t.numel);
      if (a < b) round_to_dtype(impl_, params + (a - lo_), static_cast<long>(b - a), ComputeDtype::kBf16);
    }
  if (cfg_.states_dtype == StateDtype::kBf16)
    for (OpArray<float>* moments : {&m_, &v_})
      round_to_dtype(impl_, moments->data(), static_cast<long>(hi_ - lo_), ComputeDtype::kBf16);
  return cfg_.master_weights_dtype == StateDtype::kBf16;
}

float clip_coefficient(double norm, double max_norm) {
  return max_norm > 0 && norm > max_norm ? static_cast<float>(max_norm / (norm + 1e-6)) : 1.0f;
}

double grad_norm(KernelImpl impl, const float* grads, size_t n) { return std::sqrt(sum_of_squares(impl, grads, n)); }

}  // namespace anvil
