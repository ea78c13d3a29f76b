// `anvil bench train`: the training step of a config on synthetic tokens, timed after warm-up,
// reported as tokens/s, achieved GFLOP/s and MFU against this machine's measured GEMM peak.
#pragma once
#include <string>
#include <vector>

#include "config/train_config.h"
#include "kernels/profile.h"

namespace anvil {

struct BenchTrainResult {
  double tokens_per_s = 0, gflops = 0, peak_gflops = 0, mfu = 0, peak_rss_mib = 0, final_loss = 0;
  double activation_mib = 0;  // the model's activation buffers, included in peak_rss_mib
  // The model states: parameters, gradients and optimizer state as data parallelism holds them
  // (under LoRA the adapters'), and LoRA's frozen base.
  double model_states_mib = 0, frozen_base_mib = 0;
  int microbatch = 0;         // the one used (auto resolved)
  std::string peak_source;    // what the peak was measured on (the matmul backend)
  double gpu_peak_mib = 0;    // kernels=gpu: the most GPU memory the allocator held
  double step_ms = 0;         // mean time of a timed step
  // The ranks sharing the model (distributed.tensor_parallel × distributed.pipeline_parallel ×
  // distributed.expert_parallel: the speed is the copy's, MFU against the ranks' peaks together,
  // the memory figures above this rank's) and this one; and every rank's memory, on every rank.
  // The experts' ranks each take their block of the batch, as in training.
  int ranks = 1, rank = 0;
  int tensor_parallel = 1, pipeline_parallel = 1, expert_parallel = 1;
  double all_to_all_mib = 0;  // under expert parallelism: the MiB the ranks sent each other a step
  double bubble = 0;  // under pipeline stages: the share of a step's microbatch slots a stage idles
  // Timed steps that ran twice (StepResult::ran_again), which the speed above includes.
  int steps_run_again = 0;
  struct RankMemory {
    double peak_rss_mib, activation_mib, model_states_mib;
  };
  std::vector<RankMemory> per_rank;
  std::vector<OpTime> profile;  // with profile: the timed steps' time per op
};

// profile: time every op of the timed steps (kernels/profile.h), which slows them a little.
BenchTrainResult bench_train(const TrainConfig& cfg, int warmup_steps, int steps, bool profile);
// The figures as one JSON line for scripts, with the run's shape, precision and the model's
// architecture options, so that a comparison (bench/train_vs_pytorch.sh) builds the same model.
std::string bench_train_json(const TrainConfig& cfg, const BenchTrainResult& r, int steps);

}  // namespace anvil
