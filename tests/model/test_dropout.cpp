// Dropout in the decoder: the backward pass regenerates the forward's masks (the gradient is the
// derivative of the loss the dropped-out forward computed, checked by central differences along a
// random direction, site by site), evaluation never drops, the masks depend on the step and on a
// sequence's index in the batch but not on how the batch is cut into microbatches, and the kernels
// keep about 1 - p of the elements, scaled by 1/(1-p).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "compare.h"
#include "kernels/dropout.h"
#include "model/decoder.h"
#include "tiny_models.h"

namespace anvil {
namespace {

constexpr int kB = 3, kT = 20;


struct Batch {
  std::vector<int32_t> tokens, targets;
};
Batch batch() {
  std::mt19937 rng(5);
  Batch b;
  for (int i = 0; i < kB * kT; i++) {
    b.tokens.push_back(static_cast<int32_t>(rng() % 97));
    b.targets.push_back(static_cast<int32_t>(rng() % 97));
  }
  return b;
}

// The training loss (dropout applied) of the model's current weights, and its gradient in grads.
double train_loss(Decoder& m, const Batch& b) {
  m.zero_grad();
  m.set_dropout_position({42, 7, 10});
  return m.forward_backward(b.tokens.data(), b.targets.data(), kB, kT, 1.0f, nullptr);
}

struct Site {
  const char* name;
  float emb, attn, resid;
};

class DropoutGradient : public ::testing::TestWithParam<std::tuple<ModelFamily, Site, KernelImpl>> {};

// d/dε L(θ + ε·u) at 0, from the gradient and from central differences: a mask the backward pass
// did not share with the forward would leave them O(1) apart; fp32 central differences agree to
// about 1e-3 here.
TEST_P(DropoutGradient, BackwardIsTheDerivativeOfTheDroppedOutLoss) {
  const auto [family, site, impl] = GetParam();
  ModelConfig cfg = testing::tiny_model(family, kT);
  cfg.emb_pdrop = site.emb;
  cfg.attn_pdrop = site.attn;
  cfg.resid_pdrop = site.resid;
  Decoder m(cfg, kB, kT, testing::storage_on(impl));
  m.init_weights(3);
  const Batch b = batch();
  const size_t n = m.num_params();
  std::vector<float> theta(m.params(), m.params() + n), u(n);
  std::mt19937 rng(9);
  std::normal_distribution<float> normal;
  // Along the blocks' parameters only: the embeddings' and head's large terms would hide an
  // error in a block's backward.
  for (const ParamTensor& t : m.tensors())
    if (t.name.starts_with("h."))
      for (size_t i = 0; i < t.numel; i++) u[t.offset + i] = 0.01f * normal(rng);
  const double loss = train_loss(m, b);
  double analytic = 0;
  for (size_t i = 0; i < n; i++) analytic += static_cast<double>(m.grads()[i]) * u[i];

  const double eps = 0.05;
  auto at = [&](double e) {
    for (size_t i = 0; i < n; i++) m.params()[i] = theta[i] + static_cast<float>(e) * u[i];
    return train_loss(m, b);
  };
  const double numeric = (at(eps) - at(-eps)) / (2 * eps);
  EXPECT_NEAR(analytic, numeric, 4e-3 * std::fabs(analytic) + 1e-3) << "loss " << loss;

  // Dropout changes the training loss, and evaluation never drops: forward() gives the same bits
  // as the same weights without dropout.
  for (size_t i = 0; i < n; i++) m.params()[i] = theta[i];
  ModelConfig plain = testing::tiny_model(family, kT);
  Decoder p(plain, kB, kT, testing::storage_on(impl));
  std::copy(theta.begin(), theta.end(), p.params());
  EXPECT_NE(loss, train_loss(p, b));
  EXPECT_EQ(m.forward(b.tokens.data(), b.targets.data(), kB, kT, nullptr),
            p.forward(b.tokens.data(), b.targets.data(), kB, kT, nullptr));
}

INSTANTIATE_TEST_SUITE_P(
    Sites, DropoutGradient,
    ::testing::Combine(::testing::Values(ModelFamily::kGpt2, ModelFamily::kLlama),
                       ::testing::Values(Site{"embedding", 0.2f, 0, 0}, Site{"attention", 0, 0.5f, 0},
                                         Site{"residual", 0, 0, 0.2f}, Site{"all", 0.1f, 0.1f, 0.1f}),
                       ::testing::Values(KernelImpl::kRef, KernelImpl::kCpu)),
    [](const auto& info) {
      return std::string(std::get<0>(info.param) == ModelFamily::kGpt2 ? "gpt2_" : "llama_") +
             std::get<1>(info.param).name + (std::get<2>(info.param) == KernelImpl::kRef ? "_ref" : "_cpu");
    });

// A sequence's mask depends on its index in the step's batch, not on the microbatch it came in:
// three microbatches of one sequence (first_sample 10, 11, 12) give one batch's gradient.
TEST(Dropout, MasksFollowTheSequenceNotTheMicrobatch) {
  ModelConfig cfg = testing::tiny_model(ModelFamily::kGpt2, kT);
  cfg.emb_pdrop = cfg.attn_pdrop = cfg.resid_pdrop = 0.2f;
  Decoder whole(cfg, kB, kT), micro(cfg, 1, kT);
  whole.init_weights(3);
  std::copy(whole.params(), whole.params() + whole.num_params(), micro.params());
  const Batch b = batch();
  const double sum = train_loss(whole, b);
  micro.zero_grad();
  double micro_sum = 0;
  for (int s = 0; s < kB; s++) {
    micro.set_dropout_position({42, 7, 10 + s});
    micro_sum += micro.forward_backward(b.tokens.data() + s * kT, b.targets.data() + s * kT, 1, kT, 1.0f, nullptr);
  }
  EXPECT_NEAR(sum, micro_sum, 1e-5 * std::fabs(sum));
  EXPECT_TRUE(testing::rel_norm_close(micro.grads(), whole.grads(), whole.num_params(), testing::kFp32RelNorm));
  // Another step draws other masks.
  whole.zero_grad();
  whole.set_dropout_position({42, 8, 10});
  EXPECT_NE(sum, whole.forward_backward(b.tokens.data(), b.targets.data(), kB, kT, 1.0f, nullptr));
}

// The kernels keep 1 - p of the elements within five standard deviations, scale the kept ones by
// 1/(1-p) exactly, and two sequences' masks agree as often as independent ones would.
TEST(Dropout, KeepsOneMinusPScaled) {
  const long n = 1 << 20;
  for (float p : {0.1f, 0.5f}) {
    const DropoutSite site{dropout_key(1, 2, 3, DropoutKind::kAttentionOutput), 4, p};
    std::vector<float> x(2 * n, 1.5f), out(2 * n);
    dropout_apply(KernelImpl::kCpu, out.data(), x.data(), 2, n, site);
    long kept = 0, same = 0;
    for (long i = 0; i < 2 * n; i++) {
      ASSERT_TRUE(out[i] == 0.0f || out[i] == 1.5f * site.scale()) << i;
      kept += out[i] != 0.0f;
    }
    for (long i = 0; i < n; i++) same += (out[i] != 0.0f) == (out[n + i] != 0.0f);
    const double sd = std::sqrt(2.0 * n * p * (1 - p));
    EXPECT_NEAR(static_cast<double>(kept), 2.0 * n * (1 - p), 5 * sd) << "p " << p;
    const double agree = p * p + (1 - p) * (1 - p);
    EXPECT_NEAR(static_cast<double>(same) / n, agree, 5 * std::sqrt(agree * (1 - agree) / n)) << "p " << p;
  }
}

}  // namespace
}  // namespace anvil
