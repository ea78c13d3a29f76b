// Learning-rate schedules: Composer's (LLM Foundry's scheduler.name values), a multiplier of
// optimizer.lr at batch t (0-based), warmup linear from 0 (t / t_warmup); and DeepSpeed's, as its
// engine steps them: a schedule advances after each applied update (a step skipped for fp16
// overflow does not advance it), and the first update runs at the rate DeepSpeed sets at start.
#pragma once
#include <cstdint>

#include "config/scheduler_config.h"

namespace anvil {

class LrSchedule {
 public:
  // t_warmup, t_max: Composer's durations in batches; total_steps: the run's length in batches
  // (DeepSpeed's total_num_steps when 0).
  LrSchedule(const SchedulerConfig& cfg, int64_t t_warmup, int64_t t_max, int64_t total_steps);
  static LrSchedule constant();  // optimizer.lr at every step

  // The rate of the update at batch t after `applied` updates so far, for optimizer.lr base_lr.
  double lr(int64_t t, int64_t applied, double base_lr) const;

 private:
  double composer_multiplier(int64_t t) const;
  double deepspeed_lr(int64_t iteration, double base_lr) const;  // iteration: DeepSpeed's last_batch_iteration

  SchedulerConfig cfg_;
  int64_t t_warmup_, t_max_, total_steps_;
};

}  // namespace anvil
