#include "parallel/gradient_reduction.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/encoder.h"
#include "kernels/fixed_point.h"
#include "kernels/optimizer.h"
#include "kernels/residual.h"
#include "model/tensor_parallel.h"
#include "parallel/collectives.h"
#include "parallel/data_parallel.h"

namespace anvil {

GradientReduction::GradientReduction(const DataParallelContext& ctx)
    : ctx_(ctx), impl_(ctx.model.kernels()), units_(ctx.model.units()), tensors_(ctx.model.tensors()) {
  const DataParallelOptions& opt = ctx_.options;
  const size_t shard = ctx_.shards.hi - ctx_.shards.lo;
  size_t largest_block = 0;
  for (size_t u = 1; u < units_.size(); u++) largest_block = std::max(largest_block, units_[u].numel);
  if (opt.zero_stage >= 2) {
    if (opt.deterministic) {
      fixed_shard_.assign_zeros(impl_, shard);
      emb_slot_.fixed.assign_zeros(impl_, units_[0].numel);
      for (Slot& s : block_slots_) s.fixed.assign_zeros(impl_, largest_block);
    } else {
      grad_shard_.assign_zeros(impl_, shard);
      emb_slot_.buf.assign_zeros(impl_, units_[0].numel);
      for (Slot& s : block_slots_) s.buf.assign_zeros(impl_, largest_block);
    }
  }
  if (opt.deterministic) {
    if (opt.zero_stage < 2) fixed_.assign_zeros(impl_, ctx_.shards.n);
    fit_scratch();
    fixed_dest_.assign(units_.size(), nullptr);
    scale_.assign(tensors_.size(), fixed_point_scale(0.0f, opt.global_batch));
    sample_max_.assign_zeros(impl_, tensors_.size());
    owned_squares_.assign_zeros(impl_, tensors_.size());
    // Each tensor's part of the owned range [lo, hi), from the range's start (empty where they
    // do not meet): the ranges of one fixed_point_squares call.
    std::vector<size_t> bounds;
    for (const ParamTensor& t : tensors_) {
      ANVIL_CHECK(t.offset == (&t == tensors_.data() ? 0 : (&t - 1)->offset + (&t - 1)->numel),
                  "internal: tensor '{}' does not follow the one before it in the gradient", t.name);
      bounds.push_back(std::clamp(t.offset, ctx_.shards.lo, ctx_.shards.hi) - ctx_.shards.lo);
    }
    bounds.push_back(ctx_.shards.hi - ctx_.shards.lo);
    owned_bounds_.assign_zeros(impl_, bounds.size());
    op_copy_from_host(impl_, owned_bounds_.data(), bounds.data(), bounds.size() * sizeof(size_t));
    // Space for the per-step exchanges, so that a step allocates nothing.
    const size_t K = tensors_.size(), W = static_cast<size_t>(ctx_.comm.size());
    next_scale_.resize(K);
    step_scale_.resize(K);
    host_squares_.resize(K);
    squares_.resize(K);
    all_max_.resize(K * W);
    group_max_.resize(K);
    all_squares_.resize(K * W);
  }
  if (const PipelineGroups* p = opt.pipeline) {
    ANVIL_CHECK(opt.deterministic && opt.zero_stage <= 1 && impl_ != KernelImpl::kGpu, "a pipeline stage's gradients "
                "are reduced in deterministic mode, at ZeRO stage 0 or 1, in host memory");
    if (p->tied) {
      const auto [first, end] = ctx_.shards.unit_tensors[0];
      tied_tensors_ = end - first;
      tied_max_.resize(2 * tied_tensors_);
    }
    stage_squares_.resize(static_cast<size_t>(p->stages) * model_param_layout(ctx_.model.config()).size());
  }
  if ((share_group_ = opt.share_group())) {
    ANVIL_CHECK(opt.deterministic, "a share's gradients are reduced in deterministic mode");
    const ModelConfig& share = ctx_.model.config();
    for (const ParamTensor& k : tensors_) share_cut_.push_back(share_cut(share, k.name));
    share_max_.resize(tensors_.size() * share_group_->size());
    share_squares_.resize(tensors_.size() * share_group_->size());
    if (opt.experts)
      for (size_t k = 0; k < tensors_.size(); k++) {
        const size_t a = std::clamp(tensors_[k].offset, ctx_.shards.lo, ctx_.shards.hi);
        const size_t b = std::clamp(tensors_[k].offset + tensors_[k].numel, ctx_.shards.lo, ctx_.shards.hi);
        if (share_cut_[k] || a == b) continue;
        if (!whole_runs_.empty() && whole_runs_.back().first + whole_runs_.back().second == a - ctx_.shards.lo)
          whole_runs_.back().second += b - a;
        else
          whole_runs_.push_back({a - ctx_.shards.lo, b - a});
      }
  }
  if (opt.bf16_compression) error_feedback_.assign(ctx_.shards.n, 0.0f);
}

void GradientReduction::fit_scratch() {
  if (!ctx_.options.deterministic) return;
  size_t largest_span = 0;
  for (size_t u = 1; u < units_.size(); u++)
    largest_span = std::max(largest_span, ctx_.model.largest_grads_span(static_cast<int>(u)));
  const std::pair<Scratch*, size_t> sizes[] = {{&emb_scratch_, ctx_.model.largest_grads_span(0)},
                                                {&block_scratch_, largest_span}};
  for (const auto& [s, n] : sizes)
    if (s->buf.size() != n) {
      s->buf.reset();  // freed first: never the old and the new at once
      s->buf.assign_zeros(impl_, n);
      s->dirty_lo = s->dirty_hi = 0;
    }
}

void GradientReduction::add_memory(MemoryReport& m) const {
  const size_t f = sizeof(float), i64 = sizeof(int64_t);
  m.grads += (ctx_.model.grads() ? ctx_.shards.n : 0) * f + grad_shard_.size() * f;
  m.working += error_feedback_.size() * f + emb_slot_.buf.size() * f;
  for (const Slot& s : block_slots_) m.working += s.buf.size() * f;
  // Deterministic mode: the int64 accumulators count as gradients, the scratch as working space.
  m.grads += (fixed_.size() + fixed_shard_.size()) * i64;
  m.working += (emb_scratch_.buf.size() + block_scratch_.buf.size()) * f + emb_slot_.fixed.size() * i64;
  for (const Slot& s : block_slots_) m.working += s.fixed.size() * i64;
}

float* GradientReduction::owned_grads() {
  return ctx_.options.zero_stage >= 2 ? grad_shard_.data() : ctx_.model.grads() + ctx_.shards.lo;
}

int64_t* GradientReduction::owned_fixed() {
  return ctx_.options.zero_stage >= 2 ? fixed_shard_.data() : fixed_.data() + ctx_.shards.lo;
}

void GradientReduction::set_scales(const std::vector<int>& scales) {
  ANVIL_CHECK(ctx_.options.deterministic, "fixed-point gradient scales given to a run with deterministic_mode: false");
  ANVIL_CHECK(scales.size() == tensors_.size(), "{} fixed-point gradient scales for a model of {} tensors",
              scales.size(), tensors_.size());
  scale_ = scales;
}

void GradientReduction::begin_step() {
  if (ctx_.options.deterministic) {
    op_zero(impl_, fixed_.data(), fixed_.size() * sizeof(int64_t));
    op_zero(impl_, fixed_shard_.data(), fixed_shard_.size() * sizeof(int64_t));
    op_zero(impl_, sample_max_.data(), sample_max_.size() * sizeof(float));
  } else if (ctx_.options.zero_stage >= 2) {
    op_zero(impl_, grad_shard_.data(), grad_shard_.size() * sizeof(float));
  } else {
    ctx_.model.zero_grad();
  }
}

GradientReduction::Backward GradientReduction::finish_backward(int64_t step) {
  ctx_.thread.wait_all();
  const DataParallelOptions& opt = ctx_.options;
  Communicator& comm = ctx_.comm;
  if (!opt.deterministic) {
    if (loss_scale_ == 1.0) return Backward::kDone;
    // Unscale what the optimizer will read (all of it under ZeRO-0, where clipping reads it all),
    // and agree on whether any of it is not finite.
    float* g = opt.zero_stage == 0 ? ctx_.model.grads() : owned_grads();
    const size_t n = opt.zero_stage == 0 ? ctx_.shards.n : ctx_.shards.hi - ctx_.shards.lo;
    const int bad = !scale_values_check_finite(impl_, g, n, static_cast<float>(1.0 / loss_scale_));
    return sum_exact(comm, bad) > 0 ? Backward::kOverflow : Backward::kDone;
  }
  // Every rank's per-tensor maxima: the overflow verdict and the next scales are then the same
  // everywhere (a maximum is exact). The loss scale 2^e comes off them exactly here, as it did
  // off the accumulated values (grain_done): the scales are those of the unscaled gradients.
  const size_t K = tensors_.size();
  std::vector<float>& all = all_max_;
  float* mine = all.data() + K * comm.rank();
  op_copy_to_host(impl_, mine, sample_max_.data(), K * sizeof(float));
  for (size_t k = 0; k < K; k++) mine[k] = std::ldexp(mine[k], -loss_scale_log2_);
  all_gather_blocks(comm, all.data(), K * sizeof(float));
  std::vector<float>& max = group_max_;
  for (size_t k = 0; k < K; k++) {
    max[k] = 0.0f;
    for (int r = 0; r < comm.size(); r++) max[k] = std::max(max[k], all[r * K + k]);
  }
  if (opt.pipeline && opt.pipeline->tied) {
    // The tied embedding's gradients are the sum of two stages': one scale, from both maxima.
    Communicator& tied = *opt.pipeline->tied;
    std::copy(max.begin(), max.begin() + tied_tensors_, tied_max_.begin() + tied_tensors_ * tied.rank());
    all_gather_blocks(tied, tied_max_.data(), tied_tensors_ * sizeof(float));
    for (size_t k = 0; k < tied_tensors_; k++) max[k] = std::max(tied_max_[k], tied_max_[tied_tensors_ + k]);
  }
  if (share_group_) {
    // A cut tensor's scale is the whole tensor's: from the largest of its shares' maxima. (An
    // expert share's whole tensors take the largest of every member's too: their sums' ranges.)
    const int R = share_group_->size();
    std::copy(max.begin(), max.end(), share_max_.begin() + static_cast<std::ptrdiff_t>(K * share_group_->rank()));
    all_gather_blocks(*share_group_, share_max_.data(), K * sizeof(float));
    for (size_t k = 0; k < K; k++)
      for (int r = 0; r < R; r++) max[k] = std::max(max[k], share_max_[K * r + k]);
  }
  bool fits = true, finite = true;
  std::vector<int>& next = next_scale_;
  next = scale_;
  for (size_t k = 0; k < K && finite; k++) {
    finite = std::isfinite(max[k]);
    ANVIL_CHECK(finite || loss_scale_ != 1.0, "step {}: the gradient of '{}' is not finite (diverged); lower "
                "optimizer.lr or enable algorithms.gradient_clipping", step, tensors_[k].name);
    fits = fits && fixed_point_fits(max[k], scale_[k], opt.global_batch);
    if (max[k] > 0.0f) next[k] = fixed_point_scale(max[k], opt.global_batch);
  }
  const Backward verdict = agreed(!finite ? Backward::kOverflow : fits ? Backward::kDone : Backward::kRunAgain);
  if (verdict == Backward::kOverflow) return verdict;  // the scales stay: this step's values are not a measure
  if (verdict == Backward::kDone) {
    if (opt.pipeline && opt.pipeline->tied)  // integers: the exact sum, the same on both stages
      all_reduce(*opt.pipeline->tied, fixed_.data() + units_[0].offset, units_[0].numel);
    // An expert share's whole tensors: every member's sum, exact in integers, the same on each.
    for (const auto& [at, n] : whole_runs_) all_reduce(*share_group_, owned_fixed() + at, n);
    sum_owned_squares();
    step_scale_ = scale_;
  }
  scale_ = next;
  return verdict;
}

GradientReduction::Backward GradientReduction::agreed(Backward mine) {
  if (!ctx_.options.pipeline) return mine;
  auto rank = [](Backward b) { return b == Backward::kDone ? 0 : b == Backward::kRunAgain ? 1 : 2; };
  const int64_t worst = max_exact(*ctx_.options.pipeline->pipeline, rank(mine));
  return worst == 0 ? Backward::kDone : worst == 1 ? Backward::kRunAgain : Backward::kOverflow;
}

// This rank's part of the squared norm per tensor, from what it owns.
void GradientReduction::sum_owned_squares() {
  fixed_point_squares(impl_, owned_fixed(), ctx_.shards.hi - ctx_.shards.lo, owned_bounds_.data(), tensors_.size(),
                      owned_squares_.data());
  op_copy_to_host(impl_, host_squares_.data(), owned_squares_.data(), host_squares_.size() * sizeof(unsigned __int128));
}

double GradientReduction::global_norm() {
  const DataParallelOptions& opt = ctx_.options;
  Communicator& comm = ctx_.comm;
  if (opt.deterministic) {
    // The per-tensor integer sums of squares add up exactly over ranks; only the final sum over
    // tensors is in floating point, in layout order, identically everywhere.
    const size_t K = tensors_.size();
    std::vector<unsigned __int128>& squares = squares_;
    squares = host_squares_;
    if (opt.zero_stage > 0 && comm.size() > 1) {
      std::vector<unsigned __int128>& all = all_squares_;
      std::copy(host_squares_.begin(), host_squares_.end(), all.begin() + K * comm.rank());
      all_gather_blocks(comm, all.data(), K * sizeof(unsigned __int128));
      for (size_t k = 0; k < K; k++) {
        squares[k] = 0;
        for (int r = 0; r < comm.size(); r++) squares[k] += all[r * K + k];
      }
    }
    if (share_group_) {
      // A cut tensor's squares are the sum of its shares'; a whole one's, any rank's.
      const int R = share_group_->size();
      std::copy(squares.begin(), squares.end(),
                share_squares_.begin() + static_cast<std::ptrdiff_t>(K * share_group_->rank()));
      all_gather_blocks(*share_group_, share_squares_.data(), K * sizeof(unsigned __int128));
      for (size_t k = 0; k < K; k++) {
        if (!share_cut_[k]) continue;
        squares[k] = 0;
        for (int r = 0; r < R; r++) squares[k] += share_squares_[K * r + k];
      }
    }
    double sq = 0;
    if (const PipelineGroups* p = opt.pipeline) {
      // Every stage's tensors in the whole model's order, the sum one process forms; a tensor
      // two stages hold (the tied embedding unit's) counted once.
      const size_t whole = stage_squares_.size() / p->stages;
      StageSquares* mine = stage_squares_.data() + whole * p->stage;
      std::fill(mine, mine + whole, StageSquares{0, 0, 0});
      for (size_t k = 0; k < K; k++) mine[tensors_[k].index] = {squares[k], step_scale_[k], 1};
      all_gather_blocks(*p->pipeline, stage_squares_.data(), whole * sizeof(StageSquares));
      for (size_t w = 0; w < whole; w++)
        for (int s = 0; s < p->stages; s++) {
          const StageSquares& x = stage_squares_[whole * s + w];
          if (!x.held) continue;
          sq += std::ldexp(static_cast<double>(x.squares), kSquareShift - 2 * x.scale);
          break;
        }
      return std::sqrt(sq);
    }
    for (size_t k = 0; k < K; k++) sq += std::ldexp(static_cast<double>(squares[k]), kSquareShift - 2 * step_scale_[k]);
    return std::sqrt(sq);
  }
  if (opt.zero_stage == 0) return grad_norm(impl_, ctx_.model.grads(), ctx_.shards.n);  // every rank holds it all
  return std::sqrt(sum_in_rank_order(comm, sum_of_squares(impl_, owned_grads(), ctx_.shards.hi - ctx_.shards.lo)));
}

GradientReduction::Slot* GradientReduction::find_open_slot(int unit) {
  if (unit == 0) return &emb_slot_;
  for (Slot& b : block_slots_)
    if (b.in_use && b.unit == unit) return &b;
  return nullptr;
}

// Stages 2/3: the working buffer for a unit's gradient in this microbatch, zeroed on opening.
GradientReduction::Slot* GradientReduction::open_slot(int unit) {
  Slot* s = find_open_slot(unit);
  if (!s)
    for (Slot& b : block_slots_)
      if (!b.in_use) {
        s = &b;
        break;
      }
  ANVIL_CHECK(s, "more than two blocks' gradients open at once");
  if (!(s->in_use && s->unit == unit)) {
    ctx_.thread.wait(s->ticket);  // the reduce-scatter still reading its last contents
    if (ctx_.options.deterministic)
      op_zero(impl_, s->fixed.data(), units_[unit].numel * sizeof(int64_t));
    else
      op_zero(impl_, s->buf.data(), units_[unit].numel * sizeof(float));
    s->unit = unit;
    s->in_use = true;
  }
  return s;
}

int64_t* GradientReduction::open_fixed(int unit) {
  fixed_dest_[unit] =
      ctx_.options.zero_stage < 2 ? fixed_.data() + units_[unit].offset : open_slot(unit)->fixed.data();
  return fixed_dest_[unit];
}

float* GradientReduction::grads(int unit, size_t offset, size_t count, int sequences) {
  ANVIL_CHECK(offset + count <= units_[unit].numel, "a span [{}, {}) of unit {}'s gradient, which has {} values",
              offset, offset + count, unit, units_[unit].numel);
  if (!ctx_.options.deterministic) {
    // (only a microbatch-invariant model, which deterministic training builds, forms spans per sequence)
    ANVIL_CHECK(sequences == 1, "internal: {} sequences' gradient spans outside deterministic mode", sequences);
    if (ctx_.options.zero_stage < 2) return ctx_.model.grads() + units_[unit].offset + offset;
    return open_slot(unit)->buf.data() + offset;
  }
  Scratch& s = spans_for(unit, offset, count, sequences);
  // Added to: zero, where written spans left values.
  const size_t needed = sequence_spans_extent(count, sequences);
  if (s.dirty_lo < std::min(needed, s.dirty_hi)) {
    op_zero(impl_, s.buf.data() + s.dirty_lo, (std::min(needed, s.dirty_hi) - s.dirty_lo) * sizeof(float));
    s.dirty_lo = std::min(needed, s.dirty_hi);
  }
  s.written = false;
  return s.buf.data();
}

float* GradientReduction::grads_to_write(int unit, size_t offset, size_t count, int sequences) {
  // On the CPU a grain's spans are one sequence's, in cache: clearing them costs nothing.
  if (!ctx_.options.deterministic || impl_ != KernelImpl::kGpu) return nullptr;
  Scratch& s = spans_for(unit, offset, count, sequences);
  const size_t needed = sequence_spans_extent(count, sequences);
  s.dirty_hi = std::max(s.dirty_hi, needed);
  s.dirty_lo = 0;  // [0, needed) and what was dirty: an interval that holds both
  s.written = true;
  return s.buf.data();
}

GradientReduction::Scratch& GradientReduction::spans_for(int unit, size_t offset, size_t count, int sequences) {
  open_fixed(unit);
  Scratch& s = scratch_for(unit);
  const size_t needed = sequence_spans_extent(count, sequences);
  ANVIL_CHECK(needed <= s.buf.size(), "{} spans of {} values of unit {}'s gradient, scratch for {} (the model's "
              "microbatch grew without DataParallel::fit_model_batch)", sequences, count, unit, s.buf.size());
  s.origin = offset;
  return s;
}

void GradientReduction::grain_done(int unit, size_t offset, size_t count, int sequences) {
  if (!ctx_.options.deterministic) return;  // float contributions accumulated in place
  int64_t* dest = fixed_dest_[unit];
  ANVIL_CHECK(dest, "unit {}'s gradient finished a sequence without being opened", unit);
  Scratch& s = scratch_for(unit);
  ANVIL_CHECK(offset >= s.origin && offset + count <= s.origin + s.buf.size(),
              "unit {}'s gradient [{}, {}) was handed over outside the span asked for", unit, offset, offset + count);
  const size_t stride = sequence_span_stride(count);
  ANVIL_CHECK(sequences == 1 || (offset == s.origin && sequence_spans_extent(count, sequences) <= s.buf.size()),
              "unit {}'s gradient [{}, {}) was handed over for {} sequences outside the spans asked for", unit, offset,
              offset + count, sequences);
  const size_t base = units_[unit].offset, lo = base + offset, hi = lo + count;
  float* scratch = s.buf.data();  // from unit offset s.origin
  const auto [first, end] = ctx_.shards.unit_tensors[unit];
  for (size_t k = first; k < end; k++) {
    const ParamTensor& t = tensors_[k];
    const size_t a = std::max(lo, t.offset), b = std::min(hi, t.offset + t.numel);
    if (a >= b) continue;
    // The loss scale 2^e comes off exactly here (and off the maxima in finish_backward): the
    // accumulators and so the fixed-point scales are those of the unscaled gradients.
    fixed_point_accumulate(impl_, dest + (a - base), scratch + (a - base - s.origin), b - a, sequences, stride,
                           scale_[k] - loss_scale_log2_, sample_max_.data() + k, !s.written);
  }
}

int GradientReduction::tensor_at(int unit, size_t offset) const {
  const size_t at = units_[unit].offset + offset;
  const auto [first, end] = ctx_.shards.unit_tensors[unit];
  for (size_t k = first; k < end; k++)
    if (at >= tensors_[k].offset && at < tensors_[k].offset + tensors_[k].numel) return static_cast<int>(k);
  ANVIL_FAIL("unit {} has no element at offset {}", unit, offset);
}

void GradientReduction::grain_rows(int unit, size_t offset, float* x, const int32_t* rows, const int32_t* rows_op,
                                   size_t n_rows, size_t row_len) {
  if (n_rows == 0) return;
  const int k = tensor_at(unit, offset);
  const ParamTensor& t = tensors_[k];
  for (size_t r = 0; r < n_rows; r++)
    ANVIL_CHECK(rows[r] >= 0 && units_[unit].offset + offset + (static_cast<size_t>(rows[r]) + 1) * row_len <=
                                    t.offset + t.numel,
                "row {} lies outside tensor '{}'", rows[r], t.name);
  if (!ctx_.options.deterministic) {
    add_rows(impl_, grads(unit, offset, 0, 1), x, rows_op, n_rows, row_len);
    return;
  }
  // Rows may be a unit's first contribution in a microbatch (an untied model's token embedding
  // without a position table), so they open it as grads() does.
  int64_t* dest = open_fixed(unit);
  fixed_point_accumulate_rows(impl_, dest + offset, x, rows_op, n_rows, row_len, scale_[k] - loss_scale_log2_,
                              sample_max_.data() + k);
}

void GradientReduction::grads_done(int unit) {
  const DataParallelOptions& opt = ctx_.options;
  const ParamUnit u = units_[unit];
  const std::vector<size_t>* counts = &ctx_.shards.unit_counts[unit];
  const AllReduceAlgo algo = opt.algo;
  OpCollectives* collectives = &ctx_.collectives;
  CommThread& thread = ctx_.thread;
  if (opt.deterministic) fixed_dest_[unit] = nullptr;
  if (opt.zero_stage < 2) {
    if (!last_microbatch_ || ctx_.comm.size() == 1) return;  // earlier microbatches accumulate locally
    if (opt.deterministic) {
      int64_t* g = fixed_.data() + u.offset;
      // A tied embedding unit is summed with the other stage's whole (finish_backward).
      if (opt.zero_stage == 0 || (unit == 0 && opt.pipeline && opt.pipeline->tied))
        thread.submit([collectives, g, u, algo] { collectives->all_reduce(g, u.numel, algo); });
      else
        thread.submit([collectives, g, counts, algo] { collectives->reduce_scatter(g, *counts, algo); });
      return;
    }
    float* g = ctx_.model.grads() + u.offset;
    if (opt.zero_stage == 0 && opt.bf16_compression) {
      float* err = error_feedback_.data() + u.offset;
      Communicator* comm = &ctx_.comm;
      thread.submit([comm, g, err, u] { all_reduce_bf16(*comm, g, err, u.numel); });
    } else if (opt.zero_stage == 0) {
      thread.submit([collectives, g, u, algo] { collectives->all_reduce(g, u.numel, algo); });
    } else {
      thread.submit([collectives, g, counts, algo] { collectives->reduce_scatter(g, *counts, algo); });
    }
    return;
  }
  Slot* s = find_open_slot(unit);
  ANVIL_CHECK(s && s->in_use && s->unit == unit, "unit {}'s gradient finished without being opened", unit);
  s->in_use = false;
  const size_t lo = ctx_.shards.lo, a = std::max(lo, u.offset), b = std::min(ctx_.shards.hi, u.offset + u.numel);
  // Microbatches add their reduced sums into the shard in order.
  if (opt.deterministic) {
    int64_t* buf = s->fixed.data();
    int64_t* shard = fixed_shard_.data();
    s->ticket = thread.submit([collectives, impl = impl_, buf, shard, a, b, lo, u, counts, algo] {
      collectives->reduce_scatter(buf, *counts, algo);
      if (b > a) fixed_point_add_arrays(impl, shard + (a - lo), buf + (a - u.offset), b - a);
    });
    return;
  }
  float* buf = s->buf.data();
  float* shard = grad_shard_.data();
  s->ticket = thread.submit([collectives, impl = impl_, buf, shard, a, b, lo, u, counts, algo] {
    collectives->reduce_scatter(buf, *counts, algo);
    if (b > a)
      residual_forward(impl, shard + (a - lo), shard + (a - lo), buf + (a - u.offset), static_cast<long>(b - a));
  });
}

}  // namespace anvil
