#include "optim/schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace anvil {

double lr_multiplier(const SchedulerConfig& cfg, int64_t t, int64_t t_max) {
  if (cfg.name == "constant") return 1.0;
  if (t < cfg.t_warmup) return static_cast<double>(t) / static_cast<double>(cfg.t_warmup);
  if (cfg.name == "constant_with_warmup") return 1.0;
  const double span = static_cast<double>(std::max<int64_t>(1, t_max - cfg.t_warmup));
  const double tau = std::min(1.0, static_cast<double>(t - cfg.t_warmup) / span);
  if (cfg.name == "cosine_with_warmup")
    return cfg.alpha_f + (1.0 - cfg.alpha_f) * 0.5 * (1.0 + std::cos(M_PI * tau));
  if (cfg.name == "linear_decay_with_warmup") return 1.0 + (cfg.alpha_f - 1.0) * tau;
  ANVIL_FAIL("scheduler.name '{}' is not supported: expected constant, constant_with_warmup, "
             "cosine_with_warmup or linear_decay_with_warmup", cfg.name);
}

}  // namespace anvil
