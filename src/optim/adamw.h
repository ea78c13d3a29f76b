// AdamW with decoupled weight decay, and global-norm gradient clipping over the flat gradient.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/buffer.h"
#include "kernels/optimizer.h"
#include "config/train_config.h"
#include "model/model.h"

namespace anvil {

class AdamW {
 public:
  // The optimizer of the flat parameter range [lo, hi) (a ZeRO shard; the whole model by
  // default). Its moments cover that range only, in impl's memory; impl's kernels update them.
  AdamW(KernelImpl impl, const OptimizerConfig& cfg, const std::vector<ParamTensor>& layout, size_t num_params);
  AdamW(KernelImpl impl, const OptimizerConfig& cfg, const std::vector<ParamTensor>& layout, size_t lo, size_t hi);
  // One update with this step's learning rate (the schedule already applied), on the gradient
  // times grad_scale (the clipping coefficient; the gradient itself is not modified). params and
  // grads point at element lo of their flat arrays (op memory).
  void step(float* params, const float* grads, double lr, float grad_scale);
  // The same update reading the gradient from int64 fixed-point accumulators (kernels/
  // fixed_point.h; element lo of the flat array), tensor k of the layout at exponent exponents[k].
  void step(float* params, const int64_t* fixed, const std::vector<int>& exponents, double lr, float grad_scale);
  // Rounds what the optimizer keeps to the dtypes its config names (master_weights_dtype: the
  // weights of the layout's tensors in [lo, hi), params at element lo; states_dtype: the moments).
  // step() ends with it; a run calls it once the weights are initialized or loaded. Returns
  // whether it rounded the weights.
  bool hold(float* params);
  int64_t steps_taken() const { return t_; }
  // The moments over [lo, hi), op memory.
  float* exp_avg() { return m_.data(); }
  float* exp_avg_sq() { return v_.data(); }
  void set_steps_taken(int64_t t) { t_ = t; }

 private:
  // Advances the step count and sets tensors_ to this step's part of every layout tensor that
  // overlaps [lo, hi) (offsets from lo; its decay, and its exponent when given); returns the
  // step's shared factors.
  AdamWStep begin_step(double lr, float grad_scale, const std::vector<int>* exponents);
  KernelImpl impl_;
  OptimizerConfig cfg_;
  std::vector<ParamTensor> layout_;
  size_t lo_ = 0, hi_ = 0;
  OpArray<float> m_, v_;
  std::vector<AdamWTensor> tensors_host_;
  OpArray<AdamWTensor> tensors_;  // the step's tensors where the ops read them
  int64_t t_ = 0;
};

// The L2 norm of a gradient in op memory (kernels/optimizer.h's sum_of_squares: a fixed order
// whatever the thread count).
double grad_norm(KernelImpl impl, const float* grads, size_t n);
// Clipping by global norm as PyTorch's clip_grad_norm_ does: when max_norm > 0 and the norm
// exceeds it, the gradient is scaled by max_norm / (norm + 1e-6); 1 otherwise. AdamW::step
// applies it as it reads the gradient.
float clip_coefficient(double norm, double max_norm);

}  // namespace anvil
