// Checkpoint directories: run_dir/checkpoints/step-NNNNNNNN/ holding manifest.json and one
// safetensors file per rank's shard, written under a temporary name, fsynced and renamed, with
// checkpoints/latest (the directory's name) written last. The manifest records the format
// version, the resolved config and its hash, the step, tokens seen, the data loader's state, the
// model shape, every tensor's logical shape, the shard layout with every piece's xxh3-64
// checksum, and a SHA-256 of the weights. A directory under its final name is complete; loading
// verifies every checksum and reassembles whole tensors, so any world size and ZeRO stage can
// load what any other saved (docs/formats.md).
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/train_config.h"

namespace anvil {

constexpr int kCheckpointVersion = 3;

// One rank's part of the training state: the flat range [lo, hi) (model_param_layout order) of
// the parameters and both AdamW moments. Rank r of W saves the r-th of W even ranges, which is
// its ZeRO shard; under ZeRO-0 it is still only that range, so every rank writes 1/W.
struct CheckpointShard {
  int rank = 0, world = 1;
  size_t lo = 0, hi = 0;
  std::vector<float> params, exp_avg, exp_avg_sq;  // hi - lo values each
};

// The frozen base a LoRA checkpoint's adapters belong to: where it was loaded from (an absolute
// path: a transformers directory or an anvil checkpoint) and weights_sha256 of its weights.
struct LoraBaseRef {
  std::string path, weights_sha256;
};

// What the manifest records besides the tensors.
struct CheckpointInfo {
  int64_t step = 0, tokens_seen = 0, optimizer_steps = 0;
  std::vector<int> grad_scales;  // deterministic runs: the fixed-point gradient scales (else empty)
  std::string data_state;        // the train loader's DataState as JSON
  std::string loss_scaler;       // amp_fp16: the LossScaler's state as JSON (else empty)
  LoraBaseRef lora_base;         // a LoRA run's (else empty)
};

// The steps of a save into a checkpoints directory (a run's RUN_DIR/checkpoints, or its
// save_folder), which train/checkpoint_writer.h runs on every rank:
// CHECKPOINTS/.step-NNNNNNNN.tmp, where the shards are written before the rename.
std::string checkpoint_temp_dir(const std::string& checkpoints_dir, int64_t step);
// This rank's shard-RRRRR-of-WWWWW.safetensors (pieces of the tensors it covers, 1-D, named as in
// the model, exp_avg.NAME, exp_avg_sq.NAME) and shard-RRRRR.json (each piece's offset, length
// and checksum), each written and fsynced.
// bytes_written (may be null) counts the tensor bytes written so far, for a progress bar.
void write_checkpoint_shard(const std::string& temp_dir, const ModelConfig& model, const CheckpointShard& shard,
                            int64_t step, std::atomic<int64_t>* bytes_written = nullptr);
// Rank 0, once every shard is written: the manifest (with the weights' digest, read back from the
// shards), fsync, rename to step-NNNNNNNN, then `latest`. Returns the checkpoint directory.
std::string finalize_checkpoint(const std::string& checkpoints_dir, int world, const TrainConfig& cfg,
                                const CheckpointInfo& info);

struct LoadedCheckpoint {
  std::string dir;            // the checkpoint directory read
  ModelConfig config;
  std::vector<float> params;  // flat, in model_param_layout order
  int64_t step = 0, tokens_seen = 0;
  std::string data_state;     // JSON
  std::string config_yaml;    // the resolved config of the run that saved it
  // Filled when the optimizer state was asked for.
  std::vector<float> exp_avg, exp_avg_sq;
  int64_t optimizer_steps = 0;
  std::vector<int> grad_scales;  // empty when the run that saved it was not deterministic
  int saved_world_size = 1;      // the number of ranks that saved it: one shard file each
  std::string loss_scaler;       // JSON; empty when the run that saved it was not amp_fp16
  LoraBaseRef lora_base;         // of a LoRA checkpoint, which holds the adapters alone
  std::string weights_sha256;    // as the manifest records it (loading checks the weights against it)
};

// path: a checkpoint directory, a run directory, or its checkpoints/ directory (then the one
// `latest` names). Verifies the format version, every piece's checksum, that the shards tile the
// parameters, and the reassembled weights against the manifest's SHA-256; a damaged or incomplete
// checkpoint is an error naming what is wrong. show_progress: a progress bar of the bytes read.
LoadedCheckpoint load_checkpoint(const std::string& path, bool with_optimizer, bool show_progress = false);

// A checkpoint's weights tensor by tensor, for tools that must not hold them all (export of a
// model larger than one machine's memory): each tensor is reassembled from the pieces of the
// shards that cover it, every piece verified against its checksum when read.
class CheckpointTensorReader {
 public:
  explicit CheckpointTensorReader(const std::string& path);  // as load_checkpoint's path
  ~CheckpointTensorReader();
  // Everything load_checkpoint gives but the parameters and moments.
  const LoadedCheckpoint& info() const;
  // The whole tensor `name` of model_param_layout(info().config).
  std::vector<float> tensor(const std::string& name);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The complete checkpoint directories (step-*) in a checkpoints directory, newest first.
// Temporary directories of interrupted saves are not listed.
std::vector<std::string> list_checkpoints(const std::string& checkpoints_dir);

// Removes all but the newest `keep` checkpoints of a checkpoints directory (keep > 0), and
// leftovers of interrupted saves.
void prune_checkpoints(const std::string& checkpoints_dir, int keep);

// SHA-256 over every parameter tensor's float32 bytes in layout order: the same digest for the
// same weights however they were trained or sharded.
std::string weights_sha256(const ModelConfig& cfg, const float* params);

}  // namespace anvil
