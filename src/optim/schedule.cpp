// Composer's and DeepSpeed's learning-rate schedules.
#include "optim/schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace anvil {

LrSchedule::LrSchedule(const SchedulerConfig& cfg, int64_t t_warmup, int64_t t_max, int64_t total_steps)
    : cfg_(cfg), t_warmup_(t_warmup), t_max_(t_max), total_steps_(total_steps) {
  if (cfg_.total_num_steps == 0) cfg_.total_num_steps = total_steps;
  if (cfg_.cycle_second_step_size == 0) cfg_.cycle_second_step_size = cfg_.cycle_first_step_size;
  ANVIL_CHECK(cfg_.name != SchedulerKind::kWarmupCosineLR ||
                  cfg_.total_num_steps > std::max<int64_t>(2, cfg_.warmup_num_steps),
              "scheduler WarmupCosineLR: total_num_steps ({}) must exceed warmup_num_steps ({})",
              cfg_.total_num_steps, cfg_.warmup_num_steps);
}

LrSchedule LrSchedule::constant() {
  SchedulerConfig c;
  c.name = SchedulerKind::kConstant;
  return LrSchedule(c, 0, 0, 0);
}

double LrSchedule::lr(int64_t t, int64_t applied, double base_lr) const {
  // DeepSpeed's engine steps the schedule after each applied update, starting from iteration -1.
  if (cfg_.is_deepspeed()) return deepspeed_lr(applied - 1, base_lr);
  return base_lr * composer_multiplier(t);
}

double LrSchedule::composer_multiplier(int64_t t) const {
  if (cfg_.name == SchedulerKind::kConstant) return 1.0;
  if (t < t_warmup_) return static_cast<double>(t) / static_cast<double>(t_warmup_);
  const double span = static_cast<double>(std::max<int64_t>(1, t_max_ - t_warmup_));
  const double tau = std::min(1.0, static_cast<double>(t - t_warmup_) / span);
  switch (cfg_.name) {
    case SchedulerKind::kCosineWithWarmup:
      return cfg_.alpha_f + (1.0 - cfg_.alpha_f) * 0.5 * (1.0 + std::cos(M_PI * tau));
    case SchedulerKind::kLinearDecayWithWarmup: return 1.0 + (cfg_.alpha_f - 1.0) * tau;
    default: return 1.0;
  }
}

double LrSchedule::deepspeed_lr(int64_t i, double base_lr) const {
  const auto d = [](int64_t v) { return static_cast<double>(v); };
  const int64_t n = std::max<int64_t>(2, cfg_.warmup_num_steps);
  const auto warmup_gamma = [&] {
    return cfg_.warmup_type == WarmupType::kLog ? std::log(d(i + 1)) / std::log(d(n)) : d(i) / d(n);
  };
  switch (cfg_.name) {
    case SchedulerKind::kWarmupLR:
    case SchedulerKind::kWarmupDecayLR: {
      if (i < 0) return cfg_.warmup_min_lr;
      double gamma = 1.0;
      if (i < n) gamma = warmup_gamma();
      else if (cfg_.name == SchedulerKind::kWarmupDecayLR)
        gamma = std::max(0.0, d(cfg_.total_num_steps - i) / std::max(1.0, d(cfg_.total_num_steps - n)));
      return cfg_.warmup_min_lr + (cfg_.warmup_max_lr - cfg_.warmup_min_lr) * gamma;
    }
    case SchedulerKind::kWarmupCosineLR: {
      if (i < 0) return 0.0;
      if (i < n) return base_lr * (cfg_.warmup_min_ratio + warmup_gamma() * (1.0 - cfg_.warmup_min_ratio));
      const double cosine = (1.0 + std::cos(M_PI * d(i - n + 1) / d(cfg_.total_num_steps - n))) / 2.0;
      return base_lr * std::max(0.0, cfg_.cos_min_ratio + (1.0 - cfg_.cos_min_ratio) * cosine);
    }
    case SchedulerKind::kOneCycle: {
      if (i < 0) return cfg_.cycle_min_lr;
      const double total = d(cfg_.cycle_first_step_size + cfg_.cycle_second_step_size);
      if (d(i) <= total) {
        const double step_ratio = d(cfg_.cycle_first_step_size) / total;
        const double x = 1.0 + d(i) / total - std::floor(1.0 + d(i) / total);
        const double scale = x <= step_ratio ? x / step_ratio : (x - 1.0) / (step_ratio - 1.0);
        return cfg_.cycle_min_lr + (cfg_.cycle_max_lr - cfg_.cycle_min_lr) * scale;
      }
      if (cfg_.decay_step_size == 0) return cfg_.cycle_min_lr;
      return cfg_.cycle_min_lr * (1.0 + cfg_.decay_lr_rate * (d(i) - total) / d(cfg_.decay_step_size));
    }
    default: ANVIL_FAIL("scheduler {} is not one of DeepSpeed's", choice_name(cfg_.name));
  }
}

}  // namespace anvil
