// Checkpoint directories: run_dir/checkpoints/step-NNNNNNNN/ holding manifest.json,
// model.safetensors and optimizer.safetensors, written under a temporary name, fsynced and
// renamed, with checkpoints/latest (the directory's name) written last. The manifest records the
// format version, the resolved config and its hash, the step, tokens seen, the data loader's
// state, the model shape and every tensor's shape and xxh3-64 checksum. A directory under its
// final name is complete; loading verifies every checksum.
#pragma once
#include <cstdint>
#include <exception>
#include <string>
#include <thread>
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
  // Deterministic training's fixed-point gradient scales, one per tensor (empty: not deterministic).
  std::vector<int> grad_scales;
};

// data_state: the train loader's DataState as JSON (where the data order stands). Returns the
// checkpoint directory.
std::string save_checkpoint(const std::string& run_dir, int64_t step, int64_t tokens_seen,
                            const TrainConfig& cfg, const CheckpointState& state, const std::string& data_state);

// Saves on a background thread from its own copy of the state, so that training stalls only for
// the copy, then prunes the run's checkpoints to the newest `keep` (-1: all). One save at a
// time: a new save (or wait) first finishes the previous one.
class CheckpointWriter {
 public:
  ~CheckpointWriter();
  void save(const std::string& run_dir, int64_t step, int64_t tokens_seen, const TrainConfig& cfg,
            std::vector<float> params, std::vector<float> exp_avg, std::vector<float> exp_avg_sq,
            int64_t optimizer_steps, std::vector<int> grad_scales, std::string data_state, int keep);
  // Waits for the save in flight; returns its directory and rethrows its error.
  std::string wait();

 private:
  std::thread thread_;
  std::string dir_;
  std::exception_ptr error_;
};

struct LoadedCheckpoint {
  std::string dir;            // the checkpoint directory read
  ModelConfig config;
  std::vector<float> params;  // flat, in gpt2_param_layout order
  int64_t step = 0, tokens_seen = 0;
  std::string data_state;     // JSON
  std::string config_yaml;    // the resolved config of the run that saved it
  // Filled when the optimizer state was asked for.
  std::vector<float> exp_avg, exp_avg_sq;
  int64_t optimizer_steps = 0;
  std::vector<int> grad_scales;  // empty when the run that saved it was not deterministic
};

// path: a checkpoint directory, a run directory, or its checkpoints/ directory (then the one
// `latest` names). Verifies the format version and every tensor's checksum; a damaged or
// incomplete checkpoint is an error naming what is wrong.
LoadedCheckpoint load_checkpoint(const std::string& path, bool with_optimizer);

// The complete checkpoint directories (step-*) of a run, newest first. Temporary directories of
// interrupted saves are not listed.
std::vector<std::string> list_checkpoints(const std::string& run_dir);

// Removes all but the newest `keep` checkpoints of a run (keep > 0), and leftovers of
// interrupted saves.
void prune_checkpoints(const std::string& run_dir, int keep);

// SHA-256 over every parameter tensor's float32 bytes in layout order: the same digest for the
// same weights however they were trained or sharded.
std::string weights_sha256(const ModelConfig& cfg, const float* params);

}  // namespace anvil
