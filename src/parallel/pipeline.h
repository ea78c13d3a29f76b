// Pipeline parallelism's layout of the job: W ranks as P stages of D = W / P data-parallel ranks,
// rank = stage·D + d. A stage holds consecutive blocks (pipeline_stage_blocks) and is trained by
// its D ranks as data parallelism trains a whole model (DataParallel over the stage's group, on
// the stage's own parameter array); the ranks with the same d across the stages hold the same
// data and hand each microbatch's activations on (train/pipeline_schedule.h).
//
// What the stages must agree on, so that the weights are one process's to the bit: where the LM
// head is tied to the token embedding, the embedding unit lives on the first and the last stage,
// its fixed-point gradient is the exact sum of both, and its scale the larger of theirs; the
// verdict on a step (run again at a new scale, skip on overflow) is every stage's; and the global
// gradient norm sums the per-tensor integer squares in the whole model's tensor order
// (parallel/gradient_reduction.h).
#pragma once
#include <memory>
#include <vector>

#include "config/model_config.h"
#include "model/model.h"
#include "parallel/communicator.h"

namespace anvil {

// Stage s of P over n_layers blocks: the first n_layers % P stages hold one block more.
PipelineStage pipeline_stage_blocks(int n_layers, int stages, int stage);

struct PipelineGroups {
  int stages = 1, stage = 0;
  int data_ranks = 1, data_rank = 0;
  PipelineStage blocks;  // this rank's stage's
  std::unique_ptr<Communicator> data;      // the stage's D ranks
  std::unique_ptr<Communicator> pipeline;  // the P ranks with this rank's d, in stage order
  // The first and the last stage's ranks with this rank's d, where the LM head is tied to the
  // token embedding (both hold the embedding unit); null otherwise.
  std::unique_ptr<Communicator> tied;
  bool first() const { return stage == 0; }
  bool last() const { return stage + 1 == stages; }
};

// The groups of `stages` stages over world's ranks for cfg's model. Fails unless the world
// divides into the stages, each stage gets a block, and (with more than one stage) two threads
// may talk at once.
PipelineGroups make_pipeline_groups(Communicator& world, const ModelConfig& cfg, int stages);

// A stage model's parameters that no earlier stage holds (all but the last stage's copy of a tied
// embedding unit) are one range of the whole model's array: the stage's [first, n) is the whole
// model's [whole_first, whole_first + n - first).
struct StageSpan {
  size_t first = 0, whole_first = 0;
};
StageSpan stage_span(const Model& stage_model);
// The stage's part of a whole-model array (model_param_layout order), in the stage's order.
std::vector<float> stage_part(const Model& stage_model, const std::vector<float>& whole);
// The whole model's parameters (model_param_layout order, model_num_params floats) into whole on
// every rank of the pipeline group, from each stage's own: stage_params is the stage model's
// full array. A collective of groups.pipeline.
void gather_whole_params(const PipelineGroups& groups, const Model& stage_model, const float* stage_params,
                         float* whole);
// Per tensor: the stage's tensors' entries of a whole-model list (one per tensor).
std::vector<int> stage_tensor_part(const Model& stage_model, const std::vector<int>& whole);
// The reverse, a collective of the pipeline group: the whole model's list from every stage's
// entries (each tensor's from the first stage that holds it).
std::vector<int> whole_tensor_values(const PipelineGroups& groups, const Model& stage_model,
                                     const std::vector<int>& mine);

}  // namespace anvil
