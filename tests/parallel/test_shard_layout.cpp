// ZeRO's shards: even contiguous ranges over the flat parameters, each unit's part in each shard,
// and what a rank updates under each stage.
#include <gtest/gtest.h>

#include <numeric>

#include "model/tiny_models.h"
#include "parallel/shard_layout.h"

namespace anvil {
namespace {

TEST(ShardLayout, EvenContiguousShardsCoverEveryUnit) {
  const std::unique_ptr<Model> model = make_model(testing::tiny_model(ModelFamily::kLlama, 8), 1, 8);
  const size_t n = model->num_params();
  for (int ranks : {1, 2, 3, 7}) {
    size_t next = 0;
    for (int rank = 0; rank < ranks; rank++) {
      const ShardLayout s(*model, ranks, rank, /*zero_stage=*/1);
      EXPECT_EQ(s.n, n);
      EXPECT_EQ(s.shard_lo, next) << "shards are contiguous, in rank order";
      EXPECT_LE(s.counts.front() - s.counts.back(), 1u) << "shards differ by at most one";
      EXPECT_EQ(std::accumulate(s.counts.begin(), s.counts.end(), size_t{0}), n);
      EXPECT_EQ(s.lo, s.shard_lo);
      EXPECT_EQ(s.hi, s.shard_hi);
      next = s.shard_hi;
      // ZeRO-0 updates everything; the checkpoint shard stays the rank's own.
      const ShardLayout all(*model, ranks, rank, 0);
      EXPECT_EQ(all.lo, 0u);
      EXPECT_EQ(all.hi, n);
      EXPECT_EQ(all.shard_lo, s.shard_lo);
      // Each unit's parts over the shards add up to the unit, and each part lies in its shard.
      for (size_t u = 0; u < model->units().size(); u++) {
        const ParamUnit& unit = model->units()[u];
        const std::vector<size_t>& parts = s.unit_counts[u];
        EXPECT_EQ(std::accumulate(parts.begin(), parts.end(), size_t{0}), unit.numel);
        const size_t a = std::max(unit.offset, s.shard_lo), b = std::min(unit.offset + unit.numel, s.shard_hi);
        EXPECT_EQ(parts[rank], b > a ? b - a : 0);
      }
    }
    EXPECT_EQ(next, n);
  }
}

TEST(ShardLayout, EachUnitKnowsItsTensors) {
  const std::unique_ptr<Model> model = make_model(testing::tiny_model(ModelFamily::kGpt2, 8), 1, 8);
  const ShardLayout s(*model, 2, 0, 2);
  const std::vector<ParamTensor>& tensors = model->tensors();
  for (size_t k = 0; k < tensors.size(); k++) {
    const auto [first, end] = s.unit_tensors[tensors[k].unit];
    EXPECT_LE(first, k);
    EXPECT_LT(k, end);
  }
  for (size_t u = 0; u < model->units().size(); u++)
    for (size_t k = s.unit_tensors[u].first; k < s.unit_tensors[u].second; k++)
      EXPECT_EQ(tensors[k].unit, static_cast<int>(u));
}

}  // namespace
}  // namespace anvil
