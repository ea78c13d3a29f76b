// ZeRO 0-3 over anvil's collectives; see data_parallel.h for what each stage keeps.
#include "parallel/data_parallel.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/buffer.h"
#include "kernels/encoder.h"
#include "kernels/fixed_point.h"
#include "kernels/impl.h"
#include "kernels/optimizer.h"
#include "kernels/residual.h"

namespace anvil {

ModelStorage model_storage_for(const DataParallelOptions& options) {
  ModelStorage s;
  s.params = options.zero_stage < 3;
  // In deterministic mode the gradient lives in the fixed-point accumulators, which AdamW reads,
  // and is summed a sequence at a time.
  s.grads = options.zero_stage < 2 && !options.deterministic;
  s.microbatch_invariant = options.deterministic;
  return s;
}

namespace {

// The part of [a, a + n) inside each rank's shard, in rank order.
std::vector<size_t> split_by_shards(size_t a, size_t n, const std::vector<size_t>& shard_counts) {
  std::vector<size_t> out(shard_counts.size(), 0);
  size_t shard_lo = 0;
  for (size_t r = 0; r < shard_counts.size(); r++) {
    const size_t shard_hi = shard_lo + shard_counts[r];
    const size_t lo = std::max(a, shard_lo), hi = std::min(a + n, shard_hi);
    out[r] = hi > lo ? hi - lo : 0;
    shard_lo = shard_hi;
  }
  return out;
}

// The most bytes one collective of the step moves: a unit's gradient (int64 in deterministic mode)
// or its parameters.
size_t largest_collective_bytes(const std::vector<ParamUnit>& units) {
  size_t largest = 0;
  for (const ParamUnit& u : units) largest = std::max(largest, u.numel);
  return largest * sizeof(int64_t);
}

// Rank r's contiguous shard; under stage 0 every rank holds and updates everything.
std::pair<size_t, size_t> owned_range(const std::vector<size_t>& shard_counts, int rank, int zero_stage) {
  size_t lo = 0;
  for (int r = 0; r < rank; r++) lo += shard_counts[r];
  if (zero_stage == 0) {
    size_t n = 0;
    for (size_t c : shard_counts) n += c;
    return {0, n};
  }
  return {lo, lo + shard_counts[rank]};
}

}  // namespace

DataParallel::DataParallel(Communicator& comm, Model& model, const OptimizerConfig& optimizer,
                           DataParallelOptions options)
    : comm_(comm), model_(model), opt_(options), units_(model.units()), n_(model.num_params()),
      shard_counts_(even_counts(n_, comm.size())),
      lo_(owned_range(shard_counts_, comm.rank(), options.zero_stage).first),
      hi_(owned_range(shard_counts_, comm.rank(), options.zero_stage).second),
      optimizer_(optimizer, model.tensors(), lo_, hi_), collectives_(comm, largest_collective_bytes(units_), options.gpu_collectives),
      tensors_(model.tensors()) {
  ANVIL_CHECK(opt_.zero_stage >= 0 && opt_.zero_stage <= 3, "zero_stage {} is not valid: expected 0, 1, 2 or 3",
              opt_.zero_stage);
  ANVIL_CHECK(!opt_.bf16_compression || opt_.zero_stage == 0, "gradient compression (bf16) works with zero_stage 0 "
              "only; zero_stage {} reduce-scatters in fp32", opt_.zero_stage);
  ANVIL_CHECK(!opt_.bf16_compression || !opt_.deterministic, "gradient compression (bf16) rounds gradients on the "
              "wire, so it needs deterministic_mode: false");
  ANVIL_CHECK(opt_.global_batch >= 1, "global batch {} must be at least one sequence", opt_.global_batch);
  ANVIL_CHECK(!opt_.bf16_compression || kernel_impl() != KernelImpl::kGpu,
              "gradient compression (bf16) runs on host memory: use kernels=cpu with it, or leave it off on the GPU");
  const ModelStorage want = model_storage_for(opt_);
  ANVIL_CHECK((model.params() != nullptr) == want.params && (model.grads() != nullptr) == want.grads &&
                  (model.microbatch_invariant() || !opt_.deterministic),
              "the model was not built for zero_stage {}{} (use model_storage_for)", opt_.zero_stage,
              opt_.deterministic ? " in deterministic mode" : "");
  for (const ParamUnit& u : units_) unit_counts_.push_back(split_by_shards(u.offset, u.numel, shard_counts_));
  size_t largest_other = 0;
  for (size_t u = 1; u < units_.size(); u++) largest_other = std::max(largest_other, units_[u].numel);
  if (opt_.zero_stage >= 2) {
    if (opt_.deterministic) {
      fixed_shard_.assign_zeros(hi_ - lo_);
      emb_grads_.fixed.assign_zeros(units_[0].numel);
      for (Slot& s : block_grads_) s.fixed.assign_zeros(largest_other);
    } else {
      grad_shard_.assign_zeros(hi_ - lo_);
      emb_grads_.buf.assign_zeros(units_[0].numel);
      for (Slot& s : block_grads_) s.buf.assign_zeros(largest_other);
    }
  }
  if (opt_.deterministic) {
    if (opt_.zero_stage < 2) fixed_.assign_zeros(n_);
    emb_scratch_.buf.assign_zeros(model.largest_grads_span(0));
    size_t largest_span = 0;
    for (size_t u = 1; u < units_.size(); u++)
      largest_span = std::max(largest_span, model.largest_grads_span(static_cast<int>(u)));
    block_scratch_.buf.assign_zeros(largest_span);
    fixed_dest_.assign(units_.size(), nullptr);
    scale_.assign(tensors_.size(), fixed_point_scale(0.0f, opt_.global_batch));
    sample_max_.assign_zeros(tensors_.size());
    owned_squares_.assign_zeros(tensors_.size());
    // Space for the per-step exchanges, so that a step allocates nothing.
    const size_t K = tensors_.size(), W = static_cast<size_t>(comm.size());
    next_scale_.resize(K);
    step_scale_.resize(K);
    host_squares_.resize(K);
    squares_.resize(K);
    all_max_.resize(K * W);
    all_squares_.resize(K * W);
  }
  unit_tensors_.assign(units_.size(), {tensors_.size(), 0});
  for (size_t k = 0; k < tensors_.size(); k++) {
    auto& [first, end] = unit_tensors_[tensors_[k].unit];
    first = std::min(first, k);
    end = std::max(end, k + 1);
  }
  if (opt_.zero_stage == 3) {
    param_shard_.assign_zeros(hi_ - lo_);
    emb_params_.buf.assign_zeros(units_[0].numel);
    for (Slot& s : block_params_) s.buf.assign_zeros(largest_other);
  }
  if (opt_.bf16_compression) error_feedback_.assign(n_, 0.0f);
  model_.set_unit_access(this);
}

DataParallel::~DataParallel() { model_.set_unit_access(nullptr); }

MemoryReport DataParallel::memory() const {
  const size_t f = sizeof(float), shard = hi_ - lo_;
  MemoryReport m;
  m.params = (opt_.zero_stage == 3 ? shard : n_) * f;
  m.grads = (model_.grads() ? n_ : 0) * f + grad_shard_.size() * f;
  m.optimizer = 2 * shard * f;
  auto slot_bytes = [&](const Slot& s) { return s.buf.size() * f; };
  m.working = error_feedback_.size() * f + slot_bytes(emb_params_) + slot_bytes(emb_grads_);
  for (int i = 0; i < 2; i++) m.working += slot_bytes(block_params_[i]) + slot_bytes(block_grads_[i]);
  // Deterministic mode: the int64 accumulators count as gradients, the scratch as working space.
  const size_t i64 = sizeof(int64_t);
  m.grads += (fixed_.size() + fixed_shard_.size()) * i64;
  m.working += (emb_scratch_.buf.size() + block_scratch_.buf.size()) * f + emb_grads_.fixed.size() * i64;
  for (const Slot& s : block_grads_) m.working += s.fixed.size() * i64;
  return m;
}

float* DataParallel::owned_params() { return opt_.zero_stage == 3 ? param_shard_.data() : model_.params() + lo_; }
float* DataParallel::owned_grads() { return opt_.zero_stage >= 2 ? grad_shard_.data() : model_.grads() + lo_; }
int64_t* DataParallel::owned_fixed() { return opt_.zero_stage >= 2 ? fixed_shard_.data() : fixed_.data() + lo_; }

void DataParallel::set_grad_scales(const std::vector<int>& scales) {
  ANVIL_CHECK(opt_.deterministic, "fixed-point gradient scales given to a run with deterministic_mode: false");
  ANVIL_CHECK(scales.size() == tensors_.size(), "{} fixed-point gradient scales for a model of {} tensors",
              scales.size(), tensors_.size());
  scale_ = scales;
}

void DataParallel::init_weights(uint64_t seed) {
  if (opt_.zero_stage == 3) {
    std::vector<float> host(hi_ - lo_);
    model_init_params(model_.config(), seed, lo_, hi_, host.data());
    op_copy_from_host(param_shard_.data(), host.data(), host.size() * sizeof(float));
    for (Slot* s : {&emb_params_, &block_params_[0], &block_params_[1]}) s->unit = -1;
  } else {
    model_.init_weights(seed);
  }
}

void DataParallel::begin_step() {
  if (opt_.deterministic) {
    op_zero(fixed_.data(), fixed_.size() * sizeof(int64_t));
    op_zero(fixed_shard_.data(), fixed_shard_.size() * sizeof(int64_t));
    op_zero(sample_max_.data(), sample_max_.size() * sizeof(float));
  } else if (opt_.zero_stage >= 2) {
    op_zero(grad_shard_.data(), grad_shard_.size() * sizeof(float));
  } else {
    model_.zero_grad();
  }
}

void DataParallel::begin_microbatch(bool last) { last_microbatch_ = last; }

void DataParallel::set_loss_scale(double scale) {
  int e = 0;
  ANVIL_CHECK(std::frexp(scale, &e) == 0.5, "loss scale {} is not a power of two", scale);
  loss_scale_ = scale;
  loss_scale_log2_ = e - 1;
}

DataParallel::Backward DataParallel::finish_backward() {
  thread_.wait_all();
  if (!opt_.deterministic) {
    if (loss_scale_ == 1.0) return Backward::kDone;
    // Unscale what the optimizer will read (all of it under ZeRO-0, where clipping reads it all),
    // and agree on whether any of it is not finite.
    float* g = opt_.zero_stage == 0 ? model_.grads() : owned_grads();
    const size_t n = opt_.zero_stage == 0 ? n_ : hi_ - lo_;
    const int bad = !scale_values_check_finite(g, n, static_cast<float>(1.0 / loss_scale_));
    return sum_exact(comm_, bad) > 0 ? Backward::kOverflow : Backward::kDone;
  }
  // Every rank's per-tensor maxima: the overflow verdict and the next scales are then the same
  // everywhere (a maximum is exact). The loss scale 2^e comes off them exactly here, as it did
  // off the accumulated values (grain_done): the scales are those of the unscaled gradients.
  const size_t K = tensors_.size();
  std::vector<float>& all = all_max_;
  float* mine = all.data() + K * comm_.rank();
  op_copy_to_host(mine, sample_max_.data(), K * sizeof(float));
  for (size_t k = 0; k < K; k++) mine[k] = std::ldexp(mine[k], -loss_scale_log2_);
  all_gather_blocks(comm_, all.data(), K * sizeof(float));
  bool fits = true;
  std::vector<int>& next = next_scale_;
  next = scale_;
  for (size_t k = 0; k < K; k++) {
    float m = 0.0f;
    for (int r = 0; r < comm_.size(); r++) m = std::max(m, all[r * K + k]);
    if (!std::isfinite(m)) {
      ANVIL_CHECK(loss_scale_ != 1.0, "step {}: the gradient of '{}' is not finite (diverged); lower optimizer.lr or "
                  "enable algorithms.gradient_clipping", optimizer_.steps_taken() + 1, tensors_[k].name);
      return Backward::kOverflow;  // the scales stay: this step's values are not a measure
    }
    fits = fits && fixed_point_fits(m, scale_[k], opt_.global_batch);
    if (m > 0.0f) next[k] = fixed_point_scale(m, opt_.global_batch);
  }
  if (fits) {
    sum_owned_squares();
    step_scale_ = scale_;
  }
  scale_ = next;
  return fits ? Backward::kDone : Backward::kRunAgain;
}

// This rank's part of the squared norm per tensor, from what it owns.
void DataParallel::sum_owned_squares() {
  const int64_t* fixed = owned_fixed();
  for (size_t k = 0; k < tensors_.size(); k++) {
    const ParamTensor& t = tensors_[k];
    const size_t a = std::max(lo_, t.offset), b = std::min(hi_, t.offset + t.numel);
    // An empty range sums to zero.
    const size_t at = a < b ? a - lo_ : 0, count = a < b ? b - a : 0;
    fixed_point_squares(fixed + at, count, owned_squares_.data() + k);
  }
  op_copy_to_host(host_squares_.data(), owned_squares_.data(), host_squares_.size() * sizeof(unsigned __int128));
}

double DataParallel::clip_and_norm(double max_norm) {
  double norm = 0;
  if (opt_.deterministic) {
    // The per-tensor integer sums of squares add up exactly over ranks; only the final sum over
    // tensors is in floating point, in layout order, identically everywhere.
    const size_t K = tensors_.size();
    std::vector<unsigned __int128>& squares = squares_;
    squares = host_squares_;
    if (opt_.zero_stage > 0 && comm_.size() > 1) {
      std::vector<unsigned __int128>& all = all_squares_;
      std::copy(host_squares_.begin(), host_squares_.end(), all.begin() + K * comm_.rank());
      all_gather_blocks(comm_, all.data(), K * sizeof(unsigned __int128));
      for (size_t k = 0; k < K; k++) {
        squares[k] = 0;
        for (int r = 0; r < comm_.size(); r++) squares[k] += all[r * K + k];
      }
    }
    double sq = 0;
    for (size_t k = 0; k < K; k++) sq += std::ldexp(static_cast<double>(squares[k]), kSquareShift - 2 * step_scale_[k]);
    norm = std::sqrt(sq);
  } else if (opt_.zero_stage == 0) {
    norm = grad_norm(model_.grads(), n_);  // every rank holds it all: the same norm everywhere
  } else {
    norm = std::sqrt(sum_in_rank_order(comm_, sum_of_squares(owned_grads(), hi_ - lo_)));
  }
  clip_scale_ = clip_coefficient(norm, max_norm);
  return norm;
}

void DataParallel::optimizer_step(double lr) {
  if (opt_.deterministic)
    optimizer_.step(owned_params(), owned_fixed(), step_scale_, lr, clip_scale_);
  else
    optimizer_.step(owned_params(), owned_grads(), lr, clip_scale_);
  clip_scale_ = 1.0f;
  if (opt_.zero_stage == 1 || opt_.zero_stage == 2) {
    // A unit at a time: what a host copy of GPU parameters needs is one unit's room.
    for (size_t u = 0; u < units_.size(); u++) collectives_.all_gather(model_.params() + units_[u].offset, unit_counts_[u]);
  } else if (opt_.zero_stage == 3) {
    for (Slot* s : {&emb_params_, &block_params_[0], &block_params_[1]}) s->unit = -1;  // stale now
  }
}

void DataParallel::copy_shard(size_t& lo, size_t& hi, std::vector<float>& params, std::vector<float>& exp_avg,
                              std::vector<float>& exp_avg_sq) {
  quiesce();
  lo = 0;
  for (int r = 0; r < comm_.rank(); r++) lo += shard_counts_[r];
  hi = lo + shard_counts_[comm_.rank()];
  const float* p = opt_.zero_stage == 3 ? param_shard_.data() : model_.params() + lo;
  const size_t bytes = (hi - lo) * sizeof(float);
  params.resize(hi - lo);
  exp_avg.resize(hi - lo);
  exp_avg_sq.resize(hi - lo);
  op_copy_to_host(params.data(), p, bytes);
  // The optimizer's moments cover [lo_, hi_): the shard, or everything under ZeRO-0.
  op_copy_to_host(exp_avg.data(), optimizer_.exp_avg() + (lo - lo_), bytes);
  op_copy_to_host(exp_avg_sq.data(), optimizer_.exp_avg_sq() + (lo - lo_), bytes);
}

void DataParallel::load_full_state(const std::vector<float>& params, const std::vector<float>& exp_avg,
                                   const std::vector<float>& exp_avg_sq, int64_t optimizer_steps) {
  ANVIL_CHECK(params.size() == n_ && exp_avg.size() == n_ && exp_avg_sq.size() == n_,
              "training state of {} parameters for a model of {}", params.size(), n_);
  quiesce();
  if (opt_.zero_stage == 3) {
    op_copy_from_host(param_shard_.data(), params.data() + lo_, (hi_ - lo_) * sizeof(float));
    for (Slot* s : {&emb_params_, &block_params_[0], &block_params_[1]}) s->unit = -1;
  } else {
    op_copy_from_host(model_.params(), params.data(), n_ * sizeof(float));
  }
  op_copy_from_host(optimizer_.exp_avg(), exp_avg.data() + lo_, (hi_ - lo_) * sizeof(float));
  op_copy_from_host(optimizer_.exp_avg_sq(), exp_avg_sq.data() + lo_, (hi_ - lo_) * sizeof(float));
  optimizer_.set_steps_taken(optimizer_steps);
}

// ---- parameters (ZeRO-3 gathers them; below that they are the model's own)

DataParallel::Slot* DataParallel::find_param_slot(int unit) {
  if (unit == 0) return emb_params_.unit == 0 ? &emb_params_ : nullptr;
  for (Slot& s : block_params_)
    if (s.unit == unit) return &s;
  return nullptr;
}

DataParallel::Slot& DataParallel::free_param_slot(int unit) {
  if (unit == 0) {
    ANVIL_CHECK(!emb_params_.in_use, "the embedding unit was acquired twice");
    return emb_params_;
  }
  for (Slot& s : block_params_)
    if (!s.in_use) return s;
  ANVIL_FAIL("more than two blocks' parameters acquired at once");
}

void DataParallel::start_gather(Slot& slot, int unit) {
  slot.unit = unit;
  const ParamUnit u = units_[unit];
  float* buf = slot.buf.data();
  const size_t a = std::max(lo_, u.offset), b = std::min(hi_, u.offset + u.numel);
  const float* shard = param_shard_.data();
  const size_t lo = lo_;
  const std::vector<size_t>* counts = &unit_counts_[unit];
  slot.ticket = thread_.submit([this, buf, a, b, shard, lo, u, counts] {
    if (b > a) op_copy(buf + (a - u.offset), shard + (a - lo), (b - a) * sizeof(float));
    collectives_.all_gather(buf, *counts);
  });
}

const float* DataParallel::acquire_params(int unit, int next_unit) {
  if (opt_.zero_stage < 3) return model_.params() + units_[unit].offset;
  Slot* s = find_param_slot(unit);
  if (!s) {
    s = &free_param_slot(unit);
    start_gather(*s, unit);
  }
  s->in_use = true;
  if (next_unit >= 0 && !find_param_slot(next_unit) && !(next_unit == 0 && emb_params_.in_use))
    start_gather(free_param_slot(next_unit), next_unit);  // fetched while this unit computes
  thread_.wait(s->ticket);
  return s->buf.data();
}

void DataParallel::release_params(int unit) {
  if (opt_.zero_stage < 3) return;
  Slot* s = find_param_slot(unit);
  ANVIL_CHECK(s && s->in_use, "unit {} released without being acquired", unit);
  s->in_use = false;
}

// ---- gradients

DataParallel::Slot* DataParallel::find_open_grad_slot(int unit) {
  if (unit == 0) return &emb_grads_;
  for (Slot& b : block_grads_)
    if (b.in_use && b.unit == unit) return &b;
  return nullptr;
}

// Stages 2/3: the working buffer for a unit's gradient in this microbatch, zeroed on opening.
DataParallel::Slot* DataParallel::open_grad_slot(int unit) {
  Slot* s = find_open_grad_slot(unit);
  if (!s)
    for (Slot& b : block_grads_)
      if (!b.in_use) {
        s = &b;
        break;
      }
  ANVIL_CHECK(s, "more than two blocks' gradients open at once");
  if (!(s->in_use && s->unit == unit)) {
    thread_.wait(s->ticket);  // the reduce-scatter still reading its last contents
    if (opt_.deterministic)
      op_zero(s->fixed.data(), units_[unit].numel * sizeof(int64_t));
    else
      op_zero(s->buf.data(), units_[unit].numel * sizeof(float));
    s->unit = unit;
    s->in_use = true;
  }
  return s;
}

int64_t* DataParallel::open_fixed(int unit) {
  fixed_dest_[unit] = opt_.zero_stage < 2 ? fixed_.data() + units_[unit].offset : open_grad_slot(unit)->fixed.data();
  return fixed_dest_[unit];
}

float* DataParallel::grads(int unit, size_t offset, size_t count) {
  ANVIL_CHECK(offset + count <= units_[unit].numel, "a span [{}, {}) of unit {}'s gradient, which has {} values",
              offset, offset + count, unit, units_[unit].numel);
  if (!opt_.deterministic) {
    if (opt_.zero_stage < 2) return model_.grads() + units_[unit].offset + offset;
    return open_grad_slot(unit)->buf.data() + offset;
  }
  open_fixed(unit);
  Scratch& s = scratch_for(unit);
  ANVIL_CHECK(count <= s.buf.size(), "a span of {} values of unit {}'s gradient, scratch for {}", count, unit,
              s.buf.size());
  s.origin = offset;
  return s.buf.data();  // all zero between sequences
}

void DataParallel::grain_done(int unit, size_t offset, size_t count) {
  if (!opt_.deterministic) return;  // float contributions accumulated in place
  int64_t* dest = fixed_dest_[unit];
  ANVIL_CHECK(dest, "unit {}'s gradient finished a sequence without being opened", unit);
  Scratch& s = scratch_for(unit);
  ANVIL_CHECK(offset >= s.origin && offset + count <= s.origin + s.buf.size(),
              "unit {}'s gradient [{}, {}) was handed over outside the span asked for", unit, offset, offset + count);
  const size_t base = units_[unit].offset, lo = base + offset, hi = lo + count;
  float* scratch = s.buf.data();  // from unit offset s.origin
  const auto [first, end] = unit_tensors_[unit];
  for (size_t k = first; k < end; k++) {
    const ParamTensor& t = tensors_[k];
    const size_t a = std::max(lo, t.offset), b = std::min(hi, t.offset + t.numel);
    if (a >= b) continue;
    // The loss scale 2^e comes off exactly here (and off the maxima in finish_backward): the
    // accumulators and so the fixed-point scales are those of the unscaled gradients.
    fixed_point_accumulate(dest + (a - base), scratch + (a - base - s.origin), b - a, scale_[k] - loss_scale_log2_,
                           sample_max_.data() + k);
  }
}

int DataParallel::tensor_at(int unit, size_t offset) const {
  const size_t at = units_[unit].offset + offset;
  const auto [first, end] = unit_tensors_[unit];
  for (size_t k = first; k < end; k++)
    if (at >= tensors_[k].offset && at < tensors_[k].offset + tensors_[k].numel) return static_cast<int>(k);
  ANVIL_FAIL("unit {} has no element at offset {}", unit, offset);
}

void DataParallel::grain_rows(int unit, size_t offset, float* x, const int32_t* rows, const int32_t* rows_op,
                              size_t n_rows, size_t row_len) {
  if (n_rows == 0) return;
  const int k = tensor_at(unit, offset);
  const ParamTensor& t = tensors_[k];
  for (size_t r = 0; r < n_rows; r++)
    ANVIL_CHECK(rows[r] >= 0 && units_[unit].offset + offset + (static_cast<size_t>(rows[r]) + 1) * row_len <=
                                    t.offset + t.numel,
                "row {} lies outside tensor '{}'", rows[r], t.name);
  if (!opt_.deterministic) {
    add_rows(grads(unit, offset, 0), x, rows_op, n_rows, row_len);
    return;
  }
  // Rows may be a unit's first contribution in a microbatch (an untied model's token embedding
  // without a position table), so they open it as grads() does.
  int64_t* dest = open_fixed(unit);
  fixed_point_accumulate_rows(dest + offset, x, rows_op, n_rows, row_len, scale_[k] - loss_scale_log2_,
                              sample_max_.data() + k);
}

void DataParallel::grads_done(int unit) {
  const ParamUnit u = units_[unit];
  const std::vector<size_t>* counts = &unit_counts_[unit];
  const AllReduceAlgo algo = opt_.algo;
  if (opt_.deterministic) fixed_dest_[unit] = nullptr;
  if (opt_.zero_stage < 2) {
    if (!last_microbatch_ || comm_.size() == 1) return;  // earlier microbatches accumulate locally
    if (opt_.deterministic) {
      int64_t* g = fixed_.data() + u.offset;
      if (opt_.zero_stage == 0)
        thread_.submit([this, g, u, algo] { collectives_.all_reduce(g, u.numel, algo); });
      else
        thread_.submit([this, g, counts, algo] { collectives_.reduce_scatter(g, *counts, algo); });
      return;
    }
    float* g = model_.grads() + u.offset;
    if (opt_.zero_stage == 0 && opt_.bf16_compression) {
      float* err = error_feedback_.data() + u.offset;
      thread_.submit([this, g, err, u] { all_reduce_bf16(comm_, g, err, u.numel); });
    } else if (opt_.zero_stage == 0) {
      thread_.submit([this, g, u, algo] { collectives_.all_reduce(g, u.numel, algo); });
    } else {
      thread_.submit([this, g, counts, algo] { collectives_.reduce_scatter(g, *counts, algo); });
    }
    return;
  }
  Slot* s = find_open_grad_slot(unit);
  ANVIL_CHECK(s && s->in_use && s->unit == unit, "unit {}'s gradient finished without being opened", unit);
  s->in_use = false;
  const size_t a = std::max(lo_, u.offset), b = std::min(hi_, u.offset + u.numel), lo = lo_;
  // Microbatches add their reduced sums into the shard in order.
  if (opt_.deterministic) {
    int64_t* buf = s->fixed.data();
    int64_t* shard = fixed_shard_.data();
    s->ticket = thread_.submit([this, buf, shard, a, b, lo, u, counts, algo] {
      collectives_.reduce_scatter(buf, *counts, algo);
      if (b > a) fixed_point_add_arrays(shard + (a - lo), buf + (a - u.offset), b - a);
    });
    return;
  }
  float* buf = s->buf.data();
  float* shard = grad_shard_.data();
  s->ticket = thread_.submit([this, buf, shard, a, b, lo, u, counts, algo] {
    collectives_.reduce_scatter(buf, *counts, algo);
    if (b > a) residual_forward(shard + (a - lo), shard + (a - lo), buf + (a - u.offset), static_cast<long>(b - a));
  });
}

}  // namespace anvil
