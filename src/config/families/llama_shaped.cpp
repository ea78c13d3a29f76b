#include "config/families/llama_shaped.h"

#include <yaml-cpp/yaml.h>

#include <fmt/format.h>

#include "config/families/hf_fields.h"
#include "config/families/keys.h"
#include "config/yaml_number.h"

namespace anvil {
namespace {

// transformers' rope_scaling, as its rope_config_validation asks for it: rope_type (`type` in
// older files) default, linear (factor) or llama3 (factor, low_freq_factor, high_freq_factor,
// original_max_position_embeddings, all required).
void read_rope_scaling(MapReader& m, RopeFrequencies& f) {
  if (!m.has("rope_scaling")) return;
  MapReader s = m.sub("rope_scaling");
  const bool older_name = s.has("type");
  ANVIL_CHECK(!(older_name && s.has("rope_type")), "{}: {} and {} name the same thing: give one",
              s.source("type"), s.full("rope_type"), s.full("type"));
  const char* type_key = older_name ? "type" : "rope_type";
  ANVIL_CHECK(s.has(type_key), "{}: {} is missing (default, linear or llama3)", m.source("rope_scaling"),
              s.full("rope_type"));
  s.get(type_key, f.scaling);
  auto required = [&](const char* key) {
    ANVIL_CHECK(s.has(key), "{}: {} is missing (rope_type {} needs it)", m.source("rope_scaling"), s.full(key),
                choice_name(f.scaling));
  };
  if (f.scaling != RopeScalingKind::kNone) {
    required("factor");
    read_positive(s, "factor", f.factor);
  }
  if (f.scaling == RopeScalingKind::kLlama3) {
    for (const char* key : {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) required(key);
    read_positive(s, "low_freq_factor", f.low_freq_factor);
    read_positive(s, "high_freq_factor", f.high_freq_factor);
    s.get("original_max_position_embeddings", f.original_max_position);
    ANVIL_CHECK(f.original_max_position > 0, "{}: {} = {} must be a positive number of positions",
                s.source("original_max_position_embeddings"), s.full("original_max_position_embeddings"),
                f.original_max_position);
    ANVIL_CHECK(f.high_freq_factor > f.low_freq_factor, "{}: {} = {:g} must be above {} = {:g}",
                s.source("high_freq_factor"), s.full("high_freq_factor"), f.high_freq_factor,
                s.full("low_freq_factor"), f.low_freq_factor);
  }
  s.finish();
}

// The same mapping, as config.json (transformers >= 4.43) and the model section write it.
template <class Map>
void rope_scaling_fields(const RopeFrequencies& f, Map&& set) {
  set("rope_type", choice_name(f.scaling));
  set("factor", f.factor);
  if (f.scaling != RopeScalingKind::kLlama3) return;
  set("low_freq_factor", f.low_freq_factor);
  set("high_freq_factor", f.high_freq_factor);
  set("original_max_position_embeddings", f.original_max_position);
}

}  // namespace

void LlamaShaped::read_keys(MapReader& m, ModelConfig& c) const {
  c.vocab_size = 32000;
  c.norm = NormKind::kRmsNorm;
  c.positions = PositionKind::kRope;
  c.mlp = MlpKind::kSwiglu;
  c.linear_bias = false;
  c.norm_bias = false;
  c.tied_embeddings = false;
  c.init = InitScheme::kNormal;
  own_defaults(c);
  read_sizes(m, c);
  m.get("n_kv_heads", c.n_kv_heads);
  m.get("head_dim", c.head_dim);
  ANVIL_CHECK(c.head_dim >= 0, "{}: {} = {} must be a positive number of channels", m.source("head_dim"),
              m.full("head_dim"), c.head_dim);
  // One spelling of each model: a head size that d_model / n_heads gives is not kept apart.
  if (c.n_heads > 0 && c.head_dim * c.n_heads == c.d_model) c.head_dim = 0;
  m.get("intermediate_size", c.mlp_hidden);
  if (c.mlp_hidden == 0) {
    // Llama's rule: two thirds of 4·d_model, rounded up to a multiple of 256.
    const int h = 8 * c.d_model / 3;
    c.mlp_hidden = 256 * ((h + 255) / 256);
  }
  read_positive(m, "rope_theta", c.rope.theta);
  if (rope_scaling) read_rope_scaling(m, c.rope);
  read_positive(m, "rms_norm_eps", c.norm_eps);
  read_positive(m, "init_std", c.init_std);
  m.get("tie_word_embeddings", c.tied_embeddings);
  read_pdrop(m, "attention_dropout", c.attn_pdrop);  // transformers' only dropout in these models
  if (sliding_window) {
    m.get("sliding_window", c.sliding_window);
    ANVIL_CHECK(c.sliding_window >= 0, "{}: {} = {} must be a positive number of keys (or null: none)",
                m.source("sliding_window"), m.full("sliding_window"), c.sliding_window);
  }
  read_own_keys(m, c);
}

void LlamaShaped::read_routing(MapReader& m, ModelConfig& c, const char* experts_key) const {
  m.get(experts_key, c.moe.experts);
  ANVIL_CHECK(c.moe.experts >= 1, "{}: {} = {} must be at least 1", m.source(experts_key), m.full(experts_key),
              c.moe.experts);
  m.get("num_experts_per_tok", c.moe.top_k);
  ANVIL_CHECK(c.moe.top_k >= 1 && c.moe.top_k <= c.moe.experts, "{}: {} = {} must be between 1 and {} ({})",
              m.source("num_experts_per_tok"), m.full("num_experts_per_tok"), c.moe.top_k, experts_key,
              c.moe.experts);
  const std::string why = fmt::format("transformers' router loss over the whole batch is not anvil's per-sequence "
                                      "balancing loss, so anvil trains {} without one, as transformers does by "
                                      "default", title);
  only(m, "output_router_logits", false, why.c_str());
  ignored<double>(m, "router_aux_loss_coef");
}

void LlamaShaped::write_keys(YAML::Emitter& e, const ModelConfig& c) const {
  auto key = [&](const char* k, const auto& v) { e << YAML::Key << k << YAML::Value << yaml_value(v); };
  if (c.n_kv_heads) key("n_kv_heads", c.n_kv_heads);
  if (c.head_dim) key("head_dim", c.head_dim);
  key("intermediate_size", c.mlp_width());
  key("rope_theta", c.rope.theta);
  if (c.rope.scaling != RopeScalingKind::kNone) {
    e << YAML::Key << "rope_scaling" << YAML::Value << YAML::Flow << YAML::BeginMap;
    rope_scaling_fields(c.rope, [&](const char* k, const auto& v) { key(k, v); });
    e << YAML::EndMap;
  }
  key("rms_norm_eps", c.norm_eps);
  key("init_std", c.init_std);
  key("tie_word_embeddings", c.tied_embeddings);
  key("attention_dropout", c.attn_pdrop);
  if (sliding_window && c.sliding_window) key("sliding_window", c.sliding_window);
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
  if (f.has("rope_parameters")) {  // transformers 5: rope_theta beside the scaling in one mapping
    HfFields p = f.sub("rope_parameters");
    p.copy("rope_theta", "rope_theta");
    if (rope_scaling)
      f.copy_mapping("rope_parameters", "rope_scaling", {"rope_theta"});
    else
      p.only<std::string>("rope_type", "default", "RoPE is applied unscaled");
  } else {
    f.copy("rope_theta", "rope_theta");
    if (rope_scaling)
      f.copy("rope_scaling", "rope_scaling");
    else
      f.absent("rope_scaling", "RoPE is applied unscaled");
  }
  f.copy("rms_norm_eps", "rms_norm_eps");
  f.copy("initializer_range", "init_std");
  f.set("tie_word_embeddings", f.get<bool>("tie_word_embeddings", false), "tie_word_embeddings");
  f.copy("head_dim", "head_dim");
  f.only<std::string>("hidden_act", "silu", "the MLP is SwiGLU, silu");
  f.copy("attention_dropout", "attention_dropout");
  if (sliding_window) f.copy("sliding_window", "sliding_window");
  own_keys_from_hf(f);
}

void LlamaShaped::check_hf(const ModelConfig& c) const {
  ModelConfig own;  // what the family's transformers class builds
  own_defaults(own);
  require(c.qkv_bias == own.qkv_bias, c.qkv_bias ? "biases on q, k and v" : "no biases on q, k and v");
  require(c.qk_norm == own.qk_norm, c.qk_norm == QkNorm::kNone ? "no norm on each head's queries and keys"
                                                               : "a norm on the queries and keys");
  require(c.norm == NormKind::kRmsNorm, "LayerNorm instead of RMSNorm");
  require(c.positions == PositionKind::kRope, "positions other than RoPE");
  require(c.mlp == MlpKind::kSwiglu, "a GELU MLP instead of SwiGLU");
  require(!c.linear_bias, "biases on its products");
  require(c.has_moe() == own.has_moe(), c.has_moe() ? "mixture-of-experts MLPs" : "dense MLPs");
  if (c.has_moe())
    require(c.moe.capacity_factor == 0 && c.moe.loss_weight == 0 &&
                (c.moe.normalize_p == 1 || (optional_renormalization() && c.moe.normalize_p == 0)),
            "a mixture of experts with a capacity, a balancing loss, or its chosen weights normed otherwise");
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
                              {"rope_theta", float_as_written(c.rope.theta)},
                              {"attention_dropout", float_as_written(c.attn_pdrop)},
                              {"initializer_range", float_as_written(c.init_std)},
                              {"tie_word_embeddings", c.tied_embeddings}};
  if (rope_scaling) {
    nlohmann::ordered_json s;  // null: unscaled
    if (c.rope.scaling != RopeScalingKind::kNone)
      rope_scaling_fields(c.rope, [&](const char* k, const auto& v) {
        if constexpr (std::is_floating_point_v<std::decay_t<decltype(v)>>)
          s[k] = float_as_written(v);
        else
          s[k] = v;
      });
    j["rope_scaling"] = s;
  }
  if (sliding_window)
    j["sliding_window"] = c.sliding_window ? nlohmann::ordered_json(c.sliding_window) : nlohmann::ordered_json();
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
    if (c.qkv_bias) {
      t.rows(h + "self_attn.q_proj.bias", a + "qkvb", 0, q, {q});
      t.rows(h + "self_attn.k_proj.bias", a + "qkvb", q, kv, {kv});
      t.rows(h + "self_attn.v_proj.bias", a + "qkvb", q + kv, kv, {kv});
    }
    if (c.qk_norm == QkNorm::kPerHead) {
      t.whole(h + "self_attn.q_norm.weight", a + "qlnw", {c.head_size()});
      t.whole(h + "self_attn.k_norm.weight", a + "klnw", {c.head_size()});
    }
    t.whole(h + "self_attn.o_proj.weight", a + "attprojw", {C, q});
    t.whole(h + "post_attention_layernorm.weight", a + "ln2w", {C});
    if (c.has_moe()) {
      // The experts, each its own gate, up and down products (Mixtral's w1, w3 and w2): expert e's
      // gate rows, then its up rows, from e·2F in anvil's fused first product.
      const int64_t E = c.moe.experts;
      const MoeNames n = moe_names();
      const std::string moe = h + n.block;
      t.whole(moe + "gate.weight", a + "routerw", {E, C});
      for (int64_t e = 0; e < E; e++) {
        const std::string x = fmt::format("{}experts.{}.", moe, e);
        t.rows(x + n.gate + ".weight", a + "fcw", 2 * F * e, F, {F, C});
        t.rows(x + n.down + ".weight", a + "fcprojw", C * e, C, {C, F});
        t.rows(x + n.up + ".weight", a + "fcw", 2 * F * e + F, F, {F, C});
      }
      continue;
    }
    t.rows(h + "mlp.gate_proj.weight", a + "fcw", 0, F, {F, C});
    t.rows(h + "mlp.up_proj.weight", a + "fcw", F, F, {F, C});
    t.whole(h + "mlp.down_proj.weight", a + "fcprojw", {C, F});
  }
  t.whole("model.norm.weight", "lnfw", {C});
}

