// The three families' transformers formats. Names and shapes follow transformers' modeling files
// (modeling_gpt2.py, modeling_llama.py, modeling_mpt.py) as save_pretrained writes them: a tied
// LM head is not stored, GPT-2's Conv1D weights are (input, output), the others nn.Linear's
// (output, input). anvil fuses q/k/v rows in qkvw and gate/up rows in fcw; Llama's are cut out
// of them by rows. RoPE needs no permutation: anvil rotates in transformers' rotate-half order.
#include "interop/hf_format.h"

#include <string>

#include <fmt/format.h>

#include <yaml-cpp/yaml.h>

#include "config/map_reader.h"
#include "config/model_section.h"
#include "core/dtype.h"
#include "core/error.h"
#include "model/model.h"

namespace anvil {
namespace {

void require(bool ok, const ModelConfig& c, const char* arch, const std::string& what) {
  ANVIL_CHECK(ok, "a {} model cannot be written as transformers' {}: it has {}", model_family_title(c), arch, what);
}

// GPT2LMHeadModel as anvil's GPT-2 is: learned positions, LayerNorm with bias, tanh GELU
// (gelu_new), biases on every product, one key/value head per query head.
void check_gpt2(const ModelConfig& c) {
  const char* arch = "GPT2LMHeadModel";
  require(c.positions == PositionKind::kLearned, c, arch, "no learned position table (GPT-2 needs wpe)");
  require(c.norm == NormKind::kLayerNorm && c.norm_bias, c, arch, "norms other than LayerNorm with bias");
  require(c.mlp == MlpKind::kGeluTanh, c, arch, "an MLP other than tanh GELU (gelu_new)");
  require(c.linear_bias, c, arch, "no biases on its products");
  require(c.kv_heads() == c.n_heads, c, arch, "grouped-query attention (n_kv_heads)");
}

// LlamaForCausalLM as anvil's Llama is: RMSNorm, RoPE, SwiGLU, no biases.
void check_llama(const ModelConfig& c) {
  const char* arch = "LlamaForCausalLM";
  require(c.norm == NormKind::kRmsNorm, c, arch, "LayerNorm instead of RMSNorm");
  require(c.positions == PositionKind::kRope, c, arch, "positions other than RoPE");
  require(c.mlp == MlpKind::kSwiglu, c, arch, "a GELU MLP instead of SwiGLU");
  require(!c.linear_bias, c, arch, "biases on its products");
}

// transformers' MptForCausalLM: ALiBi, LayerNorm without bias, no biases, exact GELU of 4·d_model,
// one key/value head per query head, the head tied to the embedding.
void check_mpt(const ModelConfig& c) {
  const char* arch = "MptForCausalLM";
  require(c.positions == PositionKind::kAlibi, c, arch, "positions other than ALiBi (attn_config.alibi: true)");
  require(c.norm == NormKind::kLayerNorm, c, arch, "RMSNorm (transformers' MPT has LayerNorm)");
  require(!c.norm_bias && !c.linear_bias, c, arch, "biases (transformers' MPT is no_bias: true)");
  require(c.mlp == MlpKind::kGeluErf && c.mlp_width() == 4 * c.d_model, c, arch,
          "an MLP other than exact GELU with expansion_ratio 4");
  require(c.kv_heads() == c.n_heads, c, arch, "grouped-query attention (attn_config.kv_n_heads)");
  require(c.tied_embeddings, c, arch, "its own LM head (tie_word_embeddings: false)");
}


}  // namespace

std::vector<HfTensor> hf_tensors(const ModelConfig& c) {
  const int64_t C = c.d_model, V = c.vocab_size, F = c.mlp_width(), P = c.max_seq_len;
  const int64_t q = static_cast<int64_t>(c.n_heads) * c.head_size(), kv = static_cast<int64_t>(c.kv_heads()) * c.head_size();
  std::vector<HfTensor> t;
  // A whole anvil tensor as it is, or transposed.
  auto whole = [&](std::string name, std::string source, std::vector<int64_t> shape) {
    t.push_back({std::move(name), std::move(source), std::move(shape), 0, 0, false});
  };
  auto conv1d = [&](std::string name, std::string source, int64_t in, int64_t out) {
    t.push_back({std::move(name), std::move(source), {in, out}, 0, 0, true});
  };
  auto rows = [&](std::string name, std::string source, int64_t row0, int64_t n, std::vector<int64_t> shape) {
    t.push_back({std::move(name), std::move(source), std::move(shape), row0, n, false});
  };
  switch (c.name) {
    case ModelFamily::kGpt2: {
      check_gpt2(c);
      whole("transformer.wte.weight", "wte", {V, C});
      whole("transformer.wpe.weight", "wpe", {P, C});
      for (int l = 0; l < c.n_layers; l++) {
        const std::string h = fmt::format("transformer.h.{}.", l), a = fmt::format("h.{}.", l);
        whole(h + "ln_1.weight", a + "ln1w", {C});
        whole(h + "ln_1.bias", a + "ln1b", {C});
        conv1d(h + "attn.c_attn.weight", a + "qkvw", C, 3 * C);
        whole(h + "attn.c_attn.bias", a + "qkvb", {3 * C});
        conv1d(h + "attn.c_proj.weight", a + "attprojw", C, C);
        whole(h + "attn.c_proj.bias", a + "attprojb", {C});
        whole(h + "ln_2.weight", a + "ln2w", {C});
        whole(h + "ln_2.bias", a + "ln2b", {C});
        conv1d(h + "mlp.c_fc.weight", a + "fcw", C, F);
        whole(h + "mlp.c_fc.bias", a + "fcb", {F});
        conv1d(h + "mlp.c_proj.weight", a + "fcprojw", F, C);
        whole(h + "mlp.c_proj.bias", a + "fcprojb", {C});
      }
      whole("transformer.ln_f.weight", "lnfw", {C});
      whole("transformer.ln_f.bias", "lnfb", {C});
      break;
    }
    case ModelFamily::kLlama: {
      check_llama(c);
      whole("model.embed_tokens.weight", "wte", {V, C});
      for (int l = 0; l < c.n_layers; l++) {
        const std::string h = fmt::format("model.layers.{}.", l), a = fmt::format("h.{}.", l);
        whole(h + "input_layernorm.weight", a + "ln1w", {C});
        rows(h + "self_attn.q_proj.weight", a + "qkvw", 0, q, {q, C});
        rows(h + "self_attn.k_proj.weight", a + "qkvw", q, kv, {kv, C});
        rows(h + "self_attn.v_proj.weight", a + "qkvw", q + kv, kv, {kv, C});
        whole(h + "self_attn.o_proj.weight", a + "attprojw", {C, C});
        whole(h + "post_attention_layernorm.weight", a + "ln2w", {C});
        rows(h + "mlp.gate_proj.weight", a + "fcw", 0, F, {F, C});
        rows(h + "mlp.up_proj.weight", a + "fcw", F, F, {F, C});
        whole(h + "mlp.down_proj.weight", a + "fcprojw", {C, F});
      }
      whole("model.norm.weight", "lnfw", {C});
      break;
    }
    case ModelFamily::kMpt: {
      check_mpt(c);
      whole("transformer.wte.weight", "wte", {V, C});
      for (int l = 0; l < c.n_layers; l++) {
        const std::string h = fmt::format("transformer.blocks.{}.", l), a = fmt::format("h.{}.", l);
        whole(h + "norm_1.weight", a + "ln1w", {C});
        whole(h + "attn.Wqkv.weight", a + "qkvw", {3 * C, C});
        whole(h + "attn.out_proj.weight", a + "attprojw", {C, C});
        whole(h + "norm_2.weight", a + "ln2w", {C});
        whole(h + "ffn.up_proj.weight", a + "fcw", {F, C});
        whole(h + "ffn.down_proj.weight", a + "fcprojw", {C, F});
      }
      whole("transformer.norm_f.weight", "lnfw", {C});
      break;
    }
  }
  if (!c.tied_embeddings) whole("lm_head.weight", "lm_head", {V, C});
  return t;
}

nlohmann::ordered_json hf_config(const ModelConfig& c, const std::string& torch_dtype, int bos, int eos) {
  nlohmann::ordered_json j;
  switch (c.name) {
    case ModelFamily::kGpt2:
      check_gpt2(c);
      j = {{"architectures", {"GPT2LMHeadModel"}},
           {"model_type", "gpt2"},
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
      break;
    case ModelFamily::kLlama:
      check_llama(c);
      j = {{"architectures", {"LlamaForCausalLM"}},
           {"model_type", "llama"},
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
      break;
    case ModelFamily::kMpt:
      check_mpt(c);
      j = {{"architectures", {"MPTForCausalLM"}},
           {"model_type", "mpt"},
           {"vocab_size", c.vocab_size},
           {"d_model", c.d_model},
           {"n_heads", c.n_heads},
           {"n_layers", c.n_layers},
           {"expansion_ratio", 4},
           {"max_seq_len", c.max_seq_len},
           {"no_bias", true},
           {"norm_type", "low_precision_layernorm"},
           {"layer_norm_epsilon", 1e-5},
           {"learned_pos_emb", false},
           {"resid_pdrop", float_as_written(c.resid_pdrop)},
           {"emb_pdrop", float_as_written(c.emb_pdrop)},
           {"embedding_fraction", 1.0},
           {"logit_scale", nullptr},
           {"attn_config",
            {{"attn_type", "multihead_attention"},
             {"attn_impl", "torch"},
             {"attn_pdrop", float_as_written(c.attn_pdrop)},
             {"alibi", true},
             {"alibi_bias_max", static_cast<int>(c.alibi_bias_max)},
             {"clip_qkv", nullptr},
             {"qk_ln", false},
             {"softmax_scale", nullptr},
             {"prefix_lm", false},
             {"attn_uses_sequence_id", false}}},
           {"init_device", "cpu"},
           {"initializer_range", float_as_written(c.init_std)},
           {"tie_word_embeddings", true}};
      ANVIL_CHECK(c.alibi_bias_max == static_cast<float>(static_cast<int>(c.alibi_bias_max)),
                  "transformers' MPT takes an integer attn_config.alibi_bias_max; the model has {}", c.alibi_bias_max);
      break;
  }
  j["bos_token_id"] = bos;
  j["eos_token_id"] = eos;
  j["torch_dtype"] = torch_dtype;
  j["use_cache"] = true;
  return j;
}

namespace {

// The config.json fields read by hf_model_config, for one family: each is copied into the model
// section (under anvil's key) or checked; anything not listed is a field anvil does not know.
struct HfReader {
  const nlohmann::json& j;
  const std::string& where;
  YAML::Node section;

  bool has(const char* key) const { return j.contains(key) && !j.at(key).is_null(); }
  template <typename T>
  T get(const char* key, T fallback) const {
    if (!has(key)) return fallback;
    try {
      return j.at(key).get<T>();
    } catch (const nlohmann::json::exception&) {
      throw Error(fmt::format("{}: field '{}' has the wrong type ({})", where, key, j.at(key).dump()));
    }
  }
  template <typename T>
  T need(const char* key) const {
    ANVIL_CHECK(has(key), "{}: field '{}' is missing", where, key);
    return get<T>(key, T{});
  }
  void copy(const char* key, const char* anvil_key) {
    if (has(key)) section[anvil_key] = YAML::Load(j.at(key).dump());
  }
  template <typename T>
  void only(const char* key, T allowed, const std::string& why) const {
    ANVIL_CHECK(!has(key) || get<T>(key, allowed) == allowed, "{}: field '{}' = {} cannot be honoured ({})", where,
                key, j.at(key).dump(), why);
  }
  void absent(const char* key, const std::string& why) const {
    ANVIL_CHECK(!has(key), "{}: field '{}' = {} cannot be honoured ({})", where, key, j.at(key).dump(), why);
  }
};

}  // namespace

ModelConfig hf_model_config(const nlohmann::json& j, const std::string& where) {
  ANVIL_CHECK(j.is_object(), "{}: expected a JSON object", where);
  HfReader r{j, where, YAML::Node(YAML::NodeType::Map)};
  const std::string type = r.need<std::string>("model_type");
  if (type == "gpt2") {
    r.section["name"] = "gpt2";
    r.section["n_layers"] = r.need<int>("n_layer");
    r.section["n_heads"] = r.need<int>("n_head");
    const int C = r.need<int>("n_embd");
    r.section["d_model"] = C;
    r.copy("vocab_size", "vocab_size");
    r.section["max_seq_len"] = r.need<int>("n_positions");
    ANVIL_CHECK(r.get<int>("n_inner", 4 * C) == 4 * C, "{}: field 'n_inner' = {} cannot be honoured (anvil's "
                "GPT-2 has an MLP of 4·n_embd = {})", where, j.at("n_inner").dump(), 4 * C);
    r.only<std::string>("activation_function", "gelu_new", "anvil's GPT-2 uses the tanh GELU, gelu_new");
    r.only<double>("layer_norm_epsilon", 1e-5, "anvil's LayerNorm uses eps 1e-5");
    r.only<bool>("scale_attn_weights", true, "scores are always scaled by 1/sqrt(head size)");
    r.only<bool>("scale_attn_by_inverse_layer_idx", false, "scores are never scaled by the layer index");
    r.only<bool>("add_cross_attention", false, "anvil's decoders have no cross-attention");
    r.only<bool>("tie_word_embeddings", true, "anvil's GPT-2 ties its LM head to wte");
    for (const char* key : {"embd_pdrop", "attn_pdrop", "resid_pdrop"}) r.copy(key, key);
  } else if (type == "llama") {
    r.section["name"] = "llama";
    r.section["n_layers"] = r.need<int>("num_hidden_layers");
    const int heads = r.need<int>("num_attention_heads"), C = r.need<int>("hidden_size");
    r.section["n_heads"] = heads;
    r.section["d_model"] = C;
    r.copy("num_key_value_heads", "n_kv_heads");
    r.copy("vocab_size", "vocab_size");
    r.section["max_seq_len"] = r.need<int>("max_position_embeddings");
    r.section["intermediate_size"] = r.need<int>("intermediate_size");
    r.copy("rope_theta", "rope_theta");
    r.copy("rms_norm_eps", "rms_norm_eps");
    r.copy("initializer_range", "init_std");
    r.section["tie_word_embeddings"] = r.get<bool>("tie_word_embeddings", false);
    ANVIL_CHECK(r.get<int>("head_dim", C / heads) == C / heads, "{}: field 'head_dim' = {} cannot be honoured "
                "(anvil's head size is hidden_size / num_attention_heads = {})", where, j.at("head_dim").dump(), C / heads);
    r.only<std::string>("hidden_act", "silu", "Llama's MLP is SwiGLU, silu");
    r.absent("rope_scaling", "RoPE is applied unscaled");
    r.absent("sliding_window", "attention covers the whole causal context");
    r.only<bool>("attention_bias", false, "anvil's Llama has no biases");
    r.only<bool>("mlp_bias", false, "anvil's Llama has no biases");
    r.only<int>("pretraining_tp", 1, "tensor-parallel slicing of the products");
    r.copy("attention_dropout", "attention_dropout");
  } else if (type == "mpt") {
    r.section["name"] = "mpt_causal_lm";
    for (const char* key : {"d_model", "n_heads", "n_layers", "expansion_ratio", "max_seq_len", "vocab_size"})
      r.copy(key, key);
    r.section["no_bias"] = true;  // transformers' MPT has no biases, whatever the field says
    r.only<bool>("no_bias", true, "transformers' MPT has no biases");
    r.only<double>("layer_norm_epsilon", 1e-5, "anvil's LayerNorm uses eps 1e-5");
    r.only<bool>("learned_pos_emb", false, "transformers' MPT uses ALiBi, not a position table");
    r.copy("resid_pdrop", "resid_pdrop");
    r.copy("emb_pdrop", "emb_pdrop");
    r.only<double>("embedding_fraction", 1.0, "the embeddings' gradient is never scaled down");
    r.absent("logit_scale", "the logits are never scaled");
    YAML::Node attn(YAML::NodeType::Map);
    attn["alibi"] = true;
    if (r.has("attn_config")) {
      const nlohmann::json& a = j.at("attn_config");
      HfReader ar{a, where, YAML::Node()};
      if (ar.has("alibi_bias_max")) attn["alibi_bias_max"] = ar.get<double>("alibi_bias_max", 8);
      ar.only<bool>("alibi", true, "transformers' MPT always uses ALiBi");
      ar.only<bool>("qk_ln", false, "anvil has no QK LayerNorm yet");
      ar.absent("clip_qkv", "q, k and v are never clipped");
      ar.absent("softmax_scale", "scores are scaled by 1/sqrt(head size)");
      ar.only<bool>("prefix_lm", false, "attention is causal");
      ar.only<bool>("attn_uses_sequence_id", false, "attention is not cut at sequence ids");
      if (ar.has("attn_pdrop")) attn["attn_pdrop"] = ar.get<double>("attn_pdrop", 0);
    }
    r.section["attn_config"] = attn;
  } else {
    ANVIL_FAIL("{}: model_type '{}' is not one anvil can import (expected gpt2, llama or mpt)", where, type);
  }
  ModelConfig c;
  MapReader m(r.section, "model", where);
  read_model_section(m, c, where);
  ANVIL_CHECK(c.n_layers > 0 && c.n_heads > 0 && c.d_model > 0 && c.vocab_size > 0 && c.max_seq_len > 0,
              "{}: the layer, head, width, vocabulary and context sizes must be positive", where);
  ANVIL_CHECK(c.d_model % c.n_heads == 0 && c.n_heads % c.kv_heads() == 0,
              "{}: {} heads over {} key/value heads do not divide a width of {}", where, c.n_heads, c.kv_heads(),
              c.d_model);
  ANVIL_CHECK(c.positions != PositionKind::kRope || c.head_size() % 2 == 0, "{}: RoPE needs an even head size, not {}",
              where, c.head_size());
  return c;
}

}  // namespace anvil
