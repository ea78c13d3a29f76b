// A kept prefix (Model::keep_prefix, then forward_after_prefix): sequences that begin alike, run
// as the shared tokens once and each sequence's rest after them, must give every position after
// the prefix the losses and logits of the whole sequences run by forward(), bit for bit where the
// products' rows are independent (the reference and the CPU kernels): for each family's kind of
// positions (learned, ALiBi, RoPE with grouped-query heads), a sliding window with per-head QK
// norms, one block's activations at a time (activation checkpointing), in fp32 and under bf16's
// rounding.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/targets.h"
#include "kernels/matmul.h"
#include "model/decoder.h"
#include "tiny_models.h"

namespace anvil {
namespace {

enum class Shape { kGpt2, kMpt, kLlama, kWindowQkNorm, kLlamaCheckpointed };

ModelConfig shape_config(Shape s) {
  switch (s) {
    case Shape::kGpt2: return testing::tiny_model(ModelFamily::kGpt2, 48);
    case Shape::kMpt: return testing::tiny_model(ModelFamily::kMpt, 48);
    case Shape::kLlama: return testing::tiny_model(ModelFamily::kLlama, 48);
    case Shape::kLlamaCheckpointed: return testing::tiny_model(ModelFamily::kLlama, 48);
    case Shape::kWindowQkNorm: {
      ModelConfig c = testing::tiny_model(ModelFamily::kLlama, 48);
      c.sliding_window = 6;  // shorter than the prefix: the rows' first keys leave the window
      c.qk_norm = QkNorm::kPerHead;
      return c;
    }
  }
  return {};
}

std::string shape_name(Shape s) {
  switch (s) {
    case Shape::kGpt2: return "gpt2";
    case Shape::kMpt: return "mpt";
    case Shape::kLlama: return "llama";
    case Shape::kWindowQkNorm: return "window_qk_norm";
    case Shape::kLlamaCheckpointed: return "llama_activation_checkpointing";
  }
  return "";
}

class Prefix : public ::testing::TestWithParam<std::tuple<Shape, KernelImpl, ComputeDtype>> {};

TEST_P(Prefix, GivesTheWholeSequencesLossesAndLogits) {
  const ModelConfig cfg = shape_config(std::get<0>(GetParam()));
  std::mt19937 rng(5);
  const auto token = [&] { return static_cast<int32_t>(rng() % 97); };
  constexpr int B = 3, V = 97;
  const std::vector<int> rest = {5, 9, 7};  // each sequence's tokens after the prefix
  const int T = 9;                          // the longest rest; shorter ones padded with 0
  const KernelImpl impl = std::get<1>(GetParam());
  ModelStorage storage = testing::storage_on(impl);
  // one block's activations at a time: the prefix kept as each block runs
  storage.activation_checkpointing = std::get<0>(GetParam()) == Shape::kLlamaCheckpointed;
  Decoder whole(cfg, B, 48, testing::storage_on(impl)), kept(cfg, B, 48, storage);
  whole.init_weights(3);
  std::copy(whole.params(), whole.params() + whole.num_params(), kept.params());
  whole.set_compute_dtype(std::get<2>(GetParam()));
  kept.set_compute_dtype(std::get<2>(GetParam()));
  EXPECT_THROW(kept.forward_after_prefix(nullptr, nullptr, 1, 1, nullptr), Error);  // no prefix yet

  // Twice, the second prefix replacing the first (a longer one, then a shorter one).
  for (const int P : {13, 8}) {
    std::vector<int32_t> prefix(P);
    for (int32_t& t : prefix) t = token();
    const int L = P + T;
    std::vector<int32_t> full(static_cast<size_t>(B) * L, 0), full_targets(full.size(), kIgnoreIndex);
    std::vector<int32_t> after(static_cast<size_t>(B) * T, 0), after_targets(after.size(), kIgnoreIndex);
    for (int b = 0; b < B; b++) {
      std::copy(prefix.begin(), prefix.end(), full.begin() + static_cast<size_t>(b) * L);
      for (int t = 0; t < rest[b]; t++) full[static_cast<size_t>(b) * L + P + t] = after[b * T + t] = token();
      for (int t = 0; t + 1 < rest[b]; t++)
        full_targets[static_cast<size_t>(b) * L + P + t] = after_targets[b * T + t] = full[static_cast<size_t>(b) * L + P + t + 1];
    }
    int64_t n_whole = 0, n_kept = 0;
    const double sum_whole = whole.forward(full.data(), full_targets.data(), B, L, &n_whole);
    const std::vector<float> whole_logits(whole.logits() + static_cast<size_t>(P) * V,
                                          whole.logits() + static_cast<size_t>(L) * V);
    kept.keep_prefix(prefix.data(), P);
    const double sum_kept = kept.forward_after_prefix(after.data(), after_targets.data(), B, T, &n_kept);
    EXPECT_EQ(n_whole, n_kept);
    ASSERT_TRUE(matmul_rows_independent(impl));
    for (int b = 0; b < B; b++)
      for (int t = 0; t < T; t++)
        ASSERT_EQ(kept.losses()[b * T + t], whole.losses()[static_cast<size_t>(b) * L + P + t])
            << "prefix " << P << ", sequence " << b << ", position " << t;
    EXPECT_EQ(sum_kept, sum_whole);
    for (size_t i = 0; i < whole_logits.size(); i++)
      ASSERT_EQ(kept.logits()[i], whole_logits[i]) << "prefix " << P << ", logit " << i;
  }
  std::vector<int32_t> long_rest(41, 1);
  EXPECT_THROW(kept.forward_after_prefix(long_rest.data(), nullptr, 1, 41, nullptr), Error);  // 8 + 41 > 48
  kept.drop_prefix();
  EXPECT_THROW(kept.forward_after_prefix(long_rest.data(), nullptr, 1, 1, nullptr), Error);  // dropped
}

// forward_logits' rows, picked across a padded batch, are the logits forward() gives each
// sequence alone at those positions, bit for bit.
TEST_P(Prefix, PickedRowsAreTheWholeSequencesLogits) {
  const ModelConfig cfg = shape_config(std::get<0>(GetParam()));
  const KernelImpl impl = std::get<1>(GetParam());
  constexpr int B = 3, T = 11, V = 97;
  Decoder batched(cfg, B, 48, testing::storage_on(impl)), alone(cfg, 1, 48, testing::storage_on(impl));
  batched.init_weights(4);
  std::copy(batched.params(), batched.params() + batched.num_params(), alone.params());
  batched.set_compute_dtype(std::get<2>(GetParam()));
  alone.set_compute_dtype(std::get<2>(GetParam()));
  std::mt19937 rng(6);
  std::vector<int32_t> tokens(static_cast<size_t>(B) * T);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % V);
  // More rows than one sequence holds (the head runs in chunks of at most T), out of order,
  // repeated; the chunks come in order.
  std::vector<int64_t> rows = {32, 0, 5, 10, 11, 21, 13, 14, 15, 16, 17, 18, 19, 20, 22, 5};
  std::vector<float> picked(rows.size() * V);
  size_t next = 0;
  batched.forward_logits(tokens.data(), B, T, rows, [&](size_t first, size_t n, const float* logits) {
    ASSERT_EQ(first, next);
    ASSERT_LE(n, static_cast<size_t>(T));
    std::copy(logits, logits + n * V, picked.begin() + static_cast<std::ptrdiff_t>(first * V));
    next = first + n;
  });
  ASSERT_EQ(next, rows.size());
  for (size_t k = 0; k < rows.size(); k++) {
    const int b = static_cast<int>(rows[k] / T), t = static_cast<int>(rows[k] % T);
    alone.forward(tokens.data() + static_cast<size_t>(b) * T, nullptr, 1, T, nullptr);
    for (int v = 0; v < V; v++)
      ASSERT_EQ(picked[k * V + v], alone.logits()[static_cast<size_t>(t) * V + v]) << "row " << rows[k] << ", logit " << v;
  }
  EXPECT_THROW(batched.forward_logits(tokens.data(), B, T, {int64_t{B} * T}, [](size_t, size_t, const float*) {}),
               Error);
}

INSTANTIATE_TEST_SUITE_P(Shapes, Prefix,
                         ::testing::Combine(::testing::Values(Shape::kGpt2, Shape::kMpt, Shape::kLlama,
                                                              Shape::kWindowQkNorm, Shape::kLlamaCheckpointed),
                                            ::testing::Values(KernelImpl::kRef, KernelImpl::kCpu),
                                            ::testing::Values(ComputeDtype::kFp32, ComputeDtype::kBf16)),
                         [](const auto& info) {
                           return shape_name(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) == KernelImpl::kRef ? "_ref" : "_cpu") +
                                  (std::get<2>(info.param) == ComputeDtype::kFp32 ? "_fp32" : "_bf16");
                         });

}  // namespace
}  // namespace anvil
