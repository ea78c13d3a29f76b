// One optimizer step over a global batch. Each rank takes its block of the batch and cuts it
// into microbatches; the loss of every microbatch is weighted by 1 / (target tokens of the whole
// global batch, summed over ranks), so gradients are exact whatever the microbatch size or the
// world size (Composer's rule). Then the gradients are reduced, clipped by global norm, and
// AdamW updates (see parallel/data_parallel.h for who holds what under each ZeRO stage).
#pragma once
#include <cstdint>

#include "config/train_config.h"
#include "parallel/data_parallel.h"
#include "optim/schedule.h"
#include "train/loss_scaler.h"
#include "train/pipeline_schedule.h"

namespace anvil {

// The data-parallel options a config asks for (ZeRO stage, all-reduce, determinism).
DataParallelOptions data_parallel_options(const TrainConfig& cfg);
// What the model allocates and how it works for this config: model_storage_for its data-parallel
// options, with the config's activation checkpointing.
ModelStorage model_storage_for(const TrainConfig& cfg);

// Sums of per-token losses that do not depend on how sequences are grouped: each sequence's
// losses (B sequences of T tokens) are summed in token order and added in fixed point (2^-32).
int64_t fixed_point_loss_sum(const float* losses, int B, int T);
double fixed_point_loss_value(int64_t sum);

struct StepResult {
  double loss = 0;       // mean over the batch's target tokens
  double grad_norm = 0;  // before clipping
  double lr = 0;
  int64_t target_tokens = 0;
  double loss_scale = 1;  // amp_fp16: the scale the step ran at
  bool skipped = false;   // amp_fp16: the gradients overflowed, no update (see LossScaler)
  // A mixture of experts' (Model::MoeStats): the balancing loss training adds to the loss above (mean over
  // the target tokens, as the loss), and the fraction of the tokens' expert choices skipped.
  double balance_loss = 0, skipped_choices = 0;
  // Deterministic training: the gradients outgrew their fixed-point scale, so the step ran twice.
  bool ran_again = false;
};

class TrainStep {
 public:
  // Also sets the model's compute dtype from cfg.precision. batch: the data-parallel ranks, each
  // taking its block of the global batch (dp's group, but under expert parallelism the ranks of
  // every expert group, which hold different experts: the job's, or a pipeline stage's).
  // pipeline: when the model is a pipeline stage, the schedule that runs the step's microbatches
  // through the stages.
  TrainStep(const TrainConfig& cfg, Model& model, DataParallel& dp, Communicator& batch, const LrSchedule& schedule,
            PipelineSchedule* pipeline = nullptr);
  // tokens, targets: (batch, seq_len), this rank's block of the global batch; positions, when its
  // sequences hold packed examples (Model::forward_backward), else null. t: 0-based step. The
  // loss and the gradient norm returned are the global ones, the same on every rank.
  StepResult run(const int32_t* tokens, const int32_t* targets, int batch, int seq_len, int64_t t,
                 const int32_t* positions = nullptr);
  LossScaler& loss_scaler() { return scaler_; }

 private:
  Model& model_;
  DataParallel& dp_;
  Communicator& batch_;
  PipelineSchedule* pipeline_;
  LrSchedule schedule_;
  int microbatch_;
  double lr_, clip_;
  uint64_t seed_;  // of the run: dropout masks derive from it
  LossScaler scaler_;
};

}  // namespace anvil
