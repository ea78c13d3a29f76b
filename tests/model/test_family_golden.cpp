// MPT, Llama, Qwen2, Qwen3, Mistral, Mixtral and Qwen3-MoE end to end against PyTorch (fixtures from
// tests/golden/make_family_fixtures.py,
// written from the published Hugging Face / LLM Foundry definitions): each fixture's model section
// goes through the config reader, and the decoder it builds must give PyTorch's logits, loss and
// every parameter's gradient, and go through PyTorch's 10 AdamW steps (schedule, clipping, weight
// decay), with the reference and the fast kernels: an MPT with six ALiBi heads, a Llama with
// grouped-query heads (4 over 2) and its own head, a multi-query Llama (4 over 1) with a tied head,
// and two MPTs with QK LayerNorm (attn_config.qk_ln): grouped-query ALiBi heads (6 over 2) under
// RMSNorm without biases, and multi-query RoPE heads (4 over 1) with biases everywhere; a Qwen2
// (4 heads over 2, tied head) with biases on q, k and v alone; and a Qwen3 (the same heads, each
// of 16 channels over a width of 32, with an RMSNorm over each head's queries and keys); and a
// Mistral whose sliding window (4 keys) is shorter than the sequence (9 tokens); and two MPTs whose
// MLPs are mixtures of experts (LLM Foundry's MegaBlocks keys): mb_moe with four GELU experts, top
// 2, capacity factor 1 (choices skipped) and 1-norm weights, and mb_dmoe with three SwiGLU experts,
// top 1; their training loss adds the balancing loss, compared on its own; a Mixtral (four
// SwiGLU experts, top 2, weights renormalised, no router loss) as transformers computes it; and a
// Qwen3-MoE (Qwen3's heads with four SwiGLU experts, top 2, the chosen probabilities as weights).
// Tolerance: relative norm error <= kFp32RelNorm per tensor, as for GPT-2.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <string>

#include "ckpt/safetensors.h"
#include "config/model_section.h"
#include "core/error.h"
#include "golden_fixture.h"
#include "model/decoder.h"
#include "tiny_models.h"

