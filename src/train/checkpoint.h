// Checkpoint directories: run_dir/checkpoints/step-NNNNNNNN/ holding manifest.json,
// model.safetensors and optimizer.safetensors, written under a temporary name and renamed, with
// checkpoints/latest (the directory's name) written last. The manifest records the format
// version, the resolved config and its hash, the step, tokens seen, the data loader's state, the
// model shape and every
// tensor's shape and xxh3-64 checksum.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config/train_config.h"
#include "model/gpt2.h"

namespace anvil {

constexpr int kCheckpointVersion = 2;

// The full training state to save: flat arrays in gpt2_param_layout order.
struct CheckpointState {
  const float* params = nullptr;
  const float* exp_avg = nullptr;
  const float* exp_avg_sq = nullptr;
  int64_t optimizer_steps = 0;
};

// data_state: the train loader's DataState as JSON (where the data order stands).
std::string save_checkpoint(const std::string& run_dir, int64_t step, int64_t tokens_seen,
                            const TrainConfig& cfg, const CheckpointState& state, const std::string& data_state);

struct LoadedModel {
  ModelConfig config;
  std::vector<float> params;  // flat, in gpt2_param_layout order
  int64_t step = 0;
  std::string dir;            // the checkpoint directory read
};

// path: a checkpoint directory, a run directory, or its checkpoints/ directory (then the one
// `latest` names). Verifies the format version and every tensor's checksum.
LoadedModel load_model_checkpoint(const std::string& path);

}  // namespace anvil
