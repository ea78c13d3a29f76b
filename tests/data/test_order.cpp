// The sample order and the loader: the global batch of every step is the same for world sizes
// 1, 2, 3, 4 and 8 and any number of loader workers, across epoch boundaries and several streams
// mixed by proportion; a loader restored from a saved state at any step continues exactly as an
// uninterrupted one; a changed input of the order is refused by name.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <numeric>
#include <set>

#include "core/error.h"
#include "core/targets.h"
#include "data/loader.h"
#include "data/mds.h"
#include "data/sample_order.h"

namespace anvil {
namespace {
namespace fs = std::filesystem;

constexpr int kSeq = 8;

// A dataset whose sample i holds tokens (base + i, base + i, ...): decoded tokens identify it.
void write_dataset(const std::string& dir, int samples, int base, int64_t size_limit) {
  fs::create_directories(dir);
  MdsWriterOptions opt;
  opt.hashes = {"xxh64"};
  opt.size_limit = size_limit;
  MdsWriter w(dir, opt);
  for (int i = 0; i < samples; i++) {
    std::vector<int32_t> t(kSeq + 1, base + i);
    w.write_tokens(t.data(), kSeq + 1);
  }
  w.finish();
}

class OrderTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / fmt::format("anvil-order-{}", ::getpid());
    fs::remove_all(root_);
    write_dataset((root_ / "a").string(), 97, 0, 600);      // several shards of uneven size
    write_dataset((root_ / "b").string(), 41, 1000, 900);
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static std::unique_ptr<StreamingDataset> open() {
    return std::make_unique<StreamingDataset>(
        std::vector<StreamSource>{{"a", "", (root_ / "a").string(), "", 2.0}, {"b", "", (root_ / "b").string(), "", 1.0}},
        StreamingOptions{});
  }
  static OrderSpec spec(const StreamingDataset& d, const std::string& algo) {
    OrderSpec s;
    s.algo = algo;
    s.seed = 42;
    s.block_size = 16;
    s.canonical_nodes = 2;
    s.epoch_size = 150;
    s.streams = {{d.shard_samples(0), 2.0}, {d.shard_samples(1), 1.0}};
    return s;
  }

  // Per step, the global batch's sample ids as ranks 0..W-1 deliver them, concatenated.
  static std::vector<std::vector<int64_t>> run(const std::string& algo, int world, int workers, int steps) {
    auto d = open();
    std::vector<std::unique_ptr<TokenLoader>> ranks;
    for (int r = 0; r < world; r++)
      ranks.push_back(std::make_unique<TokenLoader>(*d, spec(*d, algo), LoaderOptions{kGB, r, world, kSeq, workers}));
    std::vector<std::vector<int64_t>> out;
    const int64_t b = kGB / world;
    std::vector<int32_t> in(static_cast<size_t>(b) * kSeq), tgt(in.size());
    std::vector<int64_t> ids(static_cast<size_t>(b));
    for (int t = 0; t < steps; t++) {
      std::vector<int64_t> step;
      for (auto& l : ranks) {
        l->next(in.data(), tgt.data(), ids.data());
        for (int64_t k = 0; k < b; k++) {
          // The decoded tokens are the sample's own.
          const int32_t want = ids[k] < 97 ? static_cast<int32_t>(ids[k]) : static_cast<int32_t>(1000 + ids[k] - 97);
          EXPECT_EQ(in[k * kSeq], want);
          EXPECT_EQ(tgt[k * kSeq + kSeq - 1], want);
        }
        step.insert(step.end(), ids.begin(), ids.end());
      }
      out.push_back(step);
    }
    return out;
  }

