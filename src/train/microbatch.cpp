#include "train/microbatch.h"

#include <algorithm>

#include "core/error.h"
#include "core/memory.h"
#include "device/device.h"
#include "model/model.h"
#include "train/step.h"

namespace anvil {
namespace {

std::string size_text(size_t bytes) {
  const double b = static_cast<double>(bytes);
  return b < (1 << 30) ? fmt::format("{:.1f} MiB", b / (1 << 20)) : fmt::format("{:.2f} GiB", b / (1 << 30));
}

}  // namespace

void resolve_batch_sizes(TrainConfig& c, int world) {
  if (c.gradient_accumulation_steps == 0 && c.global_train_batch_size > 0) return;  // anvil's rule
  int& global = c.global_train_batch_size;
  int& micro = c.device_train_microbatch_size;
  int& steps = c.gradient_accumulation_steps;
  if (global == 0) {
    steps = std::max(steps, 1);
    global = micro * steps * world;
  } else if (micro == 0) {
    steps = std::max(steps, 1);
    ANVIL_CHECK(global % (steps * world) == 0, "global_train_batch_size {} is not divisible by "
                "gradient_accumulation_steps {} x {} ranks", global, steps, world);
    micro = global / (steps * world);
  } else {
    ANVIL_CHECK(global == micro * steps * world, "global_train_batch_size {} (DeepSpeed's train_batch_size) must be "
                "device_train_microbatch_size {} x gradient_accumulation_steps {} x {} ranks = {}", global, micro,
                steps, world, micro * steps * world);
  }
  if (c.device_eval_batch_size == 0) c.device_eval_batch_size = micro;
}

MicrobatchPlan plan_microbatch(const TrainConfig& cfg, int local_batch, size_t model_bytes, int ranks_sharing,
                               const PipelineStage& stage, int held_microbatches, const ModelConfig* tensor_share) {
  MicrobatchPlan plan;
  const int T = cfg.max_seq_len;
  const bool gpu = cfg.kernels == KernelImpl::kGpu;
  // On the GPU, attention's scratch (scores and their gradient, one sequence's) and the GEMM
  // workspace come on top of the activations.
  const size_t gpu_scratch =
      gpu ? 2 * sizeof(float) * static_cast<size_t>(cfg.model.n_heads) * T * T + (size_t{32} << 20) : 0;
  // The ICL tasks' evaluation (icl_tasks) keeps prefixes beside the activations while it runs,
  // of up to max_seq_len tokens (a task's own max_seq_len may exceed icl_seq_len).
  ModelStorage storage = model_storage_for(cfg);
  storage.stage = stage;
  auto activations = [&](int microbatch, int eval_batch) {
    const int rows = std::max(microbatch, eval_batch);
    const ModelConfig& model = tensor_share ? *tensor_share : cfg.model;
    return gpu_scratch + held_microbatches * model_activation_bytes(model, rows, T, storage) +
           model_grain_grads_bytes(model, rows, storage) +
           (cfg.icl_tasks.empty() ? 0 : model_evaluation_bytes(cfg.model, rows, T));
  };
  const bool given = cfg.memory_limit > 0;
  plan.microbatch = std::min(cfg.device_train_microbatch_size, local_batch);
  const char* source = given ? "memory_limit" : gpu ? "the GPU memory free at start" : "the memory available at start";
  if (given || cfg.microbatch_auto) {
    // Without a limit: what the host (or, under kernels=gpu, the GPU) has free now (the model
    // states are already there), shared by the ranks on it, less a tenth for the data pipeline
    // and everything else.
    const size_t free_now = gpu ? gpu_free_bytes() : available_memory_bytes();
    plan.limit = given ? static_cast<size_t>(cfg.memory_limit)
                       : model_bytes + free_now / static_cast<size_t>(std::max(1, ranks_sharing)) / 10 * 9;
    ANVIL_CHECK(model_bytes < plan.limit, "the model states and working buffers need {} per rank, more than {} ({})",
                size_text(model_bytes), source, size_text(plan.limit));
  }
  const size_t budget = plan.limit - std::min(plan.limit, model_bytes);
  if (cfg.microbatch_auto) {
    // Activation memory grows with the microbatch: the largest that fits.
    plan.microbatch = 0;
    for (int mb = 1; mb <= local_batch; mb++)
      if (activations(mb, cfg.device_eval_batch_size) <= budget) plan.microbatch = mb;
    ANVIL_CHECK(plan.microbatch > 0, "device_train_microbatch_size auto: one sequence of {} tokens needs {} of "
                "activations{}, but {} of {} ({}) remain after the model states: {}raise memory_limit", T,
                size_text(activations(1, cfg.device_eval_batch_size)),
                cfg.device_eval_batch_size > 1 ? fmt::format(" (eval batch {})", cfg.device_eval_batch_size) : "",
                size_text(budget), source, size_text(plan.limit),
                cfg.activation_checkpointing ? "" : "set activation_checkpointing: true or ");
  }
  plan.eval_batch = cfg.device_eval_batch_size > 0 ? cfg.device_eval_batch_size : plan.microbatch;
  plan.activation_bytes = activations(plan.microbatch, plan.eval_batch);
  ANVIL_CHECK(!given || plan.activation_bytes <= budget, "memory_limit {}: the model states and working buffers "
              "({}) and the activations of a microbatch of {} ({}) do not fit: lower device_train_microbatch_size "
              "(or give auto){}", size_text(plan.limit), size_text(model_bytes), plan.microbatch,
              size_text(plan.activation_bytes), cfg.activation_checkpointing ? "" : ", or set activation_checkpointing: true");
  return plan;
}

}  // namespace anvil
