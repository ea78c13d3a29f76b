// GPT-2 end to end against PyTorch (fixture from tests/golden/make_gpt2_fixture.py): logits, loss,
// every parameter's gradient, and 10 AdamW steps with warmup, cosine decay and clipping. Run with
// both the reference and the fast kernels. Tolerance: relative norm error <= 1e-5 per tensor.
#include <gtest/gtest.h>

#include <string>

#include "ckpt/safetensors.h"
#include "compare.h"
#include "golden_fixture.h"
#include "model/decoder.h"
#include "tiny_models.h"

namespace anvil {
namespace {
using testing::expect_matches_fixture;
using testing::kFp32RelNorm;
using testing::rel_norm_close;

SafeTensorsFile load_fixture() { return testing::load_golden("gpt2_tiny.safetensors"); }

int meta_int(const SafeTensorsFile& f, const char* key) { return std::stoi(f.metadata.at(key)); }

ModelConfig fixture_config(const SafeTensorsFile& f) {
  return {meta_int(f, "n_layers"), meta_int(f, "n_heads"), meta_int(f, "d_model"),
          meta_int(f, "vocab_size"), meta_int(f, "max_seq_len")};
}

// Compares two flat parameter-shaped arrays tensor by tensor, naming the tensor on failure.
void expect_params_close(const Decoder& model, const float* got, const float* want, double tol) {
  for (const ParamTensor& t : model.tensors()) {
    EXPECT_TRUE(rel_norm_close(got + t.offset, want + t.offset, t.numel, tol)) << "tensor " << t.name;
  }
}

class Gpt2Golden : public ::testing::TestWithParam<KernelImpl> {};

TEST_P(Gpt2Golden, LogitsLossAndGradientsMatchPyTorch) {
  SafeTensorsFile f = load_fixture();
  const int B = meta_int(f, "batch"), T = meta_int(f, "seq_len");
  Decoder model(fixture_config(f), B, T, testing::storage_on(GetParam()));
  ASSERT_EQ(model.num_params(), f.at("params_init").numel());
  std::copy_n(f.at("params_init").f32(), model.num_params(), model.params());

  expect_matches_fixture(model, f, B, T);
}

TEST_P(Gpt2Golden, TenAdamWStepsWithScheduleAndClippingMatchPyTorch) {
  SafeTensorsFile f = load_fixture();
  const int B = meta_int(f, "batch"), T = meta_int(f, "seq_len");
  Decoder model(fixture_config(f), B, T, testing::storage_on(GetParam()));
  testing::expect_adamw_steps_match(model, f, B, T);
}

INSTANTIATE_TEST_SUITE_P(Kernels, Gpt2Golden, ::testing::Values(KernelImpl::kRef, KernelImpl::kCpu),
                         [](const auto& info) { return info.param == KernelImpl::kRef ? "ref" : "cpu"; });

// k microbatches of B sequences give the gradient of one batch of k·B, when each loss is
// weighted by 1 / (target tokens of the whole batch): to fp32 rounding.
TEST(Gpt2, MicrobatchesGiveTheSameGradientAsOneBatch) {
  SafeTensorsFile f = load_fixture();
  const int B = meta_int(f, "batch"), T = meta_int(f, "seq_len");
  const int32_t* tokens = f.at("tokens").i32();
  const int32_t* targets = f.at("targets").i32();
  Decoder whole(fixture_config(f), B, T), micro(fixture_config(f), 1, T);
  std::copy_n(f.at("params_init").f32(), whole.num_params(), whole.params());
  std::copy_n(f.at("params_init").f32(), micro.num_params(), micro.params());

  int64_t n = 0;
  whole.zero_grad();
  whole.forward_backward(tokens, targets, B, T, 1.0f / static_cast<float>(B * T - 3), &n);
  ASSERT_EQ(n, B * T - 3);  // the fixture ignores three targets

  micro.zero_grad();
  for (int b = 0; b < B; b++) {
    micro.forward_backward(tokens + b * T, targets + b * T, 1, T, 1.0f / static_cast<float>(n), nullptr);
  }
  expect_params_close(whole, micro.grads(), whole.grads(), kFp32RelNorm);
}

TEST(Gpt2, InitIsDeterministicAndScaled) {
  ModelConfig cfg{4, 4, 64, 500, 32};
  Decoder a(cfg, 1, 8), b(cfg, 1, 8), c(cfg, 1, 8);
  a.init_weights(42);
  b.init_weights(42);
  c.init_weights(43);
  EXPECT_TRUE(std::equal(a.params(), a.params() + a.num_params(), b.params()));
  EXPECT_FALSE(std::equal(a.params(), a.params() + a.num_params(), c.params()));
  for (const ParamTensor& t : a.tensors()) {
    const float* p = a.params() + t.offset;
    double sq = 0;
    for (size_t i = 0; i < t.numel; i++) sq += static_cast<double>(p[i]) * p[i];
    const double rms = std::sqrt(sq / t.numel);
    if (t.init_std > 0) {
      EXPECT_NEAR(rms, t.init_std, 0.05 * t.init_std) << t.name;
    } else {
      EXPECT_EQ(rms, t.init_value) << t.name;
    }
  }
  // Residual projections are scaled by 1/sqrt(2·n_layers).
  for (const ParamTensor& t : a.tensors()) {
    if (t.name.ends_with("attprojw") || t.name.ends_with("fcprojw")) {
      EXPECT_FLOAT_EQ(t.init_std, 0.02f / std::sqrt(8.0f)) << t.name;
    }
  }
}

}  // namespace
}  // namespace anvil
