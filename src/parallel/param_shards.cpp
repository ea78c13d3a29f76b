#include "parallel/param_shards.h"

#include <algorithm>

#include "core/error.h"
#include "model/tensor_parallel.h"
#include "parallel/data_parallel.h"

namespace anvil {

ParamShards::ParamShards(const DataParallelContext& ctx)
    : ctx_(ctx), impl_(ctx.model.kernels()), units_(ctx.model.units()) {
  if (ctx_.options.zero_stage == 3) {
    size_t largest_block = 0;
    for (size_t u = 1; u < units_.size(); u++) largest_block = std::max(largest_block, units_[u].numel);
    shard_.assign_zeros(impl_, ctx_.shards.hi - ctx_.shards.lo);
    emb_slot_.buf.assign_zeros(impl_, units_[0].numel);
    for (Slot& s : block_slots_) s.buf.assign_zeros(impl_, largest_block);
  }
}

void ParamShards::add_memory(MemoryReport& m) const {
  const size_t f = sizeof(float);
  m.params += (ctx_.options.zero_stage == 3 ? shard_.size() : ctx_.shards.n) * f;
  m.working += emb_slot_.buf.size() * f;
  for (const Slot& s : block_slots_) m.working += s.buf.size() * f;
}

float* ParamShards::owned() {
  return ctx_.options.zero_stage == 3 ? shard_.data() : ctx_.model.params() + ctx_.shards.lo;
}

void ParamShards::mark_stale() {
  for (Slot* s : {&emb_slot_, &block_slots_[0], &block_slots_[1]}) s->unit = -1;
}

namespace {

// The initial values of [lo, hi) of the model's parameters. Each is a function of the seed, its
// tensor and its place in the whole model's tensor, so a pipeline stage or a share (tensor or
// expert parallelism's) forms its part of one process's values alone.
void init_params_range(const DataParallelContext& ctx, uint64_t seed, size_t lo, size_t hi, float* out) {
  const ModelConfig* whole = ctx.options.whole_model();
  if (!whole) {
    model_init_params(ctx.model.tensors(), seed, lo, hi, out);
    return;
  }
  // The model's tensors are runs of the whole share's (a pipeline stage holds some of them): each
  // run at its place in the share.
  const ModelConfig& share_cfg = ctx.model.config();
  const std::vector<ParamTensor> share = model_param_layout(share_cfg);
  const std::vector<ParamTensor>& mine = ctx.model.tensors();
  for (size_t i = 0; i < mine.size();) {
    const size_t first = mine[i].offset, at = share[mine[i].index].offset;
    size_t end = first + mine[i].numel;
    for (i++; i < mine.size() && mine[i].offset == end && share[mine[i].index].offset == at + (end - first); i++)
      end += mine[i].numel;
    const size_t a = std::max(lo, first), b = std::min(hi, end);
    if (a < b) init_share(*whole, share_cfg, seed, at + (a - first), at + (b - first), out + (a - lo));
  }
}

}  // namespace

void ParamShards::init(uint64_t seed) {
  const bool sharded = ctx_.options.zero_stage == 3;
  ANVIL_CHECK(sharded || ctx_.model.params(), "internal: below ZeRO-3 the model holds its own parameters");
  const size_t lo = sharded ? ctx_.shards.lo : 0, hi = sharded ? ctx_.shards.hi : ctx_.model.num_params();
  std::vector<float> host(hi - lo);
  init_params_range(ctx_, seed, lo, hi, host.data());
  op_copy_from_host(impl_, sharded ? shard_.data() : ctx_.model.params(), host.data(), host.size() * sizeof(float));
  if (sharded) mark_stale();
}

void ParamShards::share_update() {
  const int stage = ctx_.options.zero_stage;
  if (stage == 1 || stage == 2) {
    // A unit at a time: what a host copy of GPU parameters needs is one unit's room.
    for (size_t u = 0; u < units_.size(); u++)
      ctx_.collectives.all_gather(ctx_.model.params() + units_[u].offset, ctx_.shards.unit_counts[u]);
  } else if (stage == 3) {
    mark_stale();
  }
}

void ParamShards::copy_to_host(size_t lo, size_t hi, float* out) {
  ANVIL_CHECK(lo >= ctx_.shards.shard_lo && hi <= ctx_.shards.shard_hi, "internal: [{}, {}) is outside the rank's "
              "shard", lo, hi);
  const float* p = ctx_.options.zero_stage == 3 ? shard_.data() + (lo - ctx_.shards.lo) : ctx_.model.params() + lo;
  op_copy_to_host(impl_, out, p, (hi - lo) * sizeof(float));
}

void ParamShards::load(const float* params) {
  if (ctx_.options.zero_stage == 3) {
    op_copy_from_host(impl_, shard_.data(), params + ctx_.shards.lo, (ctx_.shards.hi - ctx_.shards.lo) * sizeof(float));
    mark_stale();
  } else {
    op_copy_from_host(impl_, ctx_.model.params(), params, ctx_.shards.n * sizeof(float));
  }
}

ParamShards::Slot* ParamShards::find_slot(int unit) {
  if (unit == 0) return emb_slot_.unit == 0 ? &emb_slot_ : nullptr;
  for (Slot& s : block_slots_)
    if (s.unit == unit) return &s;
  return nullptr;
}

ParamShards::Slot& ParamShards::free_slot(int unit) {
  if (unit == 0) {
    ANVIL_CHECK(!emb_slot_.in_use, "the embedding unit was acquired twice");
    return emb_slot_;
  }
  for (Slot& s : block_slots_)
    if (!s.in_use) return s;
  ANVIL_FAIL("more than two blocks' parameters acquired at once");
}

void ParamShards::start_gather(Slot& slot, int unit) {
  slot.unit = unit;
  const ParamUnit u = units_[unit];
  float* buf = slot.buf.data();
  const size_t lo = ctx_.shards.lo, a = std::max(lo, u.offset), b = std::min(ctx_.shards.hi, u.offset + u.numel);
  const float* shard = shard_.data();
  const std::vector<size_t>* counts = &ctx_.shards.unit_counts[unit];
  OpCollectives* collectives = &ctx_.collectives;
  slot.ticket = ctx_.thread.submit([collectives, impl = impl_, buf, a, b, shard, lo, u, counts] {
    if (b > a) op_copy(impl, buf + (a - u.offset), shard + (a - lo), (b - a) * sizeof(float));
    collectives->all_gather(buf, *counts);
  });
}

const float* ParamShards::acquire(int unit, int next_unit) {
  if (ctx_.options.zero_stage < 3) return ctx_.model.params() + units_[unit].offset;
  Slot* s = find_slot(unit);
  if (!s) {
    s = &free_slot(unit);
    start_gather(*s, unit);
  }
  s->in_use = true;
  if (next_unit >= 0 && !find_slot(next_unit) && !(next_unit == 0 && emb_slot_.in_use))
    start_gather(free_slot(next_unit), next_unit);  // fetched while this unit computes
  ctx_.thread.wait(s->ticket);
  return s->buf.data();
}

void ParamShards::release(int unit) {
  if (ctx_.options.zero_stage < 3) return;
  Slot* s = find_slot(unit);
  ANVIL_CHECK(s && s->in_use, "unit {} released without being acquired", unit);
  s->in_use = false;
}

}  // namespace anvil
