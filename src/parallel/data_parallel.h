// Data-parallel training with ZeRO stages 0-3, on anvil's collectives.
//
// Every rank runs the same model on its own block of the global batch. The flat parameter array
// is cut into W contiguous shards; rank r owns [lo, hi). By stage:
//   0  full parameters, gradients and optimizer state everywhere; each unit's gradient is
//      all-reduced as soon as the last microbatch's backward pass has finished with it.
//   1  as 0, but each unit's gradient is reduce-scattered, the optimizer state covers the shard
//      only, and the updated shards are all-gathered back into the full parameters.
//   2  as 1, and the full gradient never exists: the model accumulates into a working buffer per
//      unit, reduce-scattered into the gradient shard after every microbatch.
//   3  as 2, and parameters are sharded too: a unit is all-gathered just before use (the next
//      one is fetched ahead) and its buffer reused after. The embedding table, which the tied LM
//      head uses at both ends of the pass, keeps its own buffer.
// The gradients' and parameters' collectives during a step run on one communication thread, in
// the order the training thread issues them, so they overlap the backward pass and are issued
// identically on every rank (the step's end agrees on its verdict and norm on the training
// thread, once they are done).
// Every array lives in op memory (kernels/buffer.h): on the host, or on the GPU under
// kernels=gpu, where the same stages and the same fixed-point sums run on the device.
//
// Deterministic mode (the default): the model's per-sequence gradient contributions land in a
// float scratch buffer (the largest spans one op forms, Model::largest_grads_span: one sequence's,
// or on a GPU one per sequence of the microbatch) and each sequence's is rounded into int64
// fixed-point accumulators (kernels/fixed_point.h),
// which are what the stages above reduce (in integers: exact). The gradient norm is summed from
// the integers, and AdamW reads the rank's gradient from them too (kernels/optimizer.h): no fp32
// copy of the gradient exists in this mode. A step whose values outgrew the fixed-point scale is
// reported by finish_backward and must be run again (see fixed_point.h).
//
// DataParallel composes three parts over one ShardLayout (parallel/shard_layout.h): ParamShards
// (parallel/param_shards.h, the parameters and ZeRO-3's gathers), GradientReduction
// (parallel/gradient_reduction.h, the gradient sums, their reduction and norm) and AdamW over the
// rank's range; the two halves share the group and its communication thread
// (DataParallelContext). A model split into pipeline stages gives each stage its data-parallel
// group and its own part of the parameters, and these parts work the same on it
// (DataParallelOptions::pipeline); so does a rank's share of a tensor-parallel model
// (DataParallelOptions::tensor), and of a mixture of experts' experts
// (DataParallelOptions::experts).
#pragma once
#include <cstdint>
#include <vector>

#include "parallel/collectives.h"
#include "parallel/comm_thread.h"
#include "parallel/expert_parallel.h"
#include "parallel/communicator.h"
#include "device/device.h"
#include "parallel/gradient_reduction.h"
#include "parallel/op_collectives.h"
#include "parallel/param_shards.h"
#include "parallel/pipeline.h"
#include "parallel/shard_layout.h"
#include "parallel/tensor_parallel.h"
#include "kernels/buffer.h"
#include "model/model.h"
#include "optim/adamw.h"

namespace anvil {

struct DataParallelOptions {
  int zero_stage = 0;
  AllReduceAlgo algo = AllReduceAlgo::kAuto;
  // Gradients summed in fixed point (kernels/fixed_point.h): the same bits whatever the world size,
  // microbatch size, ZeRO stage or all-reduce algorithm. Off: fp32 sums, whose rounding depends
  // on how the batch is grouped.
  bool deterministic = true;
  int64_t global_batch = 1;       // sequences per optimizer step over all ranks (fixed-point range)
  bool bf16_compression = false;  // stage 0, not deterministic: gradients on the wire in bf16, with error feedback
  GpuCollectivesChoice gpu_collectives = GpuCollectivesChoice::kAuto;  // under kernels=gpu
  // The model is a pipeline stage and the group its data-parallel ranks (parallel/pipeline.h):
  // the stages' groups, through which the gradient reduction agrees with the other stages.
  // Deterministic mode, ZeRO-0/1 and host memory only. Null: the model is whole.
  const PipelineGroups* pipeline = nullptr;
  // The model is a rank's share of a tensor-parallel copy and the group its data-parallel ranks
  // (parallel/tensor_parallel.h): the tensor groups, through which the gradient reduction agrees
  // with the other shares (with pipeline too: a stage of the share). Deterministic mode only.
  // Null: the model is whole.
  const TensorGroups* tensor = nullptr;
  // The model is a rank's share of a mixture of experts' experts and the group the ranks holding
  // the same experts (parallel/expert_parallel.h): the expert groups, over which the rest of the
  // gradient is summed too (with pipeline too: a stage of the share). Deterministic mode, host
  // memory. Null: the model holds every expert.
  const ExpertGroups* experts = nullptr;
  // The whole model and the group of ranks sharing a copy of it: tensor's or experts', else null.
  const ModelConfig* whole_model() const;
  Communicator* share_group() const;
};

// Which arrays the model should allocate for itself under these options, and whether it must be
// microbatch-invariant (deterministic mode).
ModelStorage model_storage_for(const DataParallelOptions& options);

// Bytes per rank, as the trainer reports them.
struct MemoryReport {
  size_t params = 0, grads = 0, optimizer = 0;  // the model states
  size_t working = 0;                           // gathered units, gradient buffers, error feedback
  size_t model_states() const { return params + grads + optimizer; }
};

class DataParallel : public UnitAccess {
 public:
  // Takes over the model's unit access. The model must have been built with
  // model_storage_for(options).
  DataParallel(Communicator& comm, Model& model, const OptimizerConfig& optimizer, DataParallelOptions options);
  ~DataParallel() override;