namespace anvil {
namespace {
using testing::expect_matches_fixture;

ModelConfig config_of(const SafeTensorsFile& f) {
  ModelConfig c;
  const YAML::Node node = YAML::Load(f.metadata.at("model_yaml"));
  MapReader m(node, "model", "fixture");
  read_model_section(m, c);
  return c;
}

struct Family {
  const char* fixture;
  KernelImpl impl;
};

class FamilyGolden : public ::testing::TestWithParam<Family> {};

TEST_P(FamilyGolden, LogitsLossAndGradientsMatchPyTorch) {
  SafeTensorsFile f = testing::load_golden(GetParam().fixture);
  const int B = std::stoi(f.metadata.at("batch")), T = std::stoi(f.metadata.at("seq_len"));
  Decoder model(config_of(f), B, T, testing::storage_on(GetParam().impl));
  expect_matches_fixture(model, f, B, T);
}

TEST_P(FamilyGolden, TenAdamWStepsWithScheduleAndClippingMatchPyTorch) {
  SafeTensorsFile f = testing::load_golden(GetParam().fixture);
  const int B = std::stoi(f.metadata.at("batch")), T = std::stoi(f.metadata.at("seq_len"));
  Decoder model(config_of(f), B, T, testing::storage_on(GetParam().impl));
  testing::expect_adamw_steps_match(model, f, B, T);
}

INSTANTIATE_TEST_SUITE_P(Kernels, FamilyGolden,
                         ::testing::Values(Family{"mpt_tiny.safetensors", KernelImpl::kRef},
                                           Family{"mpt_tiny.safetensors", KernelImpl::kCpu},
                                           Family{"llama_tiny.safetensors", KernelImpl::kRef},
                                           Family{"llama_tiny.safetensors", KernelImpl::kCpu},
                                           Family{"llama_mqa_tiny.safetensors", KernelImpl::kRef},
                                           Family{"llama_mqa_tiny.safetensors", KernelImpl::kCpu},
                                           Family{"mpt_qkln_tiny.safetensors", KernelImpl::kRef},
                                           Family{"mpt_qkln_tiny.safetensors", KernelImpl::kCpu},
                                           Family{"mpt_qkln_rope_tiny.safetensors", KernelImpl::kRef},
                                           Family{"mpt_qkln_rope_tiny.safetensors", KernelImpl::kCpu},
                                           Family{"qwen2_tiny.safetensors", KernelImpl::kRef},
                                           Family{"qwen2_tiny.safetensors", KernelImpl::kCpu},
                                           Family{"qwen3_tiny.safetensors", KernelImpl::kRef},
                                           Family{"qwen3_tiny.safetensors", KernelImpl::kCpu},
                                           Family{"mistral_window_tiny.safetensors", KernelImpl::kRef},
                                           Family{"mistral_window_tiny.safetensors", KernelImpl::kCpu},
                                           Family{"mpt_moe_tiny.safetensors", KernelImpl::kRef},
                                           Family{"mpt_moe_tiny.safetensors", KernelImpl::kCpu},
                                           Family{"mpt_dmoe_glu_tiny.safetensors", KernelImpl::kRef},
                                           Family{"mpt_dmoe_glu_tiny.safetensors", KernelImpl::kCpu},
                                           Family{"mixtral_tiny.safetensors", KernelImpl::kRef},
                                           Family{"mixtral_tiny.safetensors", KernelImpl::kCpu},
                                           Family{"qwen3_moe_tiny.safetensors", KernelImpl::kRef},
                                           Family{"qwen3_moe_tiny.safetensors", KernelImpl::kCpu}),
                         [](const auto& info) {
                           std::string f = info.param.fixture;
                           f = f.substr(0, f.find("_tiny"));
                           return f + (info.param.impl == KernelImpl::kRef ? "_ref" : "_cpu");
                         });

// LoRA on each family against PyTorch (fixtures from tests/golden/make_lora_fixtures.py: PEFT's
// branch on transformers' layers, the base frozen): the model section's peft_config builds the
// adapters, the fixture's base goes in frozen, and the logits, loss, the adapters' gradients and 10
// AdamW steps of the adapters must match, on a batch with ignored targets whose first sequence
// packs two examples. GPT-2 with every product adapted (c_proj naming two); a grouped-query
// Llama with some of the fused products' rows adapted (q and v of qkv, gate of gate/up) and
// rsLoRA scaling; an MPT with all-linear; and an MPT whose MLPs are mixtures of experts, where
// all-linear adapts the attention's products and the router (the experts are frozen weights, not
// linear layers), its training loss with the balancing loss.
class LoraGolden : public FamilyGolden {};

std::unique_ptr<Decoder> lora_model(const SafeTensorsFile& f, KernelImpl impl) {
  const int B = std::stoi(f.metadata.at("batch")), T = std::stoi(f.metadata.at("seq_len"));
  const ModelConfig cfg = config_of(f);
  EXPECT_TRUE(cfg.has_lora());
  auto model = std::make_unique<Decoder>(cfg, B, T, testing::storage_on(impl));
  const SafeTensor& base = f.at("base");
  model->set_base_weights(std::vector<float>(base.f32(), base.f32() + base.numel()));
  return model;
}

TEST_P(LoraGolden, LogitsLossAndAdapterGradientsMatchPyTorch) {
  SafeTensorsFile f = testing::load_golden(GetParam().fixture);
  expect_matches_fixture(*lora_model(f, GetParam().impl), f, std::stoi(f.metadata.at("batch")),
                         std::stoi(f.metadata.at("seq_len")));
}

TEST_P(LoraGolden, TenAdamWStepsOfTheAdaptersMatchPyTorch) {
  SafeTensorsFile f = testing::load_golden(GetParam().fixture);
  testing::expect_adamw_steps_match(*lora_model(f, GetParam().impl), f, std::stoi(f.metadata.at("batch")),
                                    std::stoi(f.metadata.at("seq_len")));
}

INSTANTIATE_TEST_SUITE_P(Kernels, LoraGolden,
                         ::testing::Values(Family{"gpt2_lora_tiny.safetensors", KernelImpl::kRef},
                                           Family{"gpt2_lora_tiny.safetensors", KernelImpl::kCpu},
                                           Family{"llama_lora_tiny.safetensors", KernelImpl::kRef},
                                           Family{"llama_lora_tiny.safetensors", KernelImpl::kCpu},
                                           Family{"mpt_lora_tiny.safetensors", KernelImpl::kRef},
                                           Family{"mpt_lora_tiny.safetensors", KernelImpl::kCpu},
                                           Family{"mpt_moe_lora_tiny.safetensors", KernelImpl::kRef},
                                           Family{"mpt_moe_lora_tiny.safetensors", KernelImpl::kCpu}),
                         [](const auto& info) {
                           std::string f = info.param.fixture;
                           f = f.substr(0, f.find("_tiny"));
                           return f + (info.param.impl == KernelImpl::kRef ? "_ref" : "_cpu");
                         });

// A base held in bf16 under amp_bf16 gives the same bits as one held in fp32 (the products round
// its weights to bf16 either way; norms and embeddings stay fp32): one pass of the LoRA model cfg
// over the fixture's batch each way. adapters: their values, or null to draw them from a seed.
void expect_bf16_base_gives_the_same_bits(const ModelConfig& cfg, const SafeTensorsFile& f,
                                          const std::vector<float>& base, const float* adapters,
                                          const int32_t* positions, const std::string& what) {
  const int B = std::stoi(f.metadata.at("batch")), T = std::stoi(f.metadata.at("seq_len"));
  std::vector<std::vector<float>> grads;
  std::vector<double> losses;
  for (bool held_in_bf16 : {false, true}) {
    Decoder model(cfg, B, T);
    model.set_compute_dtype(ComputeDtype::kBf16);
    model.set_base_weights(base, held_in_bf16);
    if (adapters)
      std::copy_n(adapters, model.num_params(), model.params());
    else
      model.init_weights(7);
    model.zero_grad();
    losses.push_back(
        model.forward_backward(f.at("tokens").i32(), f.at("targets").i32(), B, T, 0.01f, nullptr, positions));
    grads.emplace_back(model.grads(), model.grads() + model.num_params());
  }
  EXPECT_EQ(losses[0], losses[1]) << what;
  EXPECT_EQ(grads[0], grads[1]) << what;
}

// What a base held in bf16 saves is measured by `anvil bench train` (docs/PERFORMANCE.md).
TEST(Lora, BaseHeldInBf16GivesTheSameBits) {
  for (const char* fixture : {"gpt2_lora_tiny.safetensors", "llama_lora_tiny.safetensors", "mpt_lora_tiny.safetensors",
                              "mpt_moe_lora_tiny.safetensors"}) {
    SafeTensorsFile f = testing::load_golden(fixture);
    const SafeTensor& base = f.at("base");
    expect_bf16_base_gives_the_same_bits(config_of(f), f, std::vector<float>(base.f32(), base.f32() + base.numel()),
                                         f.at("params_init").f32(), f.at("positions").i32(), fixture);
  }
  // An MPT with QK LayerNorm and biases: its query and key norms, like the block's others, stay fp32.
  SafeTensorsFile f = testing::load_golden("mpt_qkln_rope_tiny.safetensors");
  ModelConfig cfg = config_of(f);
  cfg.lora.r = 2;
  cfg.lora.target_modules = {"all-linear"};
  const SafeTensor& base = f.at("params_init");
  expect_bf16_base_gives_the_same_bits(cfg, f, std::vector<float>(base.f32(), base.f32() + base.numel()), nullptr,
                                       nullptr, "MPT with qk_ln");
}

// The families' layouts by count: Llama-2-7B's published total, and MPT-7B's shape (alibi,
// no_bias: norms without bias, no position table, tied) counted by hand.
TEST(Families, ParameterCountsMatchTheModels) {
  // Llama-2-7B: 6,738,415,616 parameters.
  ModelConfig llama;
  const YAML::Node l = YAML::Load("name: llama\nn_layers: 32\nn_heads: 32\nd_model: 4096\nmax_seq_len: 4096\n");
  MapReader lm(l, "model", "test");
  read_model_section(lm, llama);
  EXPECT_EQ(llama.mlp_width(), 11008);  // Llama's rule
  EXPECT_EQ(model_num_params(llama), 6738415616u);
  // MPT-7B: the embedding, and per block two norm weights, Wqkv, out_proj, up_proj and down_proj.
  ModelConfig mpt;
  const YAML::Node m = YAML::Load(
      "name: mpt_causal_lm\nn_layers: 32\nn_heads: 32\nd_model: 4096\nmax_seq_len: 2048\nvocab_size: 50432\n"
      "no_bias: true\nattn_config: {alibi: true}\n");
  MapReader mm(m, "model", "test");
  read_model_section(mm, mpt);
  const uint64_t C = 4096;
  EXPECT_EQ(model_num_params(mpt), 50432 * C + 32 * (2 * C + 3 * C * C + C * C + 8 * C * C) + C);
}

// Mistral-7B-v0.1: Llama's parameters with a vocabulary of 32000 and 8 key/value heads
// (7,241,732,096); its sliding window bounds what attention sees, not the sequence.
TEST(Families, MistralParameters) {
  ModelConfig mistral;
  const YAML::Node y = YAML::Load("name: mistral\nn_layers: 32\nn_heads: 32\nn_kv_heads: 8\nd_model: 4096\n"
                                  "intermediate_size: 14336\nmax_seq_len: 32768\nsliding_window: 4096\n");
  MapReader r(y, "model", "test");
  read_model_section(r, mistral);
  EXPECT_EQ(model_num_params(mistral), 7241732096u);
  EXPECT_EQ(mistral.sliding_window, 4096);
}

// Mixtral-8x7B-v0.1: Mistral-7B's attention with 8 experts of 14336 per block (46,702,792,704
// parameters, of which a token's top 2 experts use 12.9B).
TEST(Families, MixtralParameters) {
  ModelConfig mixtral;
  const YAML::Node y = YAML::Load("name: mixtral\nn_layers: 32\nn_heads: 32\nn_kv_heads: 8\nd_model: 4096\n"
                                  "intermediate_size: 14336\nmax_seq_len: 32768\n");
  MapReader r(y, "model", "test");
  read_model_section(r, mixtral);
  EXPECT_EQ(model_num_params(mixtral), 46702792704u);
  EXPECT_EQ(mixtral.moe.experts, 8);
  EXPECT_EQ(mixtral.moe.top_k, 2);
}

// Qwen2.5-0.5B: Llama's shape with biases on q, k and v and a tied head: 494,032,768
// parameters, as its model card says.
TEST(Families, Qwen2Parameters) {
  ModelConfig qwen;
  const YAML::Node y = YAML::Load("name: qwen2\nn_layers: 24\nn_heads: 14\nn_kv_heads: 2\nd_model: 896\n"
                                  "intermediate_size: 4864\nmax_seq_len: 32768\ntie_word_embeddings: true\n");
  MapReader r(y, "model", "test");
  read_model_section(r, qwen);
  EXPECT_EQ(model_num_params(qwen), 494032768u);
}

// Qwen3-0.6B: heads of 128 over a width of 1024 (queries 2048 wide), per-head q/k norms, a tied
// head: 596,049,920 parameters (0.44B without the embedding, as its model card says).
TEST(Families, Qwen3Parameters) {
  ModelConfig qwen;
  const YAML::Node y = YAML::Load("name: qwen3\nn_layers: 28\nn_heads: 16\nn_kv_heads: 8\nd_model: 1024\n"
                                  "intermediate_size: 3072\nmax_seq_len: 40960\ntie_word_embeddings: true\n");
  MapReader r(y, "model", "test");
  read_model_section(r, qwen);
  EXPECT_EQ(qwen.head_size(), 128);
  EXPECT_EQ(qwen.q_width(), 2048);
  EXPECT_EQ(model_num_params(qwen), 596049920u);
  EXPECT_EQ(model_num_params(qwen) - 151936u * 1024u, 440467456u);
}

// Qwen3-30B-A3B: Qwen3's attention (32 heads of 128 over 4) with 128 experts of 768 per block:
// 30,532,122,624 parameters (its safetensors index: 61,064,245,248 bytes of bf16).
TEST(Families, Qwen3MoeParameters) {
  ModelConfig qwen;
  const YAML::Node y = YAML::Load("name: qwen3_moe\nn_layers: 48\nn_heads: 32\nn_kv_heads: 4\nd_model: 2048\n"
                                  "intermediate_size: 6144\nmoe_intermediate_size: 768\nmax_seq_len: 40960\n"
                                  "norm_topk_prob: true\n");
  MapReader r(y, "model", "test");
  read_model_section(r, qwen);
  EXPECT_EQ(model_num_params(qwen), 30532122624u);
  EXPECT_EQ(qwen.moe.experts, 128);
  EXPECT_EQ(qwen.moe.top_k, 8);
}

}  // namespace
}  // namespace anvil
