#include "train/stack.h"

#include <algorithm>
#include <vector>

#include "model/tensor_parallel.h"
#include "parallel/collectives.h"
#include "train/step.h"

namespace anvil {

TrainingStack build_training_stack(TrainConfig& cfg, Communicator& comm, int local_batch, int seq_len,
                                   const std::function<void(Model&)>& set_base, const PipelineGroups* pipeline,
                                   TensorGroups* tensor, ExpertGroups* experts) {
  TrainingStack s;
  ModelStorage storage = model_storage_for(cfg);
  if (pipeline) storage.stage = pipeline->blocks;
  // Activations are sized once the memory the model states take is known.
  const ModelConfig model_cfg = tensor    ? tensor_share_config(cfg.model, tensor->ranks, tensor->rank)
                                : experts ? expert_share_config(cfg.model, experts->ranks, experts->rank)
                                          : cfg.model;
  // Each model of the stack (a pipeline's more below) exchanges through the rank's groups.
  auto join_groups = [&](Model& m) {
    if (tensor) m.set_tensor_exchange(tensor->tensor.get());
    if (experts) m.set_expert_exchange(experts->experts.get());
  };
  s.model = make_model(model_cfg, 1, seq_len, storage);
  Model& model = *s.model;
  join_groups(model);
  if (cfg.model.has_lora()) set_base(model);
  DataParallelOptions options = data_parallel_options(cfg);
  options.pipeline = pipeline;
  options.tensor = tensor;
  options.experts = experts;
  s.dp = std::make_unique<DataParallel>(comm, model, cfg.optimizer, options);
  const MemoryReport mem = s.dp->memory();
  // Ranks drawing on this rank's memory: the host's, or under kernels=gpu its GPU's.
  const int sharing = model.kernels() == KernelImpl::kGpu ? s.dp->gpu_sharing().on_my_gpu : comm.local_size();
  // A pipeline stage holds the activations of up to P - s microbatches at once.
  const int held = pipeline ? pipeline->stages - pipeline->stage : 1;
  s.plan = plan_microbatch(cfg, local_batch, mem.model_states() + mem.working + model.base_bytes(), sharing,
                           storage.stage, held, tensor ? &model_cfg : nullptr);
  int microbatch = s.plan.microbatch;
  // Every rank cuts its batch alike: ZeRO-2/3 communicate per microbatch, a pipeline's stages
  // pass microbatches on, and a tensor or expert group's ranks run each one together. The groups are the
  // axes of the job's grid, so the smallest along each in turn is the smallest of all.
  std::vector<Communicator*> groups = {&comm};
  if (pipeline) groups.push_back(pipeline->pipeline.get());
  if (tensor) groups.push_back(&tensor->tensor->comm());
  if (experts) groups.push_back(&experts->experts->comm());
  if (cfg.microbatch_auto)
    for (Communicator* group : groups)
      if (group->size() > 1)
        for (double choice : all_gather_values(*group, microbatch))
          microbatch = std::min(microbatch, static_cast<int>(choice));
  cfg.device_train_microbatch_size = microbatch;
  if (cfg.device_eval_batch_size <= 0) cfg.device_eval_batch_size = microbatch;
  const int max_batch = std::max(microbatch, cfg.device_eval_batch_size);
  model.set_max_batch(max_batch);
  s.dp->fit_model_batch();
  if (pipeline) {
    const int slots = std::min(held, (local_batch + microbatch - 1) / microbatch);
    storage.params = storage.grads = false;  // the stage's, through the unit access
    std::vector<std::unique_ptr<Model>> more;
    for (int k = 1; k < slots; k++) {
      more.push_back(make_model(model_cfg, microbatch, seq_len, storage));
      join_groups(*more.back());
    }
    s.pipeline = std::make_unique<PipelineSchedule>(*pipeline, std::move(more), model, *s.dp);
  }
  return s;
}

}  // namespace anvil
