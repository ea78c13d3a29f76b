// Composer's learning-rate schedules.
#include "optim/schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace anvil {

double LrSchedule::multiplier(int64_t t) const {
  if (name == SchedulerKind::kConstant) return 1.0;
  if (t < t_warmup) return static_cast<double>(t) / static_cast<double>(t_warmup);
  const double span = static_cast<double>(std::max<int64_t>(1, t_max - t_warmup));
  const double tau = std::min(1.0, static_cast<double>(t - t_warmup) / span);
  switch (name) {
    case SchedulerKind::kConstant:
    case SchedulerKind::kConstantWithWarmup: return 1.0;
    case SchedulerKind::kCosineWithWarmup: return alpha_f + (1.0 - alpha_f) * 0.5 * (1.0 + std::cos(M_PI * tau));
    case SchedulerKind::kLinearDecayWithWarmup: return 1.0 + (alpha_f - 1.0) * tau;
  }
  ANVIL_FAIL("scheduler {} has no multiplier", static_cast<int>(name));
}

}  // namespace anvil
