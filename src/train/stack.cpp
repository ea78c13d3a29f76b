#include "train/stack.h"

#include <algorithm>

#include "parallel/collectives.h"
#include "train/step.h"

namespace anvil {

TrainingStack build_training_stack(TrainConfig& cfg, Communicator& comm, int local_batch, int seq_len,
                                   const std::function<void(Model&)>& set_base) {
  TrainingStack s;
  // Activations are sized once the memory the model states take is known.
  s.model = make_model(cfg.model, 1, seq_len, model_storage_for(cfg));
  Model& model = *s.model;
  if (cfg.model.has_lora()) set_base(model);
  s.dp = std::make_unique<DataParallel>(comm, model, cfg.optimizer, data_parallel_options(cfg));
  const MemoryReport mem = s.dp->memory();
  // Ranks drawing on this rank's memory: the host's, or under kernels=gpu its GPU's.
  const int sharing = model.kernels() == KernelImpl::kGpu ? s.dp->gpu_sharing().on_my_gpu : comm.local_size();
  s.plan = plan_microbatch(cfg, local_batch, mem.model_states() + mem.working + model.base_bytes(), sharing);
  int microbatch = s.plan.microbatch;
  if (cfg.microbatch_auto && comm.size() > 1)
    for (double choice : all_gather_values(comm, s.plan.microbatch))
      microbatch = std::min(microbatch, static_cast<int>(choice));
  cfg.device_train_microbatch_size = microbatch;
  if (cfg.device_eval_batch_size <= 0) cfg.device_eval_batch_size = microbatch;
  model.set_max_batch(std::max(microbatch, cfg.device_eval_batch_size));
  return s;
}

}  // namespace anvil
