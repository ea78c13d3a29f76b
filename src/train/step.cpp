// The optimizer step shared by `anvil train` and `anvil bench train`.
#include "train/step.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/crossentropy.h"

namespace anvil {

TrainStep::TrainStep(const TrainConfig& cfg, Gpt2& model, DataParallel& dp, const LrSchedule& schedule)
    : model_(model), dp_(dp), schedule_(schedule), microbatch_(cfg.device_train_microbatch_size),
      lr_(cfg.optimizer.lr), clip_(cfg.clipping_threshold) {}

StepResult TrainStep::run(const int32_t* tokens, const int32_t* targets, int batch, int seq_len, int64_t t) {
  StepResult r;
  const int64_t n = static_cast<int64_t>(batch) * seq_len;
  int64_t local_targets = 0;
  for (int64_t i = 0; i < n; i++) local_targets += targets[i] != kIgnoreIndex;
  Communicator& comm = dp_.comm();
  r.target_tokens = sum_exact(comm, local_targets);
  ANVIL_CHECK(r.target_tokens > 0, "step {}: every target of the batch is ignored", t);
  const float dloss = 1.0f / static_cast<float>(r.target_tokens);
  dp_.begin_step();
  double loss_sum = 0;
  for (int b0 = 0; b0 < batch; b0 += microbatch_) {
    const int mb = std::min(microbatch_, batch - b0);
    const size_t offset = static_cast<size_t>(b0) * seq_len;
    dp_.begin_microbatch(b0 + mb >= batch);
    loss_sum += model_.forward_backward(tokens + offset, targets + offset, mb, seq_len, dloss, nullptr);
  }
  dp_.finish_backward();
  r.loss = sum_in_rank_order(comm, loss_sum) / static_cast<double>(r.target_tokens);
  r.grad_norm = dp_.clip_and_norm(clip_);
  r.lr = lr_ * schedule_.multiplier(t);
  dp_.optimizer_step(r.lr);
  return r;
}

}  // namespace anvil
