// Learning-rate schedules with Composer's definitions (LLM Foundry's scheduler.name values), as a
// multiplier of optimizer.lr at batch t (0-based). Warmup is linear from 0: t / t_warmup.
#pragma once
#include <cstdint>
#include <string>

namespace anvil {

struct SchedulerConfig {
  // constant | constant_with_warmup | cosine_with_warmup | linear_decay_with_warmup
  std::string name = "cosine_with_warmup";
  int64_t t_warmup = 0;  // batches
  double alpha_f = 0.0;  // final multiplier of the decaying schedules
};

// t_max: the total number of batches of the run.
double lr_multiplier(const SchedulerConfig& cfg, int64_t t, int64_t t_max);

}  // namespace anvil
