// How the flat parameter array is cut among the ranks of a data-parallel group (ZeRO's shards):
// W contiguous, even ranges, rank r holding the r-th. The layout is arithmetic alone, so that the
// parameter sharding, the gradient reduction and the checkpoint writer agree on it by
// construction; a group that splits the model itself (tensor or pipeline parallelism) hands its
// data-parallel group the array of its own part, and the layout is the same over that.
#pragma once
#include <cstddef>
#include <utility>
#include <vector>

#include "model/model.h"

namespace anvil {

struct ShardLayout {
  // The model's parameters over a group of `ranks`, for `rank` of it.
  ShardLayout(const Model& model, int ranks, int rank, int zero_stage);

  size_t n = 0;                 // parameters
  std::vector<size_t> counts;   // [rank]: its shard's size
  size_t shard_lo = 0, shard_hi = 0;  // this rank's shard: what it checkpoints, and owns under ZeRO-1..3
  // What this rank updates and keeps optimizer state for: its shard, or under ZeRO-0 everything.
  size_t lo = 0, hi = 0;
  std::vector<std::vector<size_t>> unit_counts;        // [unit][rank]: the unit's part in each shard
  std::vector<std::pair<size_t, size_t>> unit_tensors;  // [unit]: its tensors' index range [first, end)

  // The part of [a, a + count) inside each rank's shard, in rank order.
  std::vector<size_t> split(size_t a, size_t count) const;
};

}  // namespace anvil
