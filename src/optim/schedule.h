// Learning-rate schedules with Composer's definitions (LLM Foundry's scheduler.name values): a
// multiplier of optimizer.lr at batch t (0-based). Warmup is linear from 0: t / t_warmup.
#pragma once
#include <cstdint>

#include "config/choices.h"

namespace anvil {

struct LrSchedule {
  SchedulerKind name = SchedulerKind::kConstant;
  int64_t t_warmup = 0;  // batches
  double alpha_f = 0.0;  // final multiplier of the decaying schedules
  int64_t t_max = 0;     // batches in the whole run

  double multiplier(int64_t t) const;
};

}  // namespace anvil
