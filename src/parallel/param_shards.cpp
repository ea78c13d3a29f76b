#include "parallel/param_shards.h"

#include <algorithm>

#include "core/error.h"
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

void ParamShards::init(uint64_t seed) {
  if (ctx_.options.zero_stage == 3) {
    std::vector<float> host(ctx_.shards.hi - ctx_.shards.lo);
    model_init_params(ctx_.model.tensors(), seed, ctx_.shards.lo, ctx_.shards.hi, host.data());
    op_copy_from_host(impl_, shard_.data(), host.data(), host.size() * sizeof(float));
    mark_stale();
  } else {
    ctx_.model.init_weights(seed);
  }
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
