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
#include "optim/adamw.h"

namespace anvil {

constexpr int kCheckpointVersion = 2;

// data_state: the train loader's DataState as JSON (where the data order stands).
std::string save_checkpoint(const std::string& run_dir, int64_t step, int64_t tokens_seen,
                            const TrainConfig& cfg, const Gpt2& model, AdamW& optimizer,
                            const std::string& data_state);

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
