// GPT-2 (OpenAI's, as transformers' GPT2LMHeadModel holds it): learned positions, LayerNorm with
// bias, the tanh GELU (gelu_new), biases on every product, tied embeddings. It is ModelConfig's
// defaults, so only its sizes and dropouts are keys.
#include <yaml-cpp/yaml.h>

#include <fmt/format.h>

#include "config/families/family.h"
#include "config/families/hf_fields.h"
#include "config/families/keys.h"
#include "config/yaml_number.h"

namespace anvil {
namespace {

class Gpt2 final : public Family {
 public:
  Gpt2()
      : Family(ModelFamily::kGpt2, "GPT-2", "gpt2", "GPT2LMHeadModel", "transformer.h.{}.", "transformer.",
               /*hf_conv1d=*/true, /*kv_heads_key=*/"", /*mlp_width_key=*/"", {"c_attn"}) {}

  void read_keys(MapReader& m, ModelConfig& c) const override {
    read_sizes(m, c);
    // transformers' GPT2Config names.
    read_pdrop(m, "embd_pdrop", c.emb_pdrop);
    read_pdrop(m, "attn_pdrop", c.attn_pdrop);
    read_pdrop(m, "resid_pdrop", c.resid_pdrop);
  }

  void write_keys(YAML::Emitter& e, const ModelConfig& c) const override {
    e << YAML::Key << "embd_pdrop" << YAML::Value << yaml_number(c.emb_pdrop);
    e << YAML::Key << "attn_pdrop" << YAML::Value << yaml_number(c.attn_pdrop);
    e << YAML::Key << "resid_pdrop" << YAML::Value << yaml_number(c.resid_pdrop);
  }

  void keys_from_hf(HfFields& f) const override {
    f.set("n_layers", f.need<int>("n_layer"), "n_layer");
    f.set("n_heads", f.need<int>("n_head"), "n_head");
    const int C = f.need<int>("n_embd");
    f.set("d_model", C, "n_embd");
    f.copy("vocab_size", "vocab_size");
    f.set("max_seq_len", f.need<int>("n_positions"), "n_positions");
    ANVIL_CHECK(f.get<int>("n_inner", 4 * C) == 4 * C, "{}: field 'n_inner' = {} cannot be honoured (anvil's GPT-2 "
                "has an MLP of 4·n_embd = {})", f.where(), f.get<int>("n_inner", 0), 4 * C);
    f.only<std::string>("activation_function", "gelu_new", "anvil's GPT-2 uses the tanh GELU, gelu_new");
    f.only<double>("layer_norm_epsilon", 1e-5, "anvil's LayerNorm uses eps 1e-5");
    f.only<bool>("scale_attn_weights", true, "scores are always scaled by 1/sqrt(head size)");
    f.only<bool>("scale_attn_by_inverse_layer_idx", false, "scores are never scaled by the layer index");
    f.only<bool>("add_cross_attention", false, "anvil's decoders have no cross-attention");
    f.only<bool>("tie_word_embeddings", true, "anvil's GPT-2 ties its LM head to wte");
    for (const char* key : {"embd_pdrop", "attn_pdrop", "resid_pdrop"}) f.copy(key, key);
  }

  void check_hf(const ModelConfig& c) const override {
    require(c.positions == PositionKind::kLearned, "no learned position table (GPT-2 needs wpe)");
    require(c.norm == NormKind::kLayerNorm && c.norm_bias, "norms other than LayerNorm with bias");
    require(c.mlp == MlpKind::kGeluTanh, "an MLP other than tanh GELU (gelu_new)");
    require(c.linear_bias, "no biases on its products");
    require(c.kv_heads() == c.n_heads, "grouped-query attention (n_kv_heads)");
  }

  nlohmann::ordered_json hf_config(const ModelConfig& c) const override {
    return {{"architectures", {hf_architecture}},
            {"model_type", hf_model_type},
            {"vocab_size", c.vocab_size},
            {"n_positions", c.max_seq_len},
            {"n_ctx", c.max_seq_len},
            {"n_embd", c.d_model},
            {"n_layer", c.n_layers},
            {"n_head", c.n_heads},
            {"n_inner", c.mlp_width()},
            {"activation_function", "gelu_new"},
            {"resid_pdrop", float_as_written(c.resid_pdrop)},
            {"embd_pdrop", float_as_written(c.emb_pdrop)},
            {"attn_pdrop", float_as_written(c.attn_pdrop)},
            {"layer_norm_epsilon", 1e-5},
            {"initializer_range", float_as_written(c.init_std)},
            {"scale_attn_weights", true},
            {"tie_word_embeddings", c.tied_embeddings}};
  }

  void hf_tensors(const ModelConfig& c, HfTensorList& t) const override {
    const int64_t C = c.d_model, V = c.vocab_size, F = c.mlp_width(), P = c.max_seq_len;
    t.whole("transformer.wte.weight", "wte", {V, C});
    t.whole("transformer.wpe.weight", "wpe", {P, C});
    for (int l = 0; l < c.n_layers; l++) {
      const std::string h = fmt::format(fmt::runtime(hf_block_prefix), l), a = fmt::format("h.{}.", l);
      t.whole(h + "ln_1.weight", a + "ln1w", {C});
      t.whole(h + "ln_1.bias", a + "ln1b", {C});
      t.conv1d(h + "attn.c_attn.weight", a + "qkvw", C, 3 * C);
      t.whole(h + "attn.c_attn.bias", a + "qkvb", {3 * C});
      t.conv1d(h + "attn.c_proj.weight", a + "attprojw", C, C);
      t.whole(h + "attn.c_proj.bias", a + "attprojb", {C});
      t.whole(h + "ln_2.weight", a + "ln2w", {C});
      t.whole(h + "ln_2.bias", a + "ln2b", {C});
      t.conv1d(h + "mlp.c_fc.weight", a + "fcw", C, F);
      t.whole(h + "mlp.c_fc.bias", a + "fcb", {F});
      t.conv1d(h + "mlp.c_proj.weight", a + "fcprojw", F, C);
      t.whole(h + "mlp.c_proj.bias", a + "fcprojb", {C});
    }
    t.whole("transformer.ln_f.weight", "lnfw", {C});
    t.whole("transformer.ln_f.bias", "lnfb", {C});
  }

  std::vector<LoraModule> lora_modules(const ModelConfig& c) const override {
    const int C = c.d_model, F = c.mlp_width();
    using P = BlockProduct;
    return {{"attn.c_attn", P::kQkv, 0, c.qkv_width(), C},
            {"attn.c_proj", P::kAttnOut, 0, C, C},
            {"mlp.c_fc", P::kFc, 0, c.mlp == MlpKind::kSwiglu ? 2 * F : F, C},
            {"mlp.c_proj", P::kFcProj, 0, C, F}};
  }
};

}  // namespace

const Family& gpt2_family() {
  static const Gpt2 f;
  return f;
}

}  // namespace anvil