std::string LlamaShaped::lora_unadaptable(const ModelConfig& c) const {
  const MoeNames n = moe_names();
  return c.has_moe() ? fmt::format("the experts' {}, {} and {}", n.gate, n.up, n.down) : "";
}

std::vector<LoraModule> LlamaShaped::lora_modules(const ModelConfig& c) const {
  const int C = c.d_model, F = c.mlp_width(), q = c.q_width(), kv = c.kv_width();
  using P = BlockProduct;
  std::vector<LoraModule> m = {{"self_attn.q_proj", P::kQkv, 0, q, C}, {"self_attn.k_proj", P::kQkv, q, kv, C},
                               {"self_attn.v_proj", P::kQkv, q + kv, kv, C},
                               {"self_attn.o_proj", P::kAttnOut, 0, C, q}};
  // The router; the experts' products are not adaptable yet (lora_unadaptable).
  if (c.has_moe()) {
    m.push_back({std::string(moe_names().block) + "gate", P::kRouter, 0, c.moe.experts, C});
    return m;
  }
  m.push_back({"mlp.gate_proj", P::kFc, 0, F, C});
  m.push_back({"mlp.up_proj", P::kFc, F, F, C});
  m.push_back({"mlp.down_proj", P::kFcProj, 0, C, F});
  return m;
}

}  // namespace anvil
