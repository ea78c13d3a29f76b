// DeepSpeed's schedules' parameters (deepspeed/runtime/lr_schedules.py), one table for every
// place that reads, writes or translates them.
#include "config/scheduler_config.h"

namespace anvil {
namespace {
using K = SchedulerParam::Kind;
using S = SchedulerConfig;

constexpr SchedulerParam kWarmupLR[] = {
    {"warmup_min_lr", K::kRate, &S::warmup_min_lr},
    {"warmup_max_lr", K::kRate, &S::warmup_max_lr},
    {"warmup_num_steps", K::kSteps, nullptr, &S::warmup_num_steps},
    {"warmup_type", K::kWarmupType}};
constexpr SchedulerParam kWarmupDecayLR[] = {
    {"warmup_min_lr", K::kRate, &S::warmup_min_lr},
    {"warmup_max_lr", K::kRate, &S::warmup_max_lr},
    {"warmup_num_steps", K::kSteps, nullptr, &S::warmup_num_steps},
    {"warmup_type", K::kWarmupType},
    {"total_num_steps", K::kSteps, nullptr, &S::total_num_steps}};
constexpr SchedulerParam kWarmupCosineLR[] = {
    {"warmup_min_ratio", K::kRate, &S::warmup_min_ratio},
    {"cos_min_ratio", K::kRate, &S::cos_min_ratio},
    {"warmup_num_steps", K::kSteps, nullptr, &S::warmup_num_steps},
    {"warmup_type", K::kWarmupType},
    {"total_num_steps", K::kSteps, nullptr, &S::total_num_steps}};
constexpr SchedulerParam kOneCycle[] = {
    {"cycle_min_lr", K::kRate, &S::cycle_min_lr},
    {"cycle_max_lr", K::kRate, &S::cycle_max_lr},
    {"decay_lr_rate", K::kRate, &S::decay_lr_rate},
    {"cycle_first_step_size", K::kSteps, nullptr, &S::cycle_first_step_size, 1},
    {"cycle_second_step_size", K::kSteps, nullptr, &S::cycle_second_step_size},
    {"decay_step_size", K::kSteps, nullptr, &S::decay_step_size},
    {"cycle_momentum", K::kMomentumOff},
    {"cycle_first_stair_count", K::kUnused},
    {"cycle_second_stair_count", K::kUnused}};
}  // namespace

std::span<const SchedulerParam> scheduler_params(SchedulerKind kind) {
  switch (kind) {
    case SchedulerKind::kWarmupLR: return kWarmupLR;
    case SchedulerKind::kWarmupDecayLR: return kWarmupDecayLR;
    case SchedulerKind::kWarmupCosineLR: return kWarmupCosineLR;
    case SchedulerKind::kOneCycle: return kOneCycle;
    default: return {};
  }
}

}  // namespace anvil
