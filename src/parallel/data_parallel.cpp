// ZeRO 0-3 over anvil's collectives; see data_parallel.h for what each stage keeps.
#include "parallel/data_parallel.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace anvil {

ModelStorage model_storage_for(const DataParallelOptions& options) {
  ModelStorage s;
  s.params = options.zero_stage < 3;
  // In deterministic mode the gradient lives in the fixed-point accumulators, which AdamW reads,
  // and is summed a sequence at a time (each sequence's contribution rounded on its own).
  s.grads = options.zero_stage < 2 && !options.deterministic;
  s.microbatch_invariant = options.deterministic;
  return s;
}

const ModelConfig* DataParallelOptions::whole_model() const {
  return tensor ? &tensor->model : experts ? &experts->model : nullptr;
}

Communicator* DataParallelOptions::share_group() const {
  return tensor ? &tensor->tensor->comm() : experts ? &experts->experts->comm() : nullptr;
}

namespace {

// The most bytes one collective of the step moves: a unit's gradient (int64 in deterministic mode)
// or its parameters.
size_t largest_collective_bytes(const std::vector<ParamUnit>& units) {
  size_t largest = 0;
  for (const ParamUnit& u : units) largest = std::max(largest, u.numel);
  return largest * sizeof(int64_t);
}

// The options, refused before anything is allocated for them where they cannot work together.
const DataParallelOptions& checked(const DataParallelOptions& o, Model& model) {
  ANVIL_CHECK(o.zero_stage >= 0 && o.zero_stage <= 3, "zero_stage {} is not valid: expected 0, 1, 2 or 3",
              o.zero_stage);
  ANVIL_CHECK(!o.bf16_compression || o.zero_stage == 0, "gradient compression (bf16) works with zero_stage 0 "
              "only; zero_stage {} reduce-scatters in fp32", o.zero_stage);
  ANVIL_CHECK(!o.bf16_compression || !o.deterministic, "gradient compression (bf16) rounds gradients on the "
              "wire, so it needs deterministic_mode: false");
  ANVIL_CHECK(o.global_batch >= 1, "global batch {} must be at least one sequence", o.global_batch);
  ANVIL_CHECK(!o.bf16_compression || model.kernels() != KernelImpl::kGpu,
              "gradient compression (bf16) runs on host memory: use kernels=cpu with it, or leave it off on the GPU");
  ANVIL_CHECK(!o.experts || (!o.tensor && o.deterministic && model.kernels() != KernelImpl::kGpu),
              "an expert share's gradients are reduced in deterministic mode, in host memory, and not under tensor "
              "parallelism");
  const ModelStorage want = model_storage_for(o);
  // (On a GPU an invariant model forms a gradient span per sequence, which only deterministic
  // mode's fixed-point sums take.)
  const bool invariant_ok = model.microbatch_invariant() ? o.deterministic || model.kernels() != KernelImpl::kGpu
                                                         : !o.deterministic;
  ANVIL_CHECK((model.params() != nullptr) == want.params && (model.grads() != nullptr) == want.grads && invariant_ok,
              "the model was not built for zero_stage {}{} (use model_storage_for)", o.zero_stage,
              o.deterministic ? " in deterministic mode" : "");
  return o;
}

}  // namespace

DataParallel::DataParallel(Communicator& comm, Model& model, const OptimizerConfig& optimizer,
                           DataParallelOptions options)
    : comm_(comm),
      model_(model),
      opt_(checked(options, model)),
      shards_(model, comm.size(), comm.rank(), opt_.zero_stage),
      optimizer_(model.kernels(), optimizer, model.tensors(), shards_.lo, shards_.hi),
      collectives_(comm, model.kernels(), largest_collective_bytes(model.units()), opt_.gpu_collectives),
      ctx_{comm_, model_, opt_, shards_, thread_, collectives_},
      params_(ctx_),
      grads_(ctx_),
      thread_(model.kernels()) {
  model_.set_unit_access(this);
}

DataParallel::~DataParallel() { model_.set_unit_access(nullptr); }

MemoryReport DataParallel::memory() const {
  MemoryReport m;
  m.optimizer = 2 * (shards_.hi - shards_.lo) * sizeof(float);
  params_.add_memory(m);
  grads_.add_memory(m);
  return m;
}

void DataParallel::set_grad_scales(const std::vector<int>& scales) { grads_.set_scales(scales); }

void DataParallel::init_weights(uint64_t seed) {
  params_.init(seed);
  hold_optimizer_dtypes();
}

void DataParallel::hold_optimizer_dtypes() {
  if (optimizer_.hold(params_.owned())) params_.share_update();
}

void DataParallel::begin_step() { grads_.begin_step(); }

void DataParallel::set_loss_scale(double scale) {
  int e = 0;
  ANVIL_CHECK(std::frexp(scale, &e) == 0.5, "loss scale {} is not a power of two", scale);
  grads_.set_loss_scale(scale, e - 1);
}

DataParallel::Backward DataParallel::finish_backward() { return grads_.finish_backward(optimizer_.steps_taken() + 1); }

double DataParallel::clip_and_norm(double max_norm) {
  const double norm = grads_.global_norm();
  clip_scale_ = clip_coefficient(norm, max_norm);
  return norm;
}

void DataParallel::optimizer_step(double lr) {
  if (opt_.deterministic)
    optimizer_.step(params_.owned(), grads_.owned_fixed(), grads_.step_scales(), lr, clip_scale_);
  else
    optimizer_.step(params_.owned(), grads_.owned_grads(), lr, clip_scale_);
  clip_scale_ = 1.0f;
  params_.share_update();
}

void DataParallel::copy_shard(size_t& lo, size_t& hi, std::vector<float>& params, std::vector<float>* exp_avg,
                              std::vector<float>* exp_avg_sq) {
  quiesce();
  lo = shards_.shard_lo;
  hi = shards_.shard_hi;
  params.resize(hi - lo);
  params_.copy_to_host(lo, hi, params.data());
  // The optimizer's moments cover [shards_.lo, shards_.hi): the shard, or everything under ZeRO-0.
  for (auto [to, from] : {std::pair{exp_avg, optimizer_.exp_avg()}, std::pair{exp_avg_sq, optimizer_.exp_avg_sq()}}) {
    if (!to) continue;
    to->resize(hi - lo);
    op_copy_to_host(model_.kernels(), to->data(), from + (lo - shards_.lo), (hi - lo) * sizeof(float));
  }
}

void DataParallel::load_full_state(const std::vector<float>& params, const std::vector<float>& exp_avg,
                                   const std::vector<float>& exp_avg_sq, int64_t optimizer_steps) {
  const size_t n = shards_.n, lo = shards_.lo, hi = shards_.hi;
  ANVIL_CHECK(params.size() == n && exp_avg.size() == n && exp_avg_sq.size() == n,
              "training state of {} parameters for a model of {}", params.size(), n);
  quiesce();
  params_.load(params.data());
  op_copy_from_host(model_.kernels(), optimizer_.exp_avg(), exp_avg.data() + lo, (hi - lo) * sizeof(float));
  op_copy_from_host(model_.kernels(), optimizer_.exp_avg_sq(), exp_avg_sq.data() + lo, (hi - lo) * sizeof(float));
  optimizer_.set_steps_taken(optimizer_steps);
  hold_optimizer_dtypes();
}

}  // namespace anvil