  // The group it reduces and shards over: the data-parallel ranks, or under expert parallelism
  // those of them holding the same experts (not then the ranks that split the batch).
  Communicator& comm() { return comm_; }
  std::string collectives_description() const { return collectives_.description(); }
  const GpuSharing& gpu_sharing() const { return collectives_.sharing(); }
  int zero_stage() const { return opt_.zero_stage; }
  MemoryReport memory() const;
  // Sizes what follows the model's microbatch (deterministic training's scratch for a grain's
  // gradient spans, one per sequence on a GPU) after Model::set_max_batch.
  void fit_model_batch() { grads_.fit_scratch(); }

  // Initial parameters from the seed (each rank computes what it holds).
  void init_weights(uint64_t seed);

  // A step: begin_step, then per microbatch begin_microbatch + model.forward_backward, then
  // finish_backward, clip_and_norm, optimizer_step.
  void begin_step();
  void begin_microbatch(bool last) { grads_.begin_microbatch(last); }
  // The factor the loss was multiplied by in this step (amp_fp16's loss scale, a power of two;
  // 1 otherwise). Gradients are divided by it, exactly, on their way to the optimizer.
  void set_loss_scale(double scale);
  using Backward = GradientReduction::Backward;
  // The same answer on every rank. A non-finite gradient without loss scaling is an error (the
  // run diverged).
  Backward finish_backward();
  // The global gradient norm before clipping; the clipping it calls for is applied by
  // optimizer_step, as AdamW reads the gradient.
  double clip_and_norm(double max_norm);
  void optimizer_step(double lr);
  // Before anything else talks on the communicator (evaluation, scalars): no job in flight.
  void quiesce() { thread_.wait_all(); }

  // A copy of this rank's checkpoint shard: the rank-th of W even ranges [lo, hi) of the flat
  // parameters and optimizer moments (its ZeRO shard; under ZeRO-0, where every rank holds
  // everything, still only that range, so that the ranks share the writing). Moments null: the
  // parameters alone (what an evaluation needs).
  void copy_shard(size_t& lo, size_t& hi, std::vector<float>& params, std::vector<float>* exp_avg = nullptr,
                  std::vector<float>* exp_avg_sq = nullptr);
  int64_t optimizer_steps() const { return optimizer_.steps_taken(); }
  // The reverse, from full arrays (a checkpoint, whatever world size and stage saved it): each
  // rank keeps what its stage holds.
  void load_full_state(const std::vector<float>& params, const std::vector<float>& exp_avg,
                       const std::vector<float>& exp_avg_sq, int64_t optimizer_steps);

  // The fixed-point scale exponent of every parameter tensor (layout order): state the next
  // step depends on, kept in checkpoints so that a resumed run continues bit for bit.
  const std::vector<int>& grad_scales() const { return grads_.scales(); }
  void set_grad_scales(const std::vector<int>& scales);

  // UnitAccess: parameters from the shards (ParamShards), gradients to their reduction
  // (GradientReduction).
  const float* acquire_params(int unit, int next_unit) override { return params_.acquire(unit, next_unit); }
  void release_params(int unit) override { params_.release(unit); }
  float* grads(int unit, size_t offset, size_t count, int sequences) override {
    return grads_.grads(unit, offset, count, sequences);
  }
  float* grads_to_write(int unit, size_t offset, size_t count, int sequences) override {
    return grads_.grads_to_write(unit, offset, count, sequences);
  }
  void grain_done(int unit, size_t offset, size_t count, int sequences) override {
    grads_.grain_done(unit, offset, count, sequences);
  }
  void grain_rows(int unit, size_t offset, float* x, const int32_t* rows, const int32_t* rows_op, size_t n_rows,
                  size_t row_len) override {
    grads_.grain_rows(unit, offset, x, rows, rows_op, n_rows, row_len);
  }
  void grads_done(int unit) override { grads_.grads_done(unit); }

 private:
  // The optimizer's dtypes on freshly initialized or loaded weights and moments (AdamW::hold), the
  // rounded weights shared with the ranks that do not own them.
  void hold_optimizer_dtypes();
  Communicator& comm_;
  Model& model_;
  const DataParallelOptions opt_;
  const ShardLayout shards_;
  AdamW optimizer_;  // over [shards_.lo, shards_.hi)
  OpCollectives collectives_;
  const DataParallelContext ctx_;
  ParamShards params_;
  GradientReduction grads_;
  float clip_scale_ = 1.0f;  // from clip_and_norm, for the next optimizer_step
  // Last, so that it is the first to go: no job runs once the buffers it uses are freed.
  CommThread thread_;
};

}  // namespace anvil
