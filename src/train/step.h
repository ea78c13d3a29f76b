// One optimizer step over a global batch, cut into microbatches: the loss of every microbatch is
// weighted by 1 / (target tokens of the whole batch), so gradients are exact whatever the
// microbatch size (Composer's rule), then clipped by global norm, then AdamW.
#pragma once
#include <cstdint>

#include "config/train_config.h"
#include "model/gpt2.h"
#include "optim/adamw.h"
#include "optim/schedule.h"

namespace anvil {

struct StepResult {
  double loss = 0;       // mean over the batch's target tokens
  double grad_norm = 0;  // before clipping
  double lr = 0;
  int64_t target_tokens = 0;
};

class TrainStep {
 public:
  TrainStep(const TrainConfig& cfg, Gpt2& model, AdamW& optimizer, const LrSchedule& schedule);
  // tokens, targets: (batch, seq_len) with batch = global_train_batch_size. t: 0-based step.
  StepResult run(const int32_t* tokens, const int32_t* targets, int batch, int seq_len, int64_t t);

 private:
  Gpt2& model_;
  AdamW& optimizer_;
  LrSchedule schedule_;
  int microbatch_;
  double lr_, clip_;
};

}  // namespace anvil
