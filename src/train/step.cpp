// The optimizer step shared by `anvil train` and `anvil bench train`.
#include "train/step.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/log.h"
#include "kernels/crossentropy.h"
#include "kernels/fixed_point.h"
#include "parallel/collectives.h"

namespace anvil {

TrainStep::TrainStep(const TrainConfig& cfg, Model& model, DataParallel& dp, Communicator& batch,
                     const LrSchedule& schedule, PipelineSchedule* pipeline)
    : model_(model),
      dp_(dp),
      batch_(batch),
      pipeline_(pipeline),
      schedule_(schedule),
      microbatch_(cfg.device_train_microbatch_size),
      lr_(cfg.optimizer.lr), clip_(cfg.clipping_threshold), seed_(cfg.seed),
      scaler_(cfg.loss_scaler, cfg.precision == ComputeDtype::kFp16) {
  model_.set_compute_dtype(cfg.precision);
  if (pipeline_) pipeline_->set_compute_dtype(cfg.precision);
}

DataParallelOptions data_parallel_options(const TrainConfig& cfg) {
  const DistributedConfig& dc = cfg.distributed;
  DataParallelOptions o;
  o.zero_stage = dc.zero_stage;
  o.algo = dc.all_reduce;
  o.deterministic = cfg.deterministic_mode;
  o.global_batch = cfg.global_train_batch_size;
  o.bf16_compression = dc.grad_compression == GradCompression::kBf16;
  o.gpu_collectives = dc.gpu_collectives;
  return o;
}

ModelStorage model_storage_for(const TrainConfig& cfg) {
  ModelStorage s = model_storage_for(data_parallel_options(cfg));
  s.kernels = cfg.kernels;
  s.activation_checkpointing = cfg.activation_checkpointing;
  return s;
}

namespace {
constexpr int kLossFractionBits = 32;
}  // namespace

int64_t fixed_point_loss_sum(const float* losses, int B, int T) {
  int64_t sum = 0;
  for (int b = 0; b < B; b++) {
    double sequence = 0;
    for (int i = 0; i < T; i++) sequence += losses[static_cast<size_t>(b) * T + i];
    // A non-finite loss (an fp16 step that overflowed, reported by the caller) gives garbage here,
    // which must wrap rather than be undefined.
    sum = fixed_point_add(sum, std::llround(std::ldexp(sequence, kLossFractionBits)));
  }
  return sum;
}

double fixed_point_loss_value(int64_t sum) { return std::ldexp(static_cast<double>(sum), -kLossFractionBits); }

StepResult TrainStep::run(const int32_t* tokens, const int32_t* targets, int batch, int seq_len, int64_t t,
                          const int32_t* positions) {
  StepResult r;
  const int64_t n = static_cast<int64_t>(batch) * seq_len;
  int64_t local_targets = 0;
  for (int64_t i = 0; i < n; i++) local_targets += targets[i] != kIgnoreIndex;
  Communicator& comm = batch_;
  r.target_tokens = sum_exact(comm, local_targets);
  ANVIL_CHECK(r.target_tokens > 0, "step {}: every target of the batch is ignored", t);
  // amp_fp16: the loss is scaled (a power of two) and the gradients unscaled exactly on their way
  // into DataParallel, so the scale changes nothing but which values fp16 can hold.
  r.loss_scale = scaler_.scale();
  dp_.set_loss_scale(r.loss_scale);
  const float dloss = static_cast<float>(r.loss_scale / static_cast<double>(r.target_tokens));
  int64_t loss_fixed = 0, balance_fixed = 0, choices = 0, skipped_choices = 0;
  int nonfinite_loss = 0;
  DataParallel::Backward outcome = DataParallel::Backward::kDone;
  // A deterministic step whose gradients outgrew their fixed-point scale runs again at the scale
  // it measured, which fits by construction; a second overflow means the gradients changed
  // between identical passes, which is a bug.
  for (int attempt = 0;; attempt++) {
    ANVIL_CHECK(attempt < 2, "step {}: fixed-point gradients overflowed twice with the same data; the "
                "backward pass is not deterministic", t);
    dp_.begin_step();
    loss_fixed = balance_fixed = choices = skipped_choices = 0;
    nonfinite_loss = 0;
    // Rank r holds block r of the global batch: its sequences' global indices key the dropout.
    const Model::DropoutPosition at{seed_, t, static_cast<int64_t>(comm.rank()) * batch};
    // Per block and sequence, as the losses per sequence: no microbatch or stage changes a bit.
    auto take_moe = [&](const Model::MoeStats& moe) {
      for (double b : moe.balance)
        balance_fixed = fixed_point_add(balance_fixed, std::llround(std::ldexp(b, kLossFractionBits)));
      choices += moe.choices;
      skipped_choices += moe.skipped;
    };
    if (pipeline_) {
      pipeline_->train(
          tokens, targets, positions, batch, seq_len, microbatch_, dloss, at,
          [&](const float* losses, int n, double sum) {
            nonfinite_loss |= !std::isfinite(sum);
            loss_fixed = fixed_point_add(loss_fixed, fixed_point_loss_sum(losses, n, seq_len));
          },
          take_moe);
    }
    for (int b0 = 0; b0 < batch && !pipeline_; b0 += microbatch_) {
      const int mb = std::min(microbatch_, batch - b0);
      const size_t offset = static_cast<size_t>(b0) * seq_len;
      dp_.begin_microbatch(b0 + mb >= batch);
      model_.set_dropout_position({at.seed, at.step, at.first_sample + b0});
      const double sum = model_.forward_backward(tokens + offset, targets + offset, mb, seq_len, dloss, nullptr,
                                                 positions ? positions + offset : nullptr);
      nonfinite_loss |= !std::isfinite(sum);
      loss_fixed = fixed_point_add(loss_fixed, fixed_point_loss_sum(model_.losses(), mb, seq_len));
      if (model_.config().has_moe()) take_moe(model_.moe_stats());
    }
    outcome = dp_.finish_backward();
    if (outcome != DataParallel::Backward::kRunAgain) break;
    r.ran_again = true;
    log_info("step {}: gradients outgrew their fixed-point scale; running the step again at the new scale", t);
  }
  if (pipeline_) {  // the loss is the last stage's
    int64_t loss[2] = {loss_fixed, nonfinite_loss};
    pipeline_->share_from_last(loss, sizeof loss);
    loss_fixed = loss[0];
    nonfinite_loss = static_cast<int>(loss[1]);
  }
  r.loss = sum_exact(comm, nonfinite_loss) > 0
               ? std::numeric_limits<double>::quiet_NaN()
               : fixed_point_loss_value(sum_exact(comm, loss_fixed)) / static_cast<double>(r.target_tokens);
  if (model_.config().has_moe()) {
    int64_t moe[3] = {balance_fixed, choices, skipped_choices};
    all_reduce(comm, moe, 3);
    if (pipeline_) pipeline_->sum_over_stages(moe, 3);  // each stage's blocks'
    r.balance_loss = fixed_point_loss_value(moe[0]) / static_cast<double>(r.target_tokens);
    r.skipped_choices = static_cast<double>(moe[2]) / static_cast<double>(std::max<int64_t>(1, moe[1]));
  }
  r.lr = schedule_.lr(t, dp_.optimizer_steps(), lr_);
  r.skipped = outcome == DataParallel::Backward::kOverflow;
  scaler_.update(r.skipped, t + 1);
  if (r.skipped) return r;  // no update; the scaler has backed off
  r.grad_norm = dp_.clip_and_norm(clip_);
  dp_.optimizer_step(r.lr);
  return r;
}

}  // namespace anvil
