// Tensor parallelism (model/tensor_parallel.h): R models, each holding one rank's share of every
// block and running in lockstep with the others (here threads of one process, exchanging through
// queues), must give the whole model's losses and, for what each holds, its parameter gradients,
// to the bit, for each family's options, dropout included, in fp32 and with bf16 products.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/targets.h"
#include "kernels/crossentropy.h"
#include "kernels/matmul.h"
#include "model/decoder.h"
#include "model/tensor_parallel.h"
#include "tiny_models.h"

namespace anvil {
namespace {

// Three sequences over two ranks: each rank holds 36 rows of the residual stream (sequence
// parallelism), the second sequence's rows on both.
constexpr int kBatch = 3, kSeq = 24, kRanks = 2;

// Each family's tiny model, wide enough that a rank's share of each product's k is a whole
// number of the GEMM's k blocks: 4 heads of 128 (the Llama 2 key/value heads of 256 beside 4
// query heads of 256, and a SwiGLU width of 512); a vocabulary of two and a half of the
// cross-entropy's sum blocks (the ranks' slices unequal, the second's rows 8 floats off a 16-float
// alignment); dropout everywhere.
constexpr int kWideVocab = 2 * kCrossentropySumBlock + 904;

ModelConfig wide_model(ModelFamily family) {
  ModelConfig c = testing::tiny_model(family, kSeq);
  c.d_model = 512;
  c.vocab_size = kWideVocab;
  c.emb_pdrop = c.attn_pdrop = c.resid_pdrop = 0.1f;
  if (family == ModelFamily::kMpt) c.qk_norm = QkNorm::kWhole;  // qk_ln: its norms span the ranks
  if (family == ModelFamily::kQwen3) {  // a Llama with per-head QK norms
    c = wide_model(ModelFamily::kLlama);
    c.name = family;
    c.qk_norm = QkNorm::kPerHead;
  }
  if (family == ModelFamily::kLlama) {
    c.head_dim = 256;
    c.mlp_hidden = 512;
  }
  return c;
}

// The cut that no longer falls on the GEMM's k blocks (tensor_k_chain): 12 heads of 32 over a width
// of 384 and an MLP of 1152 (GPT-2 124M's shape, narrowed), the Llamas' 6 key/value heads. Over 2
// ranks a rank's query channels are 192: the attention's output product's first block straddles
// the ranks (rank 0 never adds a block of it), and qkv's input gradient mixes its parts' blocks
// across the ranks; over 3 ranks, 128 each.
ModelConfig narrow_model(ModelFamily family) {
  ModelConfig c = wide_model(family);
  c.d_model = 384;
  c.n_heads = 12;
  c.head_dim = 0;
  c.mlp_hidden = 1152;
  if (c.norm == NormKind::kRmsNorm) c.n_kv_heads = 6;
  return c;
}

// The models and rank counts the fixture runs: wide over 2 ranks, narrow over 2 and 3.
enum class Cut { kWide2, kStraddling2, kStraddling3 };

struct ShareBatch {
  std::vector<int32_t> tokens, targets;
};

ShareBatch share_batch() {
  ShareBatch b;
  for (int i = 0; i < kBatch * kSeq; i++) {
    // Tokens and targets in both ranks' slices; the first sequence's tokens all in the first's.
    b.tokens.push_back(i < kSeq ? (i * 37 + 11) % 97 : (i * 1237 + 11) % kWideVocab);
    b.targets.push_back(i % 7 == 3 ? kIgnoreIndex : (i * 2053 + 5) % kWideVocab);
  }
  return b;
}

bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

// The ranks as threads: each ordered pair of ranks a queue of messages, a send a copy.
class ThreadRanks {
 public:
  void push(int from, int to, const float* data, size_t n) {
    std::lock_guard<std::mutex> lock(mutex_);
    queues_[{from, to}].emplace_back(data, data + n);
    ready_.notify_all();
  }
  void pop(int from, int to, float* data, size_t n) {
    std::unique_lock<std::mutex> lock(mutex_);
    auto& q = queues_[{from, to}];
    ready_.wait(lock, [&] { return !q.empty(); });
    ANVIL_CHECK(q.front().size() == n, "rank {} expected {} floats from rank {}, got {}", to, n, from,
                q.front().size());
    std::memcpy(data, q.front().data(), n * sizeof(float));
    q.pop_front();
  }
  bool drained() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [pair, q] : queues_)
      if (!q.empty()) return false;
    return true;
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::map<std::pair<int, int>, std::deque<std::vector<float>>> queues_;
};

// A send is taken at once (a copy), but as over MPI its buffer must stay unchanged until
// wait_sends: wait_sends checks that it did.
class ThreadExchange : public TensorExchange {
 public:
  ThreadExchange(ThreadRanks& ranks, int n, int rank) : all_(ranks), n_(n), rank_(rank) {}
  int ranks() const override { return n_; }
  int rank() const override { return rank_; }
  void send(int to, const float* data, size_t n) override {
    all_.push(rank_, to, data, n);
    in_flight_.push_back({data, std::vector<float>(data, data + n)});
  }
  void receive(int from, float* data, size_t n) override { all_.pop(from, rank_, data, n); }
  void wait_sends() override {
    for (const auto& [data, sent] : in_flight_)
      EXPECT_TRUE(same_bits(data, sent.data(), sent.size())) << "rank " << rank_ << " changed a send's buffer before "
                                                             << "wait_sends";
    in_flight_.clear();
  }
  void broadcast(float* data, size_t n, int root) override {
    if (rank_ != root) return receive(root, data, n);
    for (int r = 0; r < n_; r++)
      if (r != root) all_.push(rank_, r, data, n);
  }
  void all_gather(float* data, const std::vector<size_t>& counts) override {
    ASSERT_EQ(counts.size(), static_cast<size_t>(n_));
    size_t at = 0;
    for (int r = 0; r < n_; r++) {
      broadcast(data + at, counts[r], r);
      at += counts[r];
    }
  }

