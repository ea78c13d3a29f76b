// Llama (transformers' LlamaForCausalLM): RMSNorm, RoPE in the rotate-half order, SwiGLU, no
// biases, grouped-query attention, its own LM head unless tied. Its keys are anvil's size names
// and transformers' LlamaConfig names for the rest (rms_norm_eps, rope_theta, ...).
#include <yaml-cpp/yaml.h>

#include <fmt/format.h>

#include "config/families/family.h"
#include "config/families/hf_fields.h"
#include "config/families/keys.h"
#include "config/yaml_number.h"

namespace anvil {
namespace {

class Llama final : public Family {
 public:
  Llama()
      : Family(ModelFamily::kLlama, "Llama", "llama", "LlamaForCausalLM", "model.layers.{}.", "", /*hf_conv1d=*/false,
               "n_kv_heads", "intermediate_size", {"q_proj", "v_proj"}) {}

  void read_keys(MapReader& m, ModelConfig& c) const override {
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
    read_pdrop(m, "attention_dropout", c.attn_pdrop);  // transformers' only Llama dropout
  }

  void write_keys(YAML::Emitter& e, const ModelConfig& c) const override {
    auto key = [&](const char* k, const auto& v) { e << YAML::Key << k << YAML::Value << yaml_value(v); };
    if (c.n_kv_heads) key("n_kv_heads", c.n_kv_heads);
    key("intermediate_size", c.mlp_width());
    key("rope_theta", c.rope_theta);
    key("rms_norm_eps", c.norm_eps);
    key("init_std", c.init_std);
    key("tie_word_embeddings", c.tied_embeddings);
    key("attention_dropout", c.attn_pdrop);
  }

  void keys_from_hf(HfFields& f) const override {
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
    f.only<std::string>("hidden_act", "silu", "Llama's MLP is SwiGLU, silu");
    f.absent("rope_scaling", "RoPE is applied unscaled");
    f.absent("sliding_window", "attention covers the whole causal context");
    f.only<bool>("attention_bias", false, "anvil's Llama has no biases");
    f.only<bool>("mlp_bias", false, "anvil's Llama has no biases");
    f.only<int>("pretraining_tp", 1, "tensor-parallel slicing of the products");
    f.copy("attention_dropout", "attention_dropout");
  }

  void check_hf(const ModelConfig& c) const override {
    require(c.norm == NormKind::kRmsNorm, "LayerNorm instead of RMSNorm");
    require(c.positions == PositionKind::kRope, "positions other than RoPE");
    require(c.mlp == MlpKind::kSwiglu, "a GELU MLP instead of SwiGLU");
    require(!c.linear_bias, "biases on its products");
  }

  nlohmann::ordered_json hf_config(const ModelConfig& c) const override {
    return {{"architectures", {hf_architecture}},
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
            {"rope_scaling", nullptr},
            {"attention_bias", false},
            {"mlp_bias", false},
            {"attention_dropout", float_as_written(c.attn_pdrop)},
            {"pretraining_tp", 1},
            {"initializer_range", float_as_written(c.init_std)},
            {"tie_word_embeddings", c.tied_embeddings}};
  }

  void hf_tensors(const ModelConfig& c, HfTensorList& t) const override {
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

  std::vector<LoraModule> lora_modules(const ModelConfig& c) const override {
    const int C = c.d_model, F = c.mlp_width(), q = c.q_width(), kv = c.kv_width();
    using P = BlockProduct;
    return {{"self_attn.q_proj", P::kQkv, 0, q, C},       {"self_attn.k_proj", P::kQkv, q, kv, C},
            {"self_attn.v_proj", P::kQkv, q + kv, kv, C}, {"self_attn.o_proj", P::kAttnOut, 0, C, C},
            {"mlp.gate_proj", P::kFc, 0, F, C},           {"mlp.up_proj", P::kFc, F, F, C},
            {"mlp.down_proj", P::kFcProj, 0, C, F}};
  }
};

}  // namespace

const Family& llama_family() {
  static const Llama f;
  return f;
}

}  // namespace anvil
