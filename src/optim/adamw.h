// AdamW with decoupled weight decay, and global-norm gradient clipping over the flat gradient.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/gpt2.h"

namespace anvil {

class AdamW {
 public:
  // The optimizer of the flat parameter range [lo, hi) (a ZeRO shard; the whole model by
  // default). Its moments cover that range only.
  AdamW(const OptimizerConfig& cfg, const std::vector<ParamTensor>& layout, size_t num_params);
  AdamW(const OptimizerConfig& cfg, const std::vector<ParamTensor>& layout, size_t lo, size_t hi);
  // One update with this step's learning rate (the schedule already applied). params and grads
  // point at element lo of their flat arrays.
  void step(float* params, const float* grads, double lr);
  int64_t steps_taken() const { return t_; }
  std::vector<float>& exp_avg() { return m_; }
  std::vector<float>& exp_avg_sq() { return v_; }
  void set_steps_taken(int64_t t) { t_ = t; }

 private:
  OptimizerConfig cfg_;
  std::vector<ParamTensor> layout_;
  size_t lo_ = 0, hi_ = 0;
  std::vector<float> m_, v_;
  int64_t t_ = 0;
};

// The L2 norm of the whole gradient, summed in a fixed order whatever the thread count. When
// max_norm > 0 and the norm exceeds it, scales grads by max_norm / (norm + 1e-6) as PyTorch's
// clip_grad_norm_ does. Returns the norm before clipping.
double clip_grad_norm(float* grads, size_t n, double max_norm);
// The pieces of clip_grad_norm, for gradients sharded over ranks: the sum of squares (in double,
// over fixed chunks, the same bits for any thread count), the clip coefficient for a norm
// (1 when no clipping applies) and the scaling.
double grad_sum_of_squares(const float* grads, size_t n);
float clip_coefficient(double norm, double max_norm);
void scale_grads(float* grads, size_t n, float coef);

}  // namespace anvil
