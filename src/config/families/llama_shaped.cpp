#include "config/families/llama_shaped.h"

#include <yaml-cpp/yaml.h>

#include <fmt/format.h>

#include "config/families/hf_fields.h"
#include "config/families/keys.h"
#include "config/yaml_number.h"

namespace anvil {

void LlamaShaped::read_keys(MapReader& m, ModelConfig& c) const {
  c.vocab_size = 32000;
  c.norm = NormKind::kRmsNorm;
  c.positions = PositionKind::kRope;
  c.mlp = MlpKind::kSwiglu;
  c.linear_bias = false;
  c.norm_bias = false;
  c.tied_embeddings = false;
  c.init = InitScheme::kNormal;
  read_sizes(m, c);
  m.get("n_kv_heads", c.n_kv_heads);
  m.get("intermediate_size", c.mlp_hidden);
  if (c.mlp_hidden == 0) {
    // Llama's rule: two thirds of 4·d_model, rounded up to a multiple of 256.
    const int h = 8 * c.d_model / 3;
    c.mlp_hidden = 256 * ((h + 255) / 256);
  }
  read_positive(m, "rope_theta", c.rope_theta);
  read_positive(m, "rms_norm_eps", c.norm_eps);
  read_positive(m, "init_std", c.init_std);
  m.get("tie_word_embeddings", c.tied_embeddings);
  read_pdrop(m, "attention_dropout", c.attn_pdrop);  // transformers' only dropout in these models
  read_own_keys(m, c);
}

void LlamaShaped::write_keys(YAML::Emitter& e, const ModelConfig& c) const {
  auto key = [&](const char* k, const auto& v) { e << YAML::Key << k << YAML::Value << yaml_value(v); };
  if (c.n_kv_heads) key("n_kv_heads", c.n_kv_heads);
  key("intermediate_size", c.mlp_width());
  key("rope_theta", c.rope_theta);
  key("rms_norm_eps", c.norm_eps);
  key("init_std", c.init_std);
  key("tie_word_embeddings", c.tied_embeddings);
  key("attention_dropout", c.attn_pdrop);
  write_own_keys(e, c);
}

void LlamaShaped::keys_from_hf(HfFields& f) const {
  f.set("n_layers", f.need<int>("num_hidden_layers"), "num_hidden_layers");
  const int heads = f.need<int>("num_attention_heads"), C = f.need<int>("hidden_size");
  f.set("n_heads", heads, "num_attention_heads");
  f.set("d_model", C, "hidden_size");
  f.copy("num_key_value_heads", "n_kv_heads");
  f.copy("vocab_size", "vocab_size");
  f.set("max_seq_len", f.need<int>("max_position_embeddings"), "max_position_embeddings");
  f.set("intermediate_size", f.need<int>("intermediate_size"), "intermediate_size");
  f.copy("rope_theta", "rope_theta");
  f.copy("rms_norm_eps", "rms_norm_eps");
  f.copy("initializer_range", "init_std");
  f.set("tie_word_embeddings", f.get<bool>("tie_word_embeddings", false), "tie_word_embeddings");
  ANVIL_CHECK(heads <= 0 || f.get<int>("head_dim", C / heads) == C / heads, "{}: field 'head_dim' = {} cannot be "
              "honoured (anvil's head size is hidden_size / num_attention_heads = {})", f.where(),
              f.get<int>("head_dim", 0), heads > 0 ? C / heads : 0);
  f.only<std::string>("hidden_act", "silu", "the MLP is SwiGLU, silu");
  f.absent("rope_scaling", "RoPE is applied unscaled");
  f.copy("attention_dropout", "attention_dropout");
  own_keys_from_hf(f);
}

void LlamaShaped::check_hf(const ModelConfig& c) const {
  require(c.norm == NormKind::kRmsNorm, "LayerNorm instead of RMSNorm");
  require(c.positions == PositionKind::kRope, "positions other than RoPE");
  require(c.mlp == MlpKind::kSwiglu, "a GELU MLP instead of SwiGLU");
  require(!c.linear_bias, "biases on its products");
  require(!c.qk_norm, "a norm on the queries and keys");
}

nlohmann::ordered_json LlamaShaped::hf_config(const ModelConfig& c) const {
  nlohmann::ordered_json j = {{"architectures", {hf_architecture}},
                              {"model_type", hf_model_type},
                              {"vocab_size", c.vocab_size},
                              {"hidden_size", c.d_model},
                              {"intermediate_size", c.mlp_width()},
                              {"num_hidden_layers", c.n_layers},
                              {"num_attention_heads", c.n_heads},
                              {"num_key_value_heads", c.kv_heads()},
                              {"head_dim", c.head_size()},
                              {"hidden_act", "silu"},
                              {"max_position_embeddings", c.max_seq_len},
                              {"rms_norm_eps", float_as_written(c.norm_eps)},
                              {"rope_theta", float_as_written(c.rope_theta)},
                              {"attention_dropout", float_as_written(c.attn_pdrop)},
                              {"initializer_range", float_as_written(c.init_std)},
                              {"tie_word_embeddings", c.tied_embeddings}};
  own_hf_config(c, j);
  return j;
}

void LlamaShaped::hf_tensors(const ModelConfig& c, HfTensorList& t) const {
  const int64_t C = c.d_model, V = c.vocab_size, F = c.mlp_width(), q = c.q_width(), kv = c.kv_width();
  t.whole("model.embed_tokens.weight", "wte", {V, C});
  for (int l = 0; l < c.n_layers; l++) {
    const std::string h = fmt::format(fmt::runtime(hf_block_prefix), l), a = fmt::format("h.{}.", l);
    t.whole(h + "input_layernorm.weight", a + "ln1w", {C});
    t.rows(h + "self_attn.q_proj.weight", a + "qkvw", 0, q, {q, C});
    t.rows(h + "self_attn.k_proj.weight", a + "qkvw", q, kv, {kv, C});
    t.rows(h + "self_attn.v_proj.weight", a + "qkvw", q + kv, kv, {kv, C});
    t.whole(h + "self_attn.o_proj.weight", a + "attprojw", {C, C});
    t.whole(h + "post_attention_layernorm.weight", a + "ln2w", {C});
    t.rows(h + "mlp.gate_proj.weight", a + "fcw", 0, F, {F, C});
    t.rows(h + "mlp.up_proj.weight", a + "fcw", F, F, {F, C});
    t.whole(h + "mlp.down_proj.weight", a + "fcprojw", {C, F});
  }
  t.whole("model.norm.weight", "lnfw", {C});
}

std::vector<LoraModule> LlamaShaped::lora_modules(const ModelConfig& c) const {
  const int C = c.d_model, F = c.mlp_width(), q = c.q_width(), kv = c.kv_width();
  using P = BlockProduct;
  return {{"self_attn.q_proj", P::kQkv, 0, q, C},       {"self_attn.k_proj", P::kQkv, q, kv, C},
          {"self_attn.v_proj", P::kQkv, q + kv, kv, C}, {"self_attn.o_proj", P::kAttnOut, 0, C, C},
          {"mlp.gate_proj", P::kFc, 0, F, C},           {"mlp.up_proj", P::kFc, F, F, C},
          {"mlp.down_proj", P::kFcProj, 0, C, F}};
}

}  // namespace anvil