  static constexpr int kGB = 24;
  static inline fs::path root_;
};

TEST_F(OrderTest, GlobalBatchesDoNotDependOnWorldSizeOrWorkers) {
  for (const char* algo : {"py1e", "py1s", "none"}) {
    const auto reference = run(algo, 1, 0, 14);  // 150 / 24 = 6 steps per epoch: crosses two epoch boundaries
    for (int world : {2, 3, 4, 8})
      for (int workers : {0, 1, 3})
        EXPECT_EQ(run(algo, world, workers, 14), reference) << algo << " world " << world << " workers " << workers;
  }
}

TEST_F(OrderTest, OrdersArePermutationsThatChangeByEpoch) {
  auto d = open();
  OrderSpec s = spec(*d, "py1e");
  s.epoch_size = -1;  // the streams' total, shared in proportion to their sizes: each sample once
  s.streams[0].proportion = 97;
  s.streams[1].proportion = 41;
  for (const char* algo : {"none", "py1s", "py1e"}) {
    s.algo = algo;
    const auto e0 = epoch_order(s, 0), e1 = epoch_order(s, 1);
    std::vector<int64_t> sorted = e0;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> all(138);
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(sorted, all) << algo;
    EXPECT_EQ(epoch_order(s, 0), e0) << algo << ": the order must be a pure function";
    if (std::string(algo) == "none") {
      EXPECT_EQ(e0, e1);
    } else {
      EXPECT_NE(e0, e1) << algo;
      EXPECT_NE(e0, all) << algo;
    }
  }
  // Proportions 2:1 over an epoch of 150: 100 draws from a (97 samples: one repeat and 3 more),
  // 50 from b (41 samples: one repeat and 9 more).
  s = spec(*d, "py1e");
  const auto e = epoch_order(s, 3);
  ASSERT_EQ(e.size(), 150u);
  EXPECT_EQ(std::count_if(e.begin(), e.end(), [](int64_t id) { return id < 97; }), 100);
  std::map<int64_t, int> uses;
  for (int64_t id : e) uses[id]++;
  for (int64_t id = 0; id < 138; id++) EXPECT_GE(uses[id], 1) << "every sample is drawn at least once";
}

TEST_F(OrderTest, ResumingAtAnyStepConsumesTheSameSamples) {
  const auto reference = run("py1e", 1, 0, 14);
  for (int stop = 0; stop <= 13; stop++) {
    auto d = open();
    DataState saved;
    {
      TokenLoader first(*d, spec(*d, "py1e"), LoaderOptions{kGB, 0, 2, kSeq, 1});
      std::vector<int32_t> in(12 * kSeq), tgt(in.size());
      for (int t = 0; t < stop; t++) first.next(in.data(), tgt.data());
      saved = DataState::from_json(first.state().to_json(), "test");
    }
    EXPECT_EQ(saved.epoch, stop / 6);
    EXPECT_EQ(saved.sample_in_epoch, (stop % 6) * kGB);
    // Resume on another world size with another worker count.
    std::vector<std::unique_ptr<TokenLoader>> ranks;
    for (int r = 0; r < 4; r++) {
      ranks.push_back(std::make_unique<TokenLoader>(*d, spec(*d, "py1e"), LoaderOptions{kGB, r, 4, kSeq, 2}));
      ranks.back()->restore(saved);
    }
    std::vector<int32_t> in(6 * kSeq), tgt(in.size());
    std::vector<int64_t> ids(6);
    for (int t = stop; t < 14; t++) {
      std::vector<int64_t> step;
      for (auto& l : ranks) {
        l->next(in.data(), tgt.data(), ids.data());
        step.insert(step.end(), ids.begin(), ids.end());
      }
      EXPECT_EQ(step, reference[t]) << "stopped at " << stop << ", step " << t;
    }
  }
}

TEST_F(OrderTest, ResumingWithAChangedInputNamesIt) {
  auto d = open();
  TokenLoader l(*d, spec(*d, "py1e"), LoaderOptions{kGB, 0, 1, kSeq, 0});
  const DataState saved = l.state();
  auto refused = [&](OrderSpec s, int64_t gb, const std::string& what) {
    TokenLoader other(*d, s, LoaderOptions{gb, 0, 1, kSeq, 0});
    try {
      other.restore(saved);
      ADD_FAILURE() << "restore should refuse a changed " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  OrderSpec s = spec(*d, "py1e");
  s.seed = 43;
  refused(s, kGB, "shuffle_seed");
  s = spec(*d, "py1s");
  refused(s, kGB, "shuffle_algo");
  s = spec(*d, "py1e");
  s.block_size = 17;
  refused(s, kGB, "shuffle_block_size");
  s = spec(*d, "py1e");
  s.canonical_nodes = 3;
  refused(s, kGB, "num_canonical_nodes");
  s = spec(*d, "py1e");
  s.streams[1].proportion = 1.5;
  refused(s, kGB, "proportion");
  refused(spec(*d, "py1e"), 12, "global_train_batch_size");
}

TEST_F(OrderTest, BadBatchesAreErrors) {
  auto d = open();
  EXPECT_THROW(TokenLoader(*d, spec(*d, "py1e"), LoaderOptions{25, 0, 2, kSeq, 0}), Error);  // 25 % 2
  EXPECT_THROW(TokenLoader(*d, spec(*d, "py1e"), LoaderOptions{151, 0, 1, kSeq, 0}), Error); // > epoch
}

// LLM Foundry's collator: a sample shorter than max_seq_len is padded, and only its own next-token
// targets carry loss.
TEST_F(OrderTest, ShortSamplesArePaddedWithIgnoredTargets) {
  auto d = open();
  constexpr int T = kSeq + 5;  // samples hold kSeq + 1 = 9 tokens, all equal to the sample's value
  TokenLoader l(*d, spec(*d, "py1e"), LoaderOptions{kGB, 0, 1, T, 0});
  std::vector<int32_t> in(kGB * T), tgt(in.size());
  l.next(in.data(), tgt.data());
  for (int k = 0; k < kGB; k++) {
    const int32_t v = in[k * T];
    for (int i = 0; i < T; i++) {
      EXPECT_EQ(in[k * T + i], i <= kSeq ? v : 0) << "row " << k << " input " << i;
      EXPECT_EQ(tgt[k * T + i], i < kSeq ? v : kIgnoreIndex) << "row " << k << " target " << i;
    }
  }
}

}  // namespace
}  // namespace anvil