 private:
  ThreadRanks& all_;
  int n_, rank_;
  std::vector<std::pair<const float*, std::vector<float>>> in_flight_;
};


class TensorParallel : public ::testing::TestWithParam<std::tuple<ModelFamily, ComputeDtype, Cut>> {
 protected:
  Cut cut_ = std::get<2>(GetParam());
  ModelConfig cfg_ = cut_ == Cut::kWide2 ? wide_model(std::get<0>(GetParam())) : narrow_model(std::get<0>(GetParam()));
  int ranks_ = cut_ == Cut::kStraddling3 ? 3 : 2;
  ComputeDtype dtype_ = std::get<1>(GetParam());
  ShareBatch data_ = share_batch();

  // The whole model after a training pass.
  std::unique_ptr<Model> whole() const {
    auto m = make_model(cfg_, kBatch, kSeq, testing::storage_on(KernelImpl::kCpu));
    m->init_weights(7);
    m->set_compute_dtype(dtype_);
    m->zero_grad();
    m->set_dropout_position({42, 3, 5});
    return m;
  }
  // Rank r's share of `from`'s parameters.
  std::unique_ptr<Model> share(const Model& from, int r, bool checkpointing = false) const {
    ModelStorage storage = testing::storage_on(KernelImpl::kCpu);
    storage.activation_checkpointing = checkpointing;
    auto m = make_model(tensor_share_config(cfg_, ranks_, r), kBatch, kSeq, storage);
    take_share(cfg_, m->config(), from.params(), m->params());
    m->set_compute_dtype(dtype_);
    m->zero_grad();
    m->set_dropout_position({42, 3, 5});
    return m;
  }
  // pass(model, rank) on every rank at once.
  template <class Pass>
  void run_ranks(std::vector<std::unique_ptr<Model>>& shares, const Pass& pass) {
    ThreadRanks queues;
    std::vector<std::unique_ptr<ThreadExchange>> exchanges;
    std::vector<std::thread> threads;
    std::vector<std::string> errors(shares.size());
    for (int r = 0; r < ranks_; r++) {
      exchanges.push_back(std::make_unique<ThreadExchange>(queues, ranks_, r));
      shares[r]->set_tensor_exchange(exchanges.back().get());
    }
    for (int r = 0; r < ranks_; r++)
      threads.emplace_back([&, r] {
        try {
          pass(*shares[r], r);
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < ranks_; r++) EXPECT_EQ(errors[r], "") << "rank " << r;
    EXPECT_TRUE(queues.drained()) << "a message was sent and never received";
  }
  // A training pass on the whole model and on its shares (built with activation checkpointing or
  // not): the same losses, and each share's gradients its part of the whole's.
  void train_and_compare(bool checkpointing);
};

// With activation checkpointing on the ranks too (their recomputed blocks exchange rows again).
TEST_P(TensorParallel, GiveTheWholeModelsLossesAndGradients) {
  for (bool checkpointing : {false, true}) {
    SCOPED_TRACE(checkpointing ? "activation checkpointing" : "activations kept");
    train_and_compare(checkpointing);
  }
}

// Sequence parallelism: a share keeps its rows of the residual stream and of the norms'
// activations, besides its columns of the products' and its vocabulary's logits. The bar
// is 55% of one process's at 2 ranks; this vocabulary's slices are unequal (4096 and 902 ids), so
// the bar applies to the ranks' mean (measured on the wide models: GPT-2 and MPT 56.5% and 51.2%,
// Llama 54.1% and 48.6%). Over 3 ranks, 40% (measured: 38.5% for GPT-2 and MPT, 37.8% for the
// Llamas; the whole rows a share gathers for a product are the rest over a third).
TEST_P(TensorParallel, HoldAtMost55PercentOfTheActivations) {
  auto w = whole();
  double sum = 0;
  for (int r = 0; r < ranks_; r++) sum += static_cast<double>(share(*w, r)->activation_bytes());
  EXPECT_LE(sum / ranks_ / w->activation_bytes(), ranks_ == 2 ? 0.55 : 0.40);
}

void TensorParallel::train_and_compare(bool checkpointing) {
  auto w = whole();
  const double want = w->forward_backward(data_.tokens.data(), data_.targets.data(), kBatch, kSeq, 0.25f, nullptr);
  std::vector<std::unique_ptr<Model>> shares;
  for (int r = 0; r < ranks_; r++) shares.push_back(share(*w, r, checkpointing));
  std::vector<double> got(ranks_);
  run_ranks(shares, [&](Model& m, int r) {
    got[r] = m.forward_backward(data_.tokens.data(), data_.targets.data(), kBatch, kSeq, 0.25f, nullptr);
  });
  const size_t n = static_cast<size_t>(kBatch) * kSeq;
  for (int r = 0; r < ranks_; r++) {
    EXPECT_EQ(got[r], want) << "rank " << r;
    EXPECT_TRUE(same_bits(shares[r]->losses(), w->losses(), n)) << "rank " << r;
    // Each rank's gradients are its share of the whole model's, the replicated tensors' whole.
    std::vector<float> expected(shares[r]->num_params());
    take_share(cfg_, shares[r]->config(), w->grads(), expected.data());
    for (const ParamTensor& t : shares[r]->tensors())
      EXPECT_TRUE(same_bits(shares[r]->grads() + t.offset, expected.data() + t.offset, t.numel))
          << "rank " << r << ": " << t.name;
  }
}

TEST_P(TensorParallel, EvaluateAsTheWholeModel) {
  auto w = whole();
  const double want = w->forward(data_.tokens.data(), data_.targets.data(), kBatch, kSeq, nullptr);
  std::vector<std::unique_ptr<Model>> shares;
  for (int r = 0; r < ranks_; r++) shares.push_back(share(*w, r));
  std::vector<double> got(ranks_);
  run_ranks(shares, [&](Model& m, int r) {
    got[r] = m.forward(data_.tokens.data(), data_.targets.data(), kBatch, kSeq, nullptr);
  });
  for (int r = 0; r < ranks_; r++) EXPECT_EQ(got[r], want) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(
    Families, TensorParallel,
    ::testing::Combine(::testing::Values(ModelFamily::kGpt2, ModelFamily::kMpt, ModelFamily::kLlama,
                                         ModelFamily::kQwen3),
                       ::testing::Values(ComputeDtype::kFp32, ComputeDtype::kBf16),
                       ::testing::Values(Cut::kWide2, Cut::kStraddling2, Cut::kStraddling3)),
    [](const auto& info) {
      const ModelFamily f = std::get<0>(info.param);
      const char* name = f == ModelFamily::kGpt2   ? "gpt2"
                         : f == ModelFamily::kMpt  ? "mpt"
                         : f == ModelFamily::kLlama ? "llama"
                                                    : "qwen3";
      const Cut cut = std::get<2>(info.param);
      return std::string(name) + (std::get<1>(info.param) == ComputeDtype::kFp32 ? "_fp32" : "_bf16") +
             (cut == Cut::kWide2 ? "" : cut == Cut::kStraddling2 ? "_straddling_2_ranks" : "_straddling_3_ranks");
    });

// The shares a model is cut into: tensor parallelism's of GPT-2 and Llama, expert parallelism's
// of a mixture of experts (4 experts, a rank's 2).
std::vector<std::pair<ModelConfig, std::vector<ModelConfig>>> models_and_shares() {
  std::vector<std::pair<ModelConfig, std::vector<ModelConfig>>> out;
  for (ModelFamily f : {ModelFamily::kGpt2, ModelFamily::kLlama}) {
    const ModelConfig cfg = wide_model(f);
    out.push_back({cfg, {}});
    for (int r = 0; r < kRanks; r++) out.back().second.push_back(tensor_share_config(cfg, kRanks, r));
  }
  ModelConfig moe = testing::tiny_model(ModelFamily::kMpt, kSeq);
  moe.moe.experts = 4;
  moe.moe.top_k = 2;
  out.push_back({moe, {}});
  for (int r = 0; r < kRanks; r++) out.back().second.push_back(expert_share_config(moe, kRanks, r));
  return out;
}

// The shares cover the whole model: every rank's share put back rebuilds it.
TEST(TensorShare, SharesPutBackAreTheWholeModel) {
  for (const auto& [cfg, shares] : models_and_shares()) {
    const size_t n = model_num_params(cfg);
    std::vector<float> whole(n), rebuilt(n, -1.0f);
    for (size_t i = 0; i < n; i++) whole[i] = static_cast<float>(i);
    for (const ModelConfig& s : shares) {
      std::vector<float> share(model_num_params(s));
      take_share(cfg, s, whole.data(), share.data());
      put_share(cfg, s, share.data(), rebuilt.data());
      EXPECT_LT(share.size(), n);
      // A range of the whole array alone: its values from the share where the share holds them.
      const size_t lo = n / 3 + 5, hi = 2 * n / 3 + 11;
      std::vector<float> part(hi - lo, -1.0f), want(hi - lo, -1.0f), only(n, -1.0f);
      put_share(cfg, s, share.data(), only.data());
      std::copy(only.begin() + static_cast<std::ptrdiff_t>(lo), only.begin() + static_cast<std::ptrdiff_t>(hi),
                want.begin());
      put_share_range(cfg, s, share.data(), lo, hi, part.data());
      EXPECT_EQ(part, want);
    }
    EXPECT_EQ(rebuilt, whole);
  }
}

// An expert share holds its experts' weights alone, and every other tensor whole.
TEST(TensorShare, ExpertShareHoldsItsExperts) {
  ModelConfig cfg = testing::tiny_model(ModelFamily::kMpt, kSeq);
  cfg.moe.experts = 4;
  cfg.moe.top_k = 2;
  const ModelConfig s = expert_share_config(cfg, 2, 1);
  EXPECT_EQ(s.held_experts(), 2);
  EXPECT_EQ(s.first_expert(), 2);
  const std::vector<ParamTensor> whole = model_param_layout(cfg), share = model_param_layout(s);
  std::vector<float> values(model_num_params(cfg)), mine(model_num_params(s));
  for (size_t i = 0; i < values.size(); i++) values[i] = static_cast<float>(i);
  take_share(cfg, s, values.data(), mine.data());
  for (size_t k = 0; k < whole.size(); k++) {
    const bool expert = whole[k].name.ends_with(".fcw") || whole[k].name.ends_with(".fcprojw");
    EXPECT_EQ(share_cut(s, whole[k].name), expert) << whole[k].name;
    EXPECT_EQ(share[k].numel, expert ? whole[k].numel / 2 : whole[k].numel) << whole[k].name;
    // Experts 2 and 3: the second half of the whole tensor.
    const size_t first = whole[k].offset + (expert ? whole[k].numel / 2 : 0);
    EXPECT_EQ(mine[share[k].offset], values[first]) << whole[k].name;
    EXPECT_EQ(mine[share[k].offset + share[k].numel - 1], values[first + share[k].numel - 1]) << whole[k].name;
  }
}

// A share's initial values, formed alone, are its part of the whole model's.
TEST(TensorShare, InitialValuesAreTheWholeModelsPart) {
  for (const auto& [cfg, shares] : models_and_shares()) {
    std::vector<float> whole(model_num_params(cfg));
    model_init_params(model_param_layout(cfg), 17, 0, whole.size(), whole.data());
    for (const ModelConfig& s : shares) {
      const size_t n = model_num_params(s);
      std::vector<float> want(n), got(n, -1.0f);
      take_share(cfg, s, whole.data(), want.data());
      init_share(cfg, s, 17, 0, n, got.data());
      EXPECT_TRUE(same_bits(got.data(), want.data(), n)) << "rank " << s.tensor_rank << s.expert_rank;
      // A range of it alone (a ZeRO-3 shard's), cut inside tensors.
      const size_t lo = n / 3 + 5, hi = 2 * n / 3 + 11;
      std::vector<float> part(hi - lo, -1.0f);
      init_share(cfg, s, 17, lo, hi, part.data());
      EXPECT_TRUE(same_bits(part.data(), want.data() + lo, hi - lo)) << "rank " << s.tensor_rank << s.expert_rank;
    }
  }
}

// The vocabulary goes in whole sum blocks, as evenly as they divide, the partial last block to
// the last rank: GPT-2's padded 50304 ids are 25 blocks (24 and 1152 ids).
TEST(TensorShare, VocabularySlicesAreWholeSumBlocks) {
  const int b = kCrossentropySumBlock;
  for (auto [ranks, rank, first, size] : {std::tuple{2, 0, 0, 13 * b}, std::tuple{2, 1, 13 * b, 50304 - 13 * b},
                                           std::tuple{4, 0, 0, 7 * b}, std::tuple{4, 1, 7 * b, 6 * b},
                                           std::tuple{4, 3, 19 * b, 50304 - 19 * b}, std::tuple{1, 0, 0, 50304}}) {
    const VocabSlice s = tensor_vocab_slice(50304, ranks, rank);
    EXPECT_EQ(s.first, first) << ranks << " ranks, rank " << rank;
    EXPECT_EQ(s.size, size) << ranks << " ranks, rank " << rank;
  }
  const ModelConfig share = tensor_share_config(wide_model(ModelFamily::kGpt2), 2, 1);
  EXPECT_EQ(share.vocab_first, 2 * b);
  EXPECT_EQ(share.vocab_size, kWideVocab - 2 * b);
  EXPECT_EQ(share.whole_vocab(), kWideVocab);
}

// The chain's pieces are the GEMM's k blocks of the whole product: a rank's whole blocks in one
// run, a straddling block assembled at the rank holding its end.
TEST(TensorShare, KChainPiecesAreTheGemmsBlocks) {
  auto show = [](const std::vector<KChainPiece>& pieces) {
    std::ostringstream out;
    for (const KChainPiece& p : pieces) {
      out << p.rank << ":";
      for (const KSegment& s : p.segments) out << " " << s.rank << "[" << s.local << "+" << s.len << ")";
      out << "; ";
    }
    return out.str();
  };
  const int b = kMatmulSumBlock;
  EXPECT_EQ(show(tensor_k_chain({{0, 0, 2 * b}, {1, 0, 2 * b}})), "0: 0[0+512); 1: 1[0+512); ");
  EXPECT_EQ(show(tensor_k_chain({{0, 0, 192}, {1, 0, 192}})), "1: 0[0+192) 1[0+64); 1: 1[64+128); ");
  EXPECT_EQ(show(tensor_k_chain({{0, 0, 128}, {1, 0, 128}, {2, 0, 128}})), "1: 0[0+128) 1[0+128); 2: 2[0+128); ");
  EXPECT_EQ(show(tensor_k_chain({{0, 0, 640}, {1, 0, 640}})),
            "0: 0[0+512); 1: 0[512+128) 1[0+128); 1: 1[128+512); ");
  // A column-parallel product's parts, each cut among the ranks: a block may end in the next part.
  EXPECT_EQ(show(tensor_k_chain({{0, 0, 192}, {1, 0, 192}, {0, 192, 192}, {1, 192, 192}})),
            "1: 0[0+192) 1[0+64); 0: 1[64+128) 0[192+128); 1: 0[320+64) 1[192+192); ");
}

TEST(TensorShare, WhatCannotBeCutIsNamed) {
  ModelConfig gpt2{12, 12, 768, 50257, 1024};  // GPT-2 124M
  EXPECT_EQ(tensor_parallel_problem(gpt2, 2), "");  // 6 heads of 64 a rank: 384 channels, not whole k blocks
  EXPECT_EQ(tensor_parallel_problem(gpt2, 3), "");
  EXPECT_NE(tensor_parallel_problem(gpt2, 5).find("5 must divide each"), std::string::npos);
  ModelConfig moe = wide_model(ModelFamily::kMpt);
  moe.moe.experts = 4;
  moe.moe.top_k = 2;
  EXPECT_NE(tensor_parallel_problem(moe, 2).find("mixture of experts"), std::string::npos)
      << tensor_parallel_problem(moe, 2);
  EXPECT_EQ(tensor_parallel_problem(moe, 1), "");
  ModelConfig small_vocab = wide_model(ModelFamily::kGpt2);
  small_vocab.vocab_size = kCrossentropySumBlock;
  EXPECT_NE(tensor_parallel_problem(small_vocab, 2).find("vocab_size 2048 must be more than 2048"), std::string::npos)
      << tensor_parallel_problem(small_vocab, 2);
  try {
    tensor_share_config(gpt2, 5, 0);
    ADD_FAILURE() << "GPT-2 124M's 12 heads were cut in 5";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("5 must divide each"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace anvil
