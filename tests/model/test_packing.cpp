// Packed examples: several fine-tuning examples back to back in one sequence, each token given
// its position in its own example, must change no example's loss or gradient. For each family's
// kind of positions (learned, ALiBi, RoPE with grouped-query heads) and for the reference and the
// CPU kernels: the packed sequence's per-example loss sums equal each example run alone, and its
// gradient equals the sum of theirs, to fp32 tolerance.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "compare.h"
#include "core/targets.h"
#include "model/decoder.h"
#include "tiny_models.h"

namespace anvil {
namespace {

struct Example {
  std::vector<int32_t> tokens, targets;  // targets already shifted; the last is ignored
};

std::vector<Example> examples() {
  std::mt19937 rng(11);
  std::vector<Example> out;
  for (int len : {9, 17, 6, 20}) {
    Example e;
    for (int t = 0; t < len; t++) e.tokens.push_back(static_cast<int32_t>(rng() % 97));
    for (int t = 0; t < len; t++)  // a prompt carrying no loss, then the response
      e.targets.push_back(t + 1 < len && t >= len / 3 ? e.tokens[t + 1] : kIgnoreIndex);
    out.push_back(e);
  }
  return out;
}

class Packing : public ::testing::TestWithParam<std::tuple<ModelFamily, KernelImpl>> {};

TEST_P(Packing, ChangesNoExamplesLossOrGradient) {
  const ModelConfig cfg = testing::tiny_model(std::get<0>(GetParam()), 64);
  const ModelStorage storage = testing::storage_on(std::get<1>(GetParam()));
  constexpr int T = 64;  // the four examples (52 tokens), then padding
  const std::vector<Example> ex = examples();
  std::vector<int32_t> tokens(T, 0), targets(T, kIgnoreIndex), positions(T);
  std::vector<int> start;
  int at = 0;
  for (const Example& e : ex) {
    start.push_back(at);
    for (size_t t = 0; t < e.tokens.size(); t++, at++) {
      tokens[at] = e.tokens[t];
      targets[at] = e.targets[t];
      positions[at] = static_cast<int32_t>(t);
    }
  }
  for (int t = at; t < T; t++) positions[t] = t - at;  // padding: a last "example" of its own

  Decoder packed(cfg, 1, T, storage);
  packed.init_weights(5);
  packed.zero_grad();
  packed.forward_backward(tokens.data(), targets.data(), 1, T, 1.0f, nullptr, positions.data());
  const std::vector<float> losses(packed.losses(), packed.losses() + T);
  const std::vector<float> packed_grad(packed.grads(), packed.grads() + packed.num_params());

  Decoder alone(cfg, 1, T, storage);
  std::copy(packed.params(), packed.params() + packed.num_params(), alone.params());
  alone.zero_grad();
  for (size_t k = 0; k < ex.size(); k++) {
    const int len = static_cast<int>(ex[k].tokens.size());
    alone.forward_backward(ex[k].tokens.data(), ex[k].targets.data(), 1, len, 1.0f, nullptr);
    double want = 0, got = 0;
    for (int t = 0; t < len; t++) {
      want += alone.losses()[t];
      got += losses[static_cast<size_t>(start[k] + t)];
    }
    EXPECT_NEAR(got, want, 1e-5 * std::fabs(want)) << "example " << k;
  }
  EXPECT_TRUE(testing::rel_norm_close(packed_grad.data(), alone.grads(), packed.num_params(), testing::kFp32RelNorm));

  // Without the positions the examples would see each other: the loss differs.
  Decoder mixed(cfg, 1, T, storage);
  std::copy(packed.params(), packed.params() + packed.num_params(), mixed.params());
  int64_t n = 0;
  const double with = packed.forward(tokens.data(), targets.data(), 1, T, &n, positions.data());
  EXPECT_NE(with, mixed.forward(tokens.data(), targets.data(), 1, T, &n));
}

INSTANTIATE_TEST_SUITE_P(Families, Packing,
                         ::testing::Combine(::testing::Values(ModelFamily::kGpt2, ModelFamily::kMpt,
                                                              ModelFamily::kLlama),
                                            ::testing::Values(KernelImpl::kRef, KernelImpl::kCpu)),
                         [](const auto& info) {
                           return std::string(choice_name(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) == KernelImpl::kRef ? "_ref" : "_cpu");
                         });

}  // namespace
}  // namespace anvil
