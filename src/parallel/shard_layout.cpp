#include "parallel/shard_layout.h"

#include <algorithm>

#include "parallel/collectives.h"

namespace anvil {

ShardLayout::ShardLayout(const Model& model, int ranks, int rank, int zero_stage) : n(model.num_params()) {
  const std::vector<ParamUnit>& units = model.units();
  const std::vector<ParamTensor>& tensors = model.tensors();
  counts = even_counts(n, ranks);
  for (int r = 0; r < rank; r++) shard_lo += counts[r];
  shard_hi = shard_lo + counts[rank];
  lo = zero_stage == 0 ? 0 : shard_lo;
  hi = zero_stage == 0 ? n : shard_hi;
  for (const ParamUnit& u : units) unit_counts.push_back(split(u.offset, u.numel));
  unit_tensors.assign(units.size(), {tensors.size(), 0});
  for (size_t k = 0; k < tensors.size(); k++) {
    auto& [first, end] = unit_tensors[tensors[k].unit];
    first = std::min(first, k);
    end = std::max(end, k + 1);
  }
}

std::vector<size_t> ShardLayout::split(size_t a, size_t count) const {
  std::vector<size_t> out(counts.size(), 0);
  size_t shard_begin = 0;
  for (size_t r = 0; r < counts.size(); r++) {
    const size_t shard_end = shard_begin + counts[r];
    const size_t from = std::max(a, shard_begin), to = std::min(a + count, shard_end);
    out[r] = to > from ? to - from : 0;
    shard_begin = shard_end;
  }
  return out;
}

}  // namespace anvil
