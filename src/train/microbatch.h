// The memory plan of one rank: `memory_limit` checked at start, and the microbatch that
// `device_train_microbatch_size: auto` picks. Gradients are exact whatever the microbatch size
// (Composer's rule, summed in fixed point), so the choice changes speed and memory, never the
// numbers: the microbatch is picked from a memory model before training, not by running out of
// memory and retrying.
#pragma once
#include <cstddef>

#include "config/train_config.h"
#include "model/model.h"

namespace anvil {

// Applies DeepSpeed's batch rule for `world` ranks (TrainConfig::global_train_batch_size): fills
// in the size not given, or fails naming the three when they disagree. A run-time resolution, as
// the world size is known only once the ranks are.
void resolve_batch_sizes(TrainConfig& cfg, int world);

struct MicrobatchPlan {
  int microbatch = 0;           // sequences per forward/backward
  int eval_batch = 0;           // sequences per eval forward
  size_t limit = 0;             // bytes this rank may hold (0: no limit given, and none needed)
  size_t activation_bytes = 0;  // what the model will allocate for max(microbatch, eval_batch), and
                                // under kernels=gpu the ops' scratch; with icl_tasks, what their
                                // evaluation keeps besides (model_evaluation_bytes)
};

// local_batch: this rank's sequences per step; model_bytes: what the rank holds besides
// activations; ranks_sharing: how many ranks share this rank's memory, the host's or under
// kernels=gpu its GPU's (for the default limit); stage: the blocks the rank runs, of which it
// holds the activations of held_microbatches microbatches at once (a pipeline stage's models);
// tensor_share: the rank's share of the model under tensor parallelism (tensor_share_config),
// whose activations it holds (null: cfg.model's). Errors name the limit and what does not fit in
// it.
MicrobatchPlan plan_microbatch(const TrainConfig& cfg, int local_batch, size_t model_bytes, int ranks_sharing,
                               const PipelineStage& stage = {}, int held_microbatches = 1,
                               const ModelConfig* tensor_share = nullptr);

}  // namespace anvil
