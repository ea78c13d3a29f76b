// The families' keys: what each spells, its defaults, and what anvil cannot honour.
#include "config/model_section.h"

#include <yaml-cpp/yaml.h>

#include <cmath>

#include "config/lora_config.h"
#include "config/yaml_number.h"
#include "core/error.h"

namespace anvil {
namespace {

// GPT-2 is ModelConfig's defaults: only its sizes are keys.
void read_gpt2(MapReader& m, ModelConfig& c) {
  m.get("n_layers", c.n_layers);
  m.get("n_heads", c.n_heads);
  m.get("d_model", c.d_model);
  m.get("vocab_size", c.vocab_size);
  m.get("max_seq_len", c.max_seq_len);
}

// A dropout probability: in [0, 1).
void read_pdrop(MapReader& m, const char* key, float& out, const std::string& file) {
  double p = out;
  m.get(key, p);
  ANVIL_CHECK(p >= 0 && p < 1, "{}: {} = {} must be in [0, 1)", file, m.full(key), p);
  out = static_cast<float>(p);
}

// A key whose only value anvil honours is Foundry's default: any other is an error.
template <class T>
void only(MapReader& r, const char* key, const T& honoured, const std::string& file, const char* why) {
  T v = honoured;
  r.get(key, v);
  ANVIL_CHECK(v == honoured, "{}: {} = {} is not supported ({}); expected {}", file, r.full(key), r.raw(key).Scalar(),
              why, YAML::Node(honoured).Scalar());
}
// A key that must be absent or null (Foundry's "not set").
void unset(MapReader& r, const char* key, const std::string& file, const char* why) {
  ANVIL_CHECK(!r.has(key), "{}: {} is not supported ({}); leave it unset", file, r.full(key), why);
}

// LLM Foundry's mpt_causal_lm, as its configuration_mpt and config_defaults spell it.
void read_mpt(MapReader& m, ModelConfig& c, const std::string& file) {
  c.vocab_size = 50368;
  c.mlp = MlpKind::kGeluErf;
  c.init = InitScheme::kKaimingNormal;
  read_gpt2(m, c);
  double expansion_ratio = 4;
  m.get("expansion_ratio", expansion_ratio);
  std::string init_device = "cpu";  // where Foundry materialises weights; anvil initialises each shard in place
  m.get("init_device", init_device);
  ANVIL_CHECK(init_device == "cpu" || init_device == "meta" || init_device == "mixed",
              "{}: {} = '{}' is not known (expected cpu, meta or mixed)", file, m.full("init_device"), init_device);
  bool no_bias = false;
  m.get("no_bias", no_bias);
  c.linear_bias = c.norm_bias = !no_bias;
  std::string norm_type = "low_precision_layernorm";
  m.get("norm_type", norm_type);
  // The low-precision variants run the norm in the autocast dtype; anvil's norms always run in
  // fp32 (docs/precision.md), which is at least as accurate.
  if (norm_type == "layernorm" || norm_type == "low_precision_layernorm") {
    c.norm = NormKind::kLayerNorm;
  } else if (norm_type == "rmsnorm" || norm_type == "low_precision_rmsnorm") {
    c.norm = NormKind::kRmsNorm;
  } else {
    ANVIL_FAIL("{}: {} = '{}' is not supported (expected layernorm, low_precision_layernorm, rmsnorm or "
               "low_precision_rmsnorm)", file, m.full("norm_type"), norm_type);
  }
  double norm_eps = 1e-5;
  m.get("norm_eps", norm_eps);
  c.norm_eps = static_cast<float>(norm_eps);
  ANVIL_CHECK(c.norm == NormKind::kRmsNorm || c.norm_eps == 1e-5f,
              "{}: {} = {} is not supported with a LayerNorm (anvil's LayerNorm uses eps 1e-5)", file,
              m.full("norm_eps"), norm_eps);
  m.get("tie_word_embeddings", c.tied_embeddings);
  read_pdrop(m, "emb_pdrop", c.emb_pdrop, file);
  read_pdrop(m, "resid_pdrop", c.resid_pdrop, file);
  only(m, "embedding_fraction", 1.0, file, "the embeddings' gradient is never scaled down");
  unset(m, "logit_scale", file, "the logits are never scaled");
  bool use_cache = false;  // generation's key/value cache: no effect on training
  m.get("use_cache", use_cache);
  std::string loss_fn = "fused_crossentropy";
  m.get("loss_fn", loss_fn);
  ANVIL_CHECK(loss_fn == "fused_crossentropy" || loss_fn == "torch_crossentropy",
              "{}: {} = '{}' is not known (expected fused_crossentropy or torch_crossentropy; anvil's own fused "
              "cross-entropy computes either)", file, m.full("loss_fn"), loss_fn);

  bool learned_pos_emb = true, learned_given = m.has("learned_pos_emb");
  m.get("learned_pos_emb", learned_pos_emb);
  bool alibi = false, rope = false;
  {
    MapReader a = m.sub("attn_config");
    std::string impl = "flash";
    a.get("attn_impl", impl);
    // triton: the Triton flash attention of Foundry's older files.
    ANVIL_CHECK(impl == "flash" || impl == "torch" || impl == "triton", "{}: {} = '{}' is not known (expected "
                "flash, torch or triton; anvil runs its own attention whichever)", file, a.full("attn_impl"), impl);
    std::string type = "multihead_attention";
    a.get("attn_type", type);
    int kv_n_heads = 1;
    a.get("kv_n_heads", kv_n_heads);
    if (type == "multihead_attention") {
      c.n_kv_heads = 0;
    } else if (type == "multiquery_attention") {
      c.n_kv_heads = 1;
    } else if (type == "grouped_query_attention") {
      ANVIL_CHECK(kv_n_heads >= 1, "{}: {} must be positive", file, a.full("kv_n_heads"));
      c.n_kv_heads = kv_n_heads;
    } else {
      ANVIL_FAIL("{}: {} = '{}' is not known (expected multihead_attention, multiquery_attention or "
                 "grouped_query_attention)", file, a.full("attn_type"), type);
    }
    a.get("alibi", alibi);
    double bias_max = 8;
    a.get("alibi_bias_max", bias_max);
    c.alibi_bias_max = static_cast<float>(bias_max);
    ANVIL_CHECK(bias_max > 0, "{}: {} must be positive", file, a.full("alibi_bias_max"));
    a.get("rope", rope);
    double theta = 10000;
    a.get("rope_theta", theta);
    c.rope_theta = static_cast<float>(theta);
    ANVIL_CHECK(theta > 0, "{}: {} must be positive", file, a.full("rope_theta"));
    // Both implementations rotate halves (flash-attn's rotary, non-interleaved, and Hugging Face's).
    std::string rope_impl = "dail";
    a.get("rope_impl", rope_impl);
    ANVIL_CHECK(rope_impl == "dail" || rope_impl == "hf", "{}: {} = '{}' is not known (expected dail or hf)", file,
                a.full("rope_impl"), rope_impl);
    {
      MapReader d = a.sub("rope_dail_config");
      only(d, "type", std::string("original"), file, "RoPE without scaling only");
      only(d, "pos_idx_in_fp32", true, file, "positions are formed in fp32");
      int xpos = 512;  // used only by the xpos type
      d.get("xpos_scale_base", xpos);
      d.finish();
    }
    {
      MapReader h = a.sub("rope_hf_config");
      only(h, "type", std::string("no_scaling"), file, "RoPE without scaling only");
      double factor = 1.0;
      h.get("factor", factor);
      h.finish();
    }
    read_pdrop(a, "attn_pdrop", c.attn_pdrop, file);
    a.get("qk_ln", c.qk_norm);
    only(a, "qk_gn", false, file, "no group norm on queries and keys");
    only(a, "fused_qkv", true, file, "q, k and v are one fused product");
    only(a, "sliding_window_size", -1, file, "attention is causal over the whole sequence");
    only(a, "attn_uses_sequence_id", false, file, "sequences are not packed");
    unset(a, "clip_qkv", file, "q, k and v are not clipped");
    unset(a, "softmax_scale", file, "the scale is 1/sqrt(head size)");
    a.finish();
  }
  ANVIL_CHECK(!(alibi && rope), "{}: model.attn_config.alibi and model.attn_config.rope cannot both be true", file);
  ANVIL_CHECK(!((alibi || rope) && learned_given && learned_pos_emb),
              "{}: model.learned_pos_emb = true with {} is not supported: anvil adds positions one way (leave "
              "learned_pos_emb unset or false)", file, alibi ? "ALiBi" : "RoPE");
  c.positions = alibi ? PositionKind::kAlibi : rope ? PositionKind::kRope
                : learned_pos_emb ? PositionKind::kLearned : PositionKind::kNone;
  {
    MapReader f = m.sub("ffn_config");
    std::string type = "mptmlp";
    f.get("ffn_type", type);
    ANVIL_CHECK(type == "mptmlp" || type == "mptglu", "{}: {} = '{}' is not supported (expected mptmlp or mptglu)",
                file, f.full("ffn_type"), type);
    std::string act = "gelu", approximate = "none";
    {
      MapReader a = f.sub("ffn_act_fn");
      a.get("name", act);
      a.get("approximate", approximate);
      a.finish();
    }
    if (type == "mptglu") {
      ANVIL_CHECK(act == "silu", "{}: {} = '{}' with mptglu is not supported: anvil's gated MLP is SwiGLU (name: "
                  "silu)", file, f.full("ffn_act_fn.name"), act);
      c.mlp = MlpKind::kSwiglu;
    } else {
      ANVIL_CHECK(act == "gelu" && (approximate == "none" || approximate == "tanh"),
                  "{}: {} = {} (approximate {}) is not supported with mptmlp: expected gelu, approximate none or tanh",
                  file, f.full("ffn_act_fn"), act, approximate);
      c.mlp = approximate == "tanh" ? MlpKind::kGeluTanh : MlpKind::kGeluErf;
    }
    int hidden = 0;
    f.get("ffn_hidden_size", hidden);
    if (hidden > 0) {
      c.mlp_hidden = hidden;  // as in Foundry, it wins over expansion_ratio
    } else {
      const double h = expansion_ratio * c.d_model;
      ANVIL_CHECK(h >= 1 && h == std::floor(h), "{}: {} × d_model = {} is not a whole number of hidden units", file,
                  m.full("expansion_ratio"), h);
      c.mlp_hidden = static_cast<int>(h);
    }
    f.finish();
  }
  {
    MapReader i = m.sub("init_config");
    only(i, "name", std::string("kaiming_normal_"), file, "MPT's default initialisation only");
    only(i, "fan_mode", std::string("fan_in"), file, "MPT's default initialisation only");
    only(i, "init_nonlinearity", std::string("relu"), file, "MPT's default initialisation only");
    only(i, "init_div_is_residual", true, file, "MPT's default initialisation only");
    only(i, "init_gain", 0.0, file, "MPT's default initialisation only");
    unset(i, "emb_init_std", file, "MPT's default initialisation only");
    unset(i, "emb_init_uniform_lim", file, "MPT's default initialisation only");
    unset(i, "init_std", file, "MPT's default initialisation only");
    i.finish();
  }
}

// Llama, under anvil's size names and Hugging Face's for the rest (rms_norm_eps, rope_theta, ...).
void read_llama(MapReader& m, ModelConfig& c, const std::string& file) {
  c.vocab_size = 32000;
  c.norm = NormKind::kRmsNorm;
  c.positions = PositionKind::kRope;
  c.mlp = MlpKind::kSwiglu;
  c.linear_bias = false;
  c.norm_bias = false;
  c.tied_embeddings = false;
  c.init = InitScheme::kNormal;
  read_gpt2(m, c);
  m.get("n_kv_heads", c.n_kv_heads);
  ANVIL_CHECK(c.n_kv_heads >= 0, "{}: {} must be positive", file, m.full("n_kv_heads"));
  m.get("intermediate_size", c.mlp_hidden);
  if (c.mlp_hidden == 0) {
    // Llama's rule: two thirds of 4·d_model, rounded up to a multiple of 256.
    const int h = 8 * c.d_model / 3;
    c.mlp_hidden = 256 * ((h + 255) / 256);
  }
  double theta = 10000, eps = 1e-5, std = 0.02;
  m.get("rope_theta", theta);
  m.get("rms_norm_eps", eps);
  m.get("init_std", std);
  ANVIL_CHECK(theta > 0 && eps > 0 && std > 0, "{}: model.rope_theta, model.rms_norm_eps and model.init_std must be "
              "positive", file);
  c.rope_theta = static_cast<float>(theta);
  c.norm_eps = static_cast<float>(eps);
  c.init_std = static_cast<float>(std);
  m.get("tie_word_embeddings", c.tied_embeddings);
  read_pdrop(m, "attention_dropout", c.attn_pdrop, file);  // Hugging Face's only Llama dropout
}

}  // namespace

void read_model_section(MapReader& m, ModelConfig& c, const std::string& file) {
  m.get("name", c.name);
  switch (c.name) {
    case ModelFamily::kGpt2:
      read_gpt2(m, c);
      // Hugging Face's GPT2Config names.
      read_pdrop(m, "embd_pdrop", c.emb_pdrop, file);
      read_pdrop(m, "attn_pdrop", c.attn_pdrop, file);
      read_pdrop(m, "resid_pdrop", c.resid_pdrop, file);
      break;
    case ModelFamily::kMpt:
      read_mpt(m, c, file);
      break;
    case ModelFamily::kLlama:
      read_llama(m, c, file);
      break;
  }
  read_peft_config(m, c, file);
  m.finish();
}

void write_model_section(YAML::Emitter& e, const ModelConfig& c) {
  auto key = [&](const char* k, const auto& v) { e << YAML::Key << k << YAML::Value << yaml_value(v); };
  e << YAML::BeginMap;
  key("name", choice_name(c.name));
  key("n_layers", c.n_layers);
  key("n_heads", c.n_heads);
  key("d_model", c.d_model);
  key("vocab_size", c.vocab_size);
  key("max_seq_len", c.max_seq_len);
  if (c.name == ModelFamily::kGpt2) {
    key("embd_pdrop", c.emb_pdrop);
    key("attn_pdrop", c.attn_pdrop);
    key("resid_pdrop", c.resid_pdrop);
  } else if (c.name == ModelFamily::kMpt) {
    key("no_bias", !c.linear_bias);
    key("norm_type", c.norm == NormKind::kRmsNorm ? "rmsnorm" : "layernorm");
    key("norm_eps", c.norm_eps);
    key("learned_pos_emb", c.positions == PositionKind::kLearned);
    key("tie_word_embeddings", c.tied_embeddings);
    key("emb_pdrop", c.emb_pdrop);
    key("resid_pdrop", c.resid_pdrop);
    e << YAML::Key << "attn_config" << YAML::Value << YAML::BeginMap;
    key("attn_pdrop", c.attn_pdrop);
    key("attn_type", c.n_kv_heads == 0 ? "multihead_attention" : "grouped_query_attention");
    if (c.n_kv_heads) key("kv_n_heads", c.n_kv_heads);
    key("alibi", c.positions == PositionKind::kAlibi);
    key("alibi_bias_max", c.alibi_bias_max);
    key("rope", c.positions == PositionKind::kRope);
    key("rope_theta", c.rope_theta);
    key("qk_ln", c.qk_norm);
    e << YAML::EndMap;
    e << YAML::Key << "ffn_config" << YAML::Value << YAML::BeginMap;
    key("ffn_type", c.mlp == MlpKind::kSwiglu ? "mptglu" : "mptmlp");
    e << YAML::Key << "ffn_act_fn" << YAML::Value << YAML::BeginMap;
    key("name", c.mlp == MlpKind::kSwiglu ? "silu" : "gelu");
    if (c.mlp != MlpKind::kSwiglu) key("approximate", c.mlp == MlpKind::kGeluTanh ? "tanh" : "none");
    e << YAML::EndMap;
    key("ffn_hidden_size", c.mlp_width());
    e << YAML::EndMap;
  } else if (c.name == ModelFamily::kLlama) {
    if (c.n_kv_heads) key("n_kv_heads", c.n_kv_heads);
    key("intermediate_size", c.mlp_width());
    key("rope_theta", c.rope_theta);
    key("rms_norm_eps", c.norm_eps);
    key("init_std", c.init_std);
    key("tie_word_embeddings", c.tied_embeddings);
    key("attention_dropout", c.attn_pdrop);
  }
  write_peft_config(e, c);
  e << YAML::EndMap;
}

}  // namespace anvil
