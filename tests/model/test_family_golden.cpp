// MPT and Llama end to end against PyTorch (fixtures from tests/golden/make_family_fixtures.py,
// written from the published Hugging Face / LLM Foundry definitions): each fixture's model section
// goes through the config reader, and the decoder it builds must give PyTorch's logits, loss and
// every parameter's gradient, with the reference and the fast kernels. Tolerance: relative norm
// error <= kFp32RelNorm per tensor, as for GPT-2.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <string>

#include "ckpt/safetensors.h"
#include "compare.h"
#include "config/model_section.h"
#include "kernels/impl.h"
#include "model/decoder.h"

namespace anvil {
namespace {
using testing::kFp32RelNorm;
using testing::rel_norm_close;

SafeTensorsFile load_fixture(const std::string& name) {
  const char* src = std::getenv("ANVIL_SOURCE_DIR");
  return read_safetensors(std::string(src ? src : ".") + "/tests/golden/" + name);
}

ModelConfig config_of(const SafeTensorsFile& f) {
  ModelConfig c;
  const YAML::Node node = YAML::Load(f.metadata.at("model_yaml"));
  MapReader m(node, "model", "fixture");
  read_model_section(m, c, "fixture");
  return c;
}

struct Family {
  const char* fixture;
  KernelImpl impl;
};

class FamilyGolden : public ::testing::TestWithParam<Family> {
 protected:
  void SetUp() override { set_kernel_impl(GetParam().impl); }
  void TearDown() override { set_kernel_impl(KernelImpl::kCpu); }
};

TEST_P(FamilyGolden, LogitsLossAndGradientsMatchPyTorch) {
  SafeTensorsFile f = load_fixture(GetParam().fixture);
  const int B = std::stoi(f.metadata.at("batch")), T = std::stoi(f.metadata.at("seq_len"));
  Decoder model(config_of(f), B, T);
  ASSERT_EQ(model.num_params(), f.at("params_init").numel());
  std::copy_n(f.at("params_init").f32(), model.num_params(), model.params());

  int64_t n_targets = 0;
  const double loss_sum = model.forward(f.at("tokens").i32(), f.at("targets").i32(), B, T, &n_targets);
  EXPECT_EQ(n_targets, B * T - 3);
  const size_t n_logits = f.at("logits").numel(), per_sequence = n_logits / B;
  std::vector<float> logits(n_logits);
  for (int b = 0; b < B; b++) {
    model.forward(f.at("tokens").i32() + b * T, nullptr, 1, T, nullptr);
    std::copy_n(model.logits(), per_sequence, logits.data() + b * per_sequence);
  }
  EXPECT_TRUE(rel_norm_close(logits.data(), f.at("logits").f32(), n_logits, kFp32RelNorm));
  const float loss = static_cast<float>(loss_sum / n_targets);
  EXPECT_TRUE(rel_norm_close(&loss, f.at("loss").f32(), 1, kFp32RelNorm));

  model.zero_grad();
  model.forward_backward(f.at("tokens").i32(), f.at("targets").i32(), B, T, 1.0f / static_cast<float>(n_targets),
                         nullptr);
  for (const ParamTensor& t : model.tensors())
    EXPECT_TRUE(rel_norm_close(model.grads() + t.offset, f.at("grads").f32() + t.offset, t.numel, kFp32RelNorm))
        << "tensor " << t.name;
}

INSTANTIATE_TEST_SUITE_P(Kernels, FamilyGolden,
                         ::testing::Values(Family{"mpt_tiny.safetensors", KernelImpl::kRef},
                                           Family{"mpt_tiny.safetensors", KernelImpl::kCpu},
                                           Family{"llama_tiny.safetensors", KernelImpl::kRef},
                                           Family{"llama_tiny.safetensors", KernelImpl::kCpu}),
                         [](const auto& info) {
                           const std::string f = info.param.fixture;
                           return f.substr(0, f.find('_')) + (info.param.impl == KernelImpl::kRef ? "_ref" : "_cpu");
                         });

// The families' layouts by count: Llama-2-7B's published total, and MPT-7B's shape (alibi,
// no_bias: norms without bias, no position table, tied) counted by hand.
TEST(Families, ParameterCountsMatchTheModels) {
  // Llama-2-7B: 6,738,415,616 parameters.
  ModelConfig llama;
  const YAML::Node l = YAML::Load("name: llama\nn_layers: 32\nn_heads: 32\nd_model: 4096\nmax_seq_len: 4096\n");
  MapReader lm(l, "model", "test");
  read_model_section(lm, llama, "test");
  EXPECT_EQ(llama.mlp_width(), 11008);  // Llama's rule
  EXPECT_EQ(model_num_params(llama), 6738415616u);
  // MPT-7B: the embedding, and per block two norm weights, Wqkv, out_proj, up_proj and down_proj.
  ModelConfig mpt;
  const YAML::Node m = YAML::Load(
      "name: mpt_causal_lm\nn_layers: 32\nn_heads: 32\nd_model: 4096\nmax_seq_len: 2048\nvocab_size: 50432\n"
      "no_bias: true\nattn_config: {alibi: true}\n");
  MapReader mm(m, "model", "test");
  read_model_section(mm, mpt, "test");
  const uint64_t C = 4096;
  EXPECT_EQ(model_num_params(mpt), 50432 * C + 32 * (2 * C + 3 * C * C + C * C + 8 * C * C) + C);
}

}  // namespace
}  // namespace anvil
