// Composer's learning-rate schedules.
#include "optim/schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace anvil {

double LrSchedule::multiplier(int64_t t) const {
  if (name == "constant") return 1.0;
  if (t < t_warmup) return static_cast<double>(t) / static_cast<double>(t_warmup);
  if (name == "constant_with_warmup") return 1.0;
  const double span = static_cast<double>(std::max<int64_t>(1, t_max - t_warmup));
  const double tau = std::min(1.0, static_cast<double>(t - t_warmup) / span);
  if (name == "cosine_with_warmup")
    return alpha_f + (1.0 - alpha_f) * 0.5 * (1.0 + std::cos(M_PI * tau));
  if (name == "linear_decay_with_warmup") return 1.0 + (alpha_f - 1.0) * tau;
  ANVIL_FAIL("scheduler.name '{}' is not supported: expected constant, constant_with_warmup, "
             "cosine_with_warmup or linear_decay_with_warmup", name);
}

}  // namespace anvil
