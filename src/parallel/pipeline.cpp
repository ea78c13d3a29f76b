#include "parallel/pipeline.h"

#include <numeric>

#include "core/error.h"
#include "parallel/collectives.h"

namespace anvil {

PipelineStage pipeline_stage_blocks(int n_layers, int stages, int stage) {
  ANVIL_CHECK(stages >= 1 && stages <= n_layers && stage >= 0 && stage < stages,
              "stage {} of {} pipeline stages over {} blocks", stage, stages, n_layers);
  const int base = n_layers / stages, extra = n_layers % stages;
  PipelineStage s;
  s.first_layer = stage * base + std::min(stage, extra);
  s.end_layer = s.first_layer + base + (stage < extra ? 1 : 0);
  return s;
}

PipelineGroups make_pipeline_groups(Communicator& world, const ModelConfig& cfg, int stages) {
  const int W = world.size();
  ANVIL_CHECK(stages >= 1 && W % stages == 0, "distributed.pipeline_parallel {} does not divide the {} ranks: each "
              "stage is trained by world / pipeline_parallel ranks", stages, W);
  ANVIL_CHECK(stages <= cfg.n_layers, "distributed.pipeline_parallel {} stages for a model of {} blocks", stages,
              cfg.n_layers);
  ANVIL_CHECK(stages == 1 || world.threads_may_talk_at_once(), "distributed.pipeline_parallel sends activations "
              "while gradients are reduced, from two threads at once, and this MPI library does not provide "
              "MPI_THREAD_MULTIPLE");
  PipelineGroups g;
  g.stages = stages;
  g.data_ranks = W / stages;
  g.stage = world.rank() / g.data_ranks;
  g.data_rank = world.rank() % g.data_ranks;
  g.blocks = pipeline_stage_blocks(cfg.n_layers, stages, g.stage);
  std::vector<int> data, pipeline;
  for (int d = 0; d < g.data_ranks; d++) data.push_back(g.stage * g.data_ranks + d);
  for (int s = 0; s < stages; s++) pipeline.push_back(s * g.data_ranks + g.data_rank);
  g.data = make_group_communicator(world, data);
  g.pipeline = make_group_communicator(world, pipeline);
  if (stages > 1 && cfg.tied_embeddings && (g.first() || g.last()))
    g.tied = make_group_communicator(world, {pipeline.front(), pipeline.back()});
  return g;
}

StageSpan stage_span(const Model& stage_model) {
  const std::vector<ParamTensor> whole = model_param_layout(stage_model.config());
  for (const ParamTensor& t : stage_model.tensors()) {
    // A stage after the first holds the embedding unit only as the tied head's copy.
    if (stage_model.stage().first_layer > 0 && whole[t.index].unit == 0) continue;
    return {t.offset, whole[t.index].offset};
  }
  ANVIL_FAIL("a pipeline stage of no parameters of its own");
}

std::vector<float> stage_part(const Model& stage_model, const std::vector<float>& whole) {
  const std::vector<ParamTensor> layout = model_param_layout(stage_model.config());
  const size_t n = layout.back().offset + layout.back().numel;
  ANVIL_CHECK(whole.size() == n, "training state of {} parameters for a model of {}", whole.size(), n);
  std::vector<float> out(stage_model.num_params());
  for (const ParamTensor& t : stage_model.tensors()) {
    const auto from = whole.begin() + static_cast<std::ptrdiff_t>(layout[t.index].offset);
    std::copy(from, from + static_cast<std::ptrdiff_t>(t.numel), out.begin() + static_cast<std::ptrdiff_t>(t.offset));
  }
  return out;
}

void gather_whole_params(const PipelineGroups& groups, const Model& stage_model, const float* stage_params,
                         float* whole) {
  const StageSpan span = stage_span(stage_model);
  const size_t mine = stage_model.num_params() - span.first;
  std::vector<size_t> counts;
  for (double n : all_gather_values(*groups.pipeline, static_cast<double>(mine)))
    counts.push_back(static_cast<size_t>(n));
  // The stages' spans follow one another in the whole model's order.
  size_t before = 0;
  for (int s = 0; s < groups.stage; s++) before += counts[s];
  ANVIL_CHECK(before == span.whole_first, "stage {} starts at parameter {} of the whole model, after the earlier "
              "stages' {}", groups.stage, span.whole_first, before);
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  ANVIL_CHECK(total == model_num_params(stage_model.config()), "the stages hold {} parameters of a model of {}", total,
              model_num_params(stage_model.config()));
  std::copy(stage_params + span.first, stage_params + stage_model.num_params(), whole + span.whole_first);
  all_gather(*groups.pipeline, whole, counts);
}

std::vector<int> stage_tensor_part(const Model& stage_model, const std::vector<int>& whole) {
  const size_t K = model_param_layout(stage_model.config()).size();
  ANVIL_CHECK(whole.size() == K, "{} values for a model of {} tensors", whole.size(), K);
  std::vector<int> out;
  for (const ParamTensor& t : stage_model.tensors()) out.push_back(whole[t.index]);
  return out;
}

std::vector<int> whole_tensor_values(const PipelineGroups& groups, const Model& stage_model,
                                     const std::vector<int>& mine) {
  ANVIL_CHECK(mine.size() == stage_model.tensors().size(), "{} values for a stage of {} tensors", mine.size(),
              stage_model.tensors().size());
  const size_t K = model_param_layout(stage_model.config()).size();
  struct Entry {
    int32_t value, held;
  };
  std::vector<Entry> all(K * groups.stages, Entry{0, 0});
  Entry* block = all.data() + K * groups.stage;
  for (size_t k = 0; k < mine.size(); k++) block[stage_model.tensors()[k].index] = {mine[k], 1};
  all_gather_blocks(*groups.pipeline, all.data(), K * sizeof(Entry));
  std::vector<int> whole(K, 0);
  for (size_t w = 0; w < K; w++)
    for (int s = groups.stages - 1; s >= 0; s--)
      if (all[K * s + w].held) whole[w] = all[K * s + w].value;
  return whole;
}

}  // namespace anvil
