// The `scheduler` section: Composer's schedules (LLM Foundry's names) over t_warmup, t_max and
// alpha_f, or DeepSpeed's (deepspeed/runtime/lr_schedules.py: what a ds_config's scheduler block
// names) under DeepSpeed's parameter names and defaults.
#pragma once
#include <cstdint>
#include <span>

#include "config/choices.h"
#include "config/duration.h"

namespace anvil {

struct SchedulerConfig {
  SchedulerKind name = SchedulerKind::kCosineWithWarmup;
  Duration t_warmup = parse_duration("0ba", "scheduler.t_warmup");
  // Where the decay ends (Composer's t_max): "1dur" is max_duration. A run stopped early and
  // resumed to a longer max_duration keeps its schedule by naming the full length here.
  Duration t_max = parse_duration("1dur", "scheduler.t_max");
  double alpha_f = 0.0;

  // DeepSpeed's. WarmupLR and WarmupDecayLR rise from warmup_min_lr to warmup_max_lr (absolute
  // rates: optimizer.lr is not used), WarmupDecayLR then falls linearly back by total_num_steps;
  // WarmupCosineLR scales optimizer.lr from warmup_min_ratio up to 1, then down a cosine to
  // cos_min_ratio; OneCycle climbs from cycle_min_lr to cycle_max_lr in cycle_first_step_size
  // steps, descends in cycle_second_step_size, then changes by decay_lr_rate every
  // decay_step_size steps.
  double warmup_min_lr = 0.0, warmup_max_lr = 0.001;
  int64_t warmup_num_steps = 1000;
  WarmupType warmup_type = WarmupType::kLog;
  int64_t total_num_steps = 0;  // 0: the run's length (max_duration), as Hugging Face's "auto" resolves it
  double warmup_min_ratio = 0.0, cos_min_ratio = 0.0001;
  double cycle_min_lr = 0.0, cycle_max_lr = 0.0, decay_lr_rate = 0.0;
  int64_t cycle_first_step_size = 2000;
  int64_t cycle_second_step_size = 0;  // 0: cycle_first_step_size
  int64_t decay_step_size = 0;         // 0: no decay after the cycle

  bool is_deepspeed() const { return name >= SchedulerKind::kWarmupLR; }
};

// A parameter of DeepSpeed's schedules, declared once for the config's reader and writer and the
// ds_config translation: its key (DeepSpeed's name, and anvil's) and what it sets.
struct SchedulerParam {
  enum class Kind {
    kRate,         // *rate: a learning rate or a ratio, not negative
    kSteps,        // *steps: a count of steps, at least `least`
    kWarmupType,   // warmup_type
    kMomentumOff,  // OneCycle's cycle_momentum: anvil keeps the betas fixed, so it must be false
    kUnused,       // read by DeepSpeed, unused in its rate (OneCycle's stair counts)
  };
  const char* key;
  Kind kind;
  double SchedulerConfig::*rate = nullptr;
  int64_t SchedulerConfig::*steps = nullptr;
  int64_t least = 0;
};

// The parameters of a DeepSpeed schedule, in the order they are written; none for Composer's.
std::span<const SchedulerParam> scheduler_params(SchedulerKind kind);

}  // namespace anvil
