// The training stack, built in one place for `anvil train` and `anvil bench train`: the model (or
// this rank's pipeline stage of it), the parallelism that owns its parameter access (data
// parallelism with its ZeRO stage, and the pipeline schedule),
// and the microbatch, planned from the memory the two hold. Weights, a resumed state and the step
// are the caller's: they differ between a run and a benchmark.
#pragma once
#include <functional>
#include <memory>

#include "config/train_config.h"
#include "model/model.h"
#include "parallel/communicator.h"
#include "parallel/data_parallel.h"
#include "train/microbatch.h"
#include "train/pipeline_schedule.h"

namespace anvil {

struct TrainingStack {
  std::unique_ptr<Model> model;
  std::unique_ptr<DataParallel> dp;
  std::unique_ptr<PipelineSchedule> pipeline;  // when the model is a pipeline stage
  MicrobatchPlan plan;
};

// The stack for cfg's model over comm, for local_batch sequences of seq_len tokens per rank.
// set_base (under LoRA) gives the model its frozen base before the microbatch is planned, since
// the base's memory counts. Resolves cfg.device_train_microbatch_size (the plan's, the smallest of
// any rank's under auto: every rank must cut its batch alike, as ZeRO-2/3 communicate per
// microbatch) and cfg.device_eval_batch_size (the microbatch unless given), and sizes the
// model's activations for the larger. With pipeline groups, the model is this rank's stage, comm
// its data-parallel group, and the stack has the schedule that runs the stages (the microbatch
// the smallest of every rank's).
// With tensor groups, the model is this rank's share of a copy (model/tensor_parallel.h), or of
// its pipeline stage, set to chain its products through the group, and comm the share's
// data-parallel group. With expert groups, the model is this rank's share of the experts
// (expert_share_config), set to exchange rows through the group, and comm the ranks holding the
// same experts.
TrainingStack build_training_stack(TrainConfig& cfg, Communicator& comm, int local_batch, int seq_len,
                                   const std::function<void(Model&)>& set_base,
                                   const PipelineGroups* pipeline = nullptr, TensorGroups* tensor = nullptr,
                                   ExpertGroups* experts = nullptr);

}  // namespace anvil
