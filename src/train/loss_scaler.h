// amp_fp16's dynamic loss scale (config: loss_scaler). The loss is multiplied by the scale before
// the backward pass, so that small gradients survive fp16; a step whose gradients overflow is
// skipped. The rules are DeepSpeed's: after `hysteresis` overflowing steps (since the scale last
// grew, or in a row with consecutive_hysteresis) the scale halves, never below min_scale (an
// overflow there is an error: fp16 cannot hold this model's values); after growth_interval
// clean steps it doubles. Every rank sees the same overflows, so
// every rank holds the same state, and it is saved in checkpoints for an exact resume.
#pragma once
#include <cstdint>
#include <string>

#include "config/train_config.h"

namespace anvil {

class LossScaler {
 public:
  // Disabled (scale 1, never changes) unless the precision is amp_fp16.
  LossScaler(const LossScalerConfig& cfg, bool enabled);
  bool enabled() const { return enabled_; }
  double scale() const { return scale_; }
  // After step t (1-based, for messages): whether its gradients overflowed.
  void update(bool overflow, int64_t step);
  // {"scale", "good_steps", "hysteresis_left"} as JSON, and back (errors name what is wrong).
  std::string to_json() const;
  void restore(const std::string& json, const std::string& where);

 private:
  LossScalerConfig cfg_;
  bool enabled_;
  double scale_ = 1.0;
  int good_steps_ = 0, hysteresis_left_ = 1;
};

}  // namespace anvil
