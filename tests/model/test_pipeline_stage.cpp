// Pipeline stages (ModelStorage::stage): a model cut into stages, each a model of its own blocks,
// run stage after stage with the activations and their gradients handed over in host memory,
// must give the whole model's losses and parameter gradients to the bit, for each family's
// options, dropout and packed positions included, in fp32 and with bf16 products. A stage holds
// only its own units and initialises them to the whole model's values.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "compare.h"
#include "core/error.h"
#include "core/targets.h"
#include "model/decoder.h"
#include "tiny_models.h"

namespace anvil {
namespace {

constexpr int kStageBatch = 2, kStageSeq = 24;

// Each family's tiny model with 5 blocks; dropout everywhere; the Llama with per-head QK norms;
// the Mixtral with 4 SwiGLU experts of which each token takes 2, a capacity that skips some of
// its choices, and a balancing loss (which Mixtral itself leaves off) whose gradient reaches the
// routers of every stage.
ModelConfig staged_model(ModelFamily family) {
  const bool moe = family == ModelFamily::kMixtral;
  ModelConfig c = testing::tiny_model(moe ? ModelFamily::kLlama : family, kStageSeq);
  c.n_layers = 5;
  c.emb_pdrop = c.attn_pdrop = c.resid_pdrop = 0.1f;
  if (family == ModelFamily::kLlama) c.qk_norm = QkNorm::kPerHead;
  if (moe) {
    c.name = family;
    c.moe = {4, 2, 1.0f, 1.0f, 0.1f};
  }
  return c;
}

// Three stages of uneven size.
const std::vector<PipelineStage> kStages = {{0, 1}, {1, 3}, {3, 5}};

struct StageData {
  std::vector<int32_t> tokens, targets, positions;
};

StageData stage_data() {
  StageData b;
  for (int i = 0; i < kStageBatch * kStageSeq; i++) {
    b.tokens.push_back((i * 37 + 11) % 97);
    b.targets.push_back(i % 7 == 3 ? kIgnoreIndex : (i * 53 + 5) % 97);
    // Two packed examples in each sequence: positions restart at token 10.
    b.positions.push_back(i % kStageSeq < 10 ? i % kStageSeq : i % kStageSeq - 10);
  }
  return b;
}

// Each tensor's values (by name) of a model's own array.
std::map<std::string, std::vector<float>> by_name(const Model& m, const float* array) {
  std::map<std::string, std::vector<float>> out;
  for (const ParamTensor& t : m.tensors()) out[t.name].assign(array + t.offset, array + t.offset + t.numel);
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class PipelineStages : public ::testing::TestWithParam<std::tuple<ModelFamily, ComputeDtype, bool>> {
 protected:
  ModelConfig cfg_ = staged_model(std::get<0>(GetParam()));
  ComputeDtype dtype_ = std::get<1>(GetParam());
  bool packed_ = std::get<2>(GetParam());
  StageData data_ = stage_data();
  const int32_t* positions() const { return packed_ ? data_.positions.data() : nullptr; }

  std::vector<std::unique_ptr<Model>> stages() const {
    std::vector<std::unique_ptr<Model>> out;
    for (const PipelineStage& s : kStages) {
      ModelStorage storage;
      storage.stage = s;
      out.push_back(make_model(cfg_, kStageBatch, kStageSeq, storage));
      out.back()->init_weights(7);
      out.back()->set_compute_dtype(dtype_);
      out.back()->zero_grad();
      out.back()->set_dropout_position({42, 3, 5});
    }
    return out;
  }
};

TEST_P(PipelineStages, HoldTheirOwnUnitsAtTheWholeModelsInitialValues) {
  Decoder whole(cfg_, kStageBatch, kStageSeq);
  whole.init_weights(7);
  const auto want = by_name(whole, whole.params());
  std::map<std::string, int> held;
  for (const auto& stage : stages()) {
    size_t expected_offset = 0;
    int unit = -1;
    for (const ParamTensor& t : stage->tensors()) {
      EXPECT_EQ(t.offset, expected_offset) << t.name;
      expected_offset += t.numel;
      EXPECT_TRUE(t.unit == unit || t.unit == unit + 1) << t.name << ": units numbered from 0, in order";
      unit = t.unit;
      held[t.name]++;
    }
    EXPECT_EQ(static_cast<size_t>(unit) + 1, stage->units().size());
    EXPECT_EQ(stage->num_params(), expected_offset);
    for (const auto& [name, values] : by_name(*stage, stage->params()))
      EXPECT_TRUE(same_bits(values, want.at(name))) << name;
  }
  // Every tensor on one stage; the embedding unit on the last stage too when its head is tied to
  // the token embedding.
  for (const ParamTensor& t : whole.tensors())
    EXPECT_EQ(held[t.name], t.unit == 0 && cfg_.tied_embeddings ? 2 : 1) << t.name;
}

TEST_P(PipelineStages, GiveTheWholeModelsLossesAndGradients) {
  Decoder whole(cfg_, kStageBatch, kStageSeq);
  whole.init_weights(7);
  whole.set_compute_dtype(dtype_);
  whole.zero_grad();
  whole.set_dropout_position({42, 3, 5});
  int64_t want_targets = 0;
  const double want = whole.forward_backward(data_.tokens.data(), data_.targets.data(), kStageBatch, kStageSeq, 0.25f,
                                             &want_targets, positions());
  const std::vector<float> want_losses(whole.losses(), whole.losses() + kStageBatch * kStageSeq);
  const auto want_grads = by_name(whole, whole.grads());

  auto st = stages();
  const size_t rows = static_cast<size_t>(kStageBatch) * kStageSeq * cfg_.d_model;
  std::vector<std::vector<float>> acts(st.size(), std::vector<float>(rows));  // [s]: stage s's output
  for (size_t s = 0; s < st.size(); s++)
    st[s]->stage_forward(s == 0 ? data_.tokens.data() : nullptr, positions(), s == 0 ? nullptr : acts[s - 1].data(),
                         kStageBatch, kStageSeq, data_.targets.data(), s + 1 < st.size() ? acts[s].data() : nullptr);
  std::vector<float> dout, din(rows);
  int64_t n_targets = 0;
  double loss = 0;
  for (size_t s = st.size(); s-- > 0;) {
    const bool last = s + 1 == st.size();
    const double r = st[s]->stage_backward(last ? data_.targets.data() : nullptr, 0.25f,
                                           last ? nullptr : dout.data(), s > 0 ? din.data() : nullptr, &n_targets);
    if (last) loss = r;
    dout = din;
  }
  // The whole model's sum holds the balancing loss; each stage reports its own blocks'.
  const Model::MoeStats want_moe = whole.moe_stats();
  std::vector<double> balance;
  int64_t choices = 0, skipped = 0;
  for (const auto& stage : st) {
    const Model::MoeStats moe = stage->moe_stats();
    balance.insert(balance.end(), moe.balance.begin(), moe.balance.end());
    choices += moe.choices;
    skipped += moe.skipped;
  }
  EXPECT_EQ(balance, want_moe.balance);
  EXPECT_EQ(choices, want_moe.choices);
  EXPECT_EQ(skipped, want_moe.skipped);
  if (cfg_.has_moe()) {
    EXPECT_EQ(want_moe.balance.size(), static_cast<size_t>(cfg_.n_layers) * kStageBatch);
    EXPECT_GT(want_moe.balance_loss(), 0.0);
    EXPECT_GT(skipped, 0) << "the capacity skips none of the choices: make it smaller";
    EXPECT_LT(skipped, choices);
  }
  EXPECT_EQ(loss + want_moe.balance_loss(), want);
  EXPECT_EQ(n_targets, want_targets);
  EXPECT_TRUE(same_bits(std::vector<float>(st.back()->losses(), st.back()->losses() + kStageBatch * kStageSeq), want_losses));

  // A tied head's embedding unit is on the first and the last stage: its gradient is the sum of
  // theirs (the last stage's position table, which it does not use, has none).
  std::map<std::string, std::vector<float>> sums;
  for (const auto& stage : st)
    for (const auto& [name, grad] : by_name(*stage, stage->grads())) {
      auto& sum = sums[name];
      sum.resize(grad.size());
      for (size_t i = 0; i < grad.size(); i++) sum[i] += grad[i];
    }
  for (const auto& [name, grad] : sums) {
    if (name == "wte" && cfg_.tied_embeddings) {
      // The whole model adds the head's and the embedding's contributions into one fp32 array,
      // sequence by sequence, in another order than this sum (training sums them in fixed point,
      // where the order cannot matter).
      EXPECT_TRUE(testing::all_close(grad.data(), want_grads.at(name).data(), grad.size(),
                                     testing::kFp32Elementwise));
    } else {
      EXPECT_TRUE(same_bits(grad, want_grads.at(name))) << name;
    }
  }
}

// The model's own arrays, counting what the backward pass says of each unit: the gradient
// reduction of data parallelism reduces a unit when it is done, so each unit a stage holds must
// be done exactly once per backward pass.
class CountingAccess : public UnitAccess {
 public:
  explicit CountingAccess(Model& m) : m_(m), done(m.units().size(), 0) {}
  const float* acquire_params(int unit, int) override { return m_.params() + m_.units()[unit].offset; }
  void release_params(int) override {}
  float* grads(int unit, size_t offset, size_t, int sequences) override {
    EXPECT_EQ(sequences, 1) << "the CPU's grains are one sequence";
    return m_.grads() + m_.units()[unit].offset + offset;
  }
  void grain_done(int, size_t, size_t, int) override {}
  void grain_rows(int, size_t, float*, const int32_t*, const int32_t*, size_t, size_t) override {}
  void grads_done(int unit) override { done[unit]++; }

 private:
  Model& m_;

 public:
  std::vector<int> done;
};

TEST_P(PipelineStages, FinishEachUnitsGradientOnce) {
  auto st = stages();
  std::vector<std::unique_ptr<CountingAccess>> counts;
  for (auto& m : st) {
    counts.push_back(std::make_unique<CountingAccess>(*m));
    m->set_unit_access(counts.back().get());
  }
  const size_t rows = static_cast<size_t>(kStageBatch) * kStageSeq * cfg_.d_model;
  std::vector<std::vector<float>> acts(st.size(), std::vector<float>(rows));
  for (size_t s = 0; s < st.size(); s++)
    st[s]->stage_forward(s == 0 ? data_.tokens.data() : nullptr, positions(), s == 0 ? nullptr : acts[s - 1].data(),
                         kStageBatch, kStageSeq, data_.targets.data(), s + 1 < st.size() ? acts[s].data() : nullptr);
  std::vector<float> dout, din(rows);
  for (size_t s = st.size(); s-- > 0;) {
    const bool last = s + 1 == st.size();
    st[s]->stage_backward(last ? data_.targets.data() : nullptr, 0.25f, last ? nullptr : dout.data(),
                          s > 0 ? din.data() : nullptr, nullptr);
    dout = din;
  }
  for (size_t s = 0; s < st.size(); s++)
    EXPECT_EQ(counts[s]->done, std::vector<int>(st[s]->units().size(), 1)) << "stage " << s;
}

TEST_P(PipelineStages, EvaluateAsTheWholeModel) {
  Decoder whole(cfg_, kStageBatch, kStageSeq);
  whole.init_weights(7);
  whole.set_compute_dtype(dtype_);
  const double want = whole.forward(data_.tokens.data(), data_.targets.data(), kStageBatch, kStageSeq, nullptr, positions());
  auto st = stages();
  const size_t rows = static_cast<size_t>(kStageBatch) * kStageSeq * cfg_.d_model;
  std::vector<float> in, out(rows);
  for (size_t s = 0; s < st.size(); s++) {
    st[s]->stage_forward(s == 0 ? data_.tokens.data() : nullptr, positions(), s == 0 ? nullptr : in.data(), kStageBatch, kStageSeq,
                         nullptr, s + 1 < st.size() ? out.data() : nullptr);
    in = out;
  }
  EXPECT_EQ(st.back()->stage_loss(data_.targets.data(), nullptr), want);
}

INSTANTIATE_TEST_SUITE_P(
    Families, PipelineStages,
    ::testing::Combine(::testing::Values(ModelFamily::kGpt2, ModelFamily::kMpt, ModelFamily::kLlama,
                                         ModelFamily::kMixtral),
                       ::testing::Values(ComputeDtype::kFp32, ComputeDtype::kBf16), ::testing::Bool()),
    [](const auto& info) {
      const ModelFamily f = std::get<0>(info.param);
      return std::string(f == ModelFamily::kGpt2 ? "gpt2" : f == ModelFamily::kMpt ? "mpt"
                         : f == ModelFamily::kLlama ? "llama" : "mixtral") +
             (std::get<1>(info.param) == ComputeDtype::kFp32 ? "_fp32" : "_bf16") +
             (std::get<2>(info.param) ? "_packed" : "");
    });

TEST(PipelineStage, BadStagesAndWholeModelPassesFailClearly) {
  const ModelConfig cfg = staged_model(ModelFamily::kGpt2);
  for (const PipelineStage bad : {PipelineStage{2, 2}, PipelineStage{-1, 2}, PipelineStage{3, 6}}) {
    ModelStorage storage;
    storage.stage = bad;
    try {
      make_model(cfg, 1, kStageSeq, storage);
      ADD_FAILURE() << "stage [" << bad.first_layer << ", " << bad.end_layer << ") accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("expected a nonempty range of the model's 5 blocks"), std::string::npos)
          << e.what();
    }
  }
  ModelStorage storage;
  storage.stage = {1, 3};
  auto middle = make_model(cfg, 1, kStageSeq, storage);
  const StageData b = stage_data();
  try {
    middle->forward(b.tokens.data(), b.targets.data(), 1, kStageSeq, nullptr);
    ADD_FAILURE() << "a stage ran the whole model's forward";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("forward runs the whole model; this one is the pipeline stage of blocks "
                                         "[1, 3)"), std::string::npos) << e.what();
  }
  std::vector<float> in(static_cast<size_t>(kStageSeq) * cfg.d_model), out(in.size());
  try {
    middle->stage_forward(b.tokens.data(), nullptr, nullptr, 1, kStageSeq, b.targets.data(), out.data());
    ADD_FAILURE() << "a middle stage started from tokens";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("starts from the previous stage's output"), std::string::npos) << e.what();
  }
  try {
    middle->stage_backward(nullptr, 1.0f, out.data(), in.data(), nullptr);
    ADD_FAILURE() << "a backward pass without its forward pass";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs a training stage_forward"), std::string::npos) << e.what();
  }
  ModelConfig lora = cfg;
  lora.lora.r = 4;
  lora.lora.target_modules = {"all-linear"};
  storage.stage = {0, 2};
  try {
    make_model(lora, 1, kStageSeq, storage);
    ADD_FAILURE() << "a LoRA model was split into stages";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a LoRA model is one pipeline stage"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace anvil
