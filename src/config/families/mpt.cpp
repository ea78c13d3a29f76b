// MPT: LLM Foundry's mpt_causal_lm, its keys as Foundry's configuration_mpt and config_defaults
// spell them (attn_config, ffn_config and init_config included), and transformers'
// MptForCausalLM, which holds the ALiBi, bias-free, exact-GELU MPT of MosaicML's published models.
#include <yaml-cpp/yaml.h>

#include <cmath>

#include <fmt/format.h>

#include "config/families/family.h"
#include "config/families/hf_fields.h"
#include "config/families/keys.h"
#include "config/yaml_number.h"

namespace anvil {
namespace {

constexpr const char* kDefaultInitOnly = "MPT's default initialisation only";

class Mpt final : public Family {
 public:
  Mpt()
      : Family(ModelFamily::kMpt, "MPT", "mpt", "MptForCausalLM", "transformer.blocks.{}.", "", /*hf_conv1d=*/false,
               "attn_config.kv_n_heads", "ffn_config.ffn_hidden_size", {"Wqkv"}) {}

  void read_keys(MapReader& m, ModelConfig& c) const override {
    c.vocab_size = 50368;
    c.mlp = MlpKind::kGeluErf;
    c.init = InitScheme::kKaimingNormal;
    read_sizes(m, c);
    double expansion_ratio = 4;
    m.get("expansion_ratio", expansion_ratio);
    std::string init_device = "cpu";  // where Foundry materialises weights; anvil initialises each shard in place
    m.get("init_device", init_device);
    ANVIL_CHECK(init_device == "cpu" || init_device == "meta" || init_device == "mixed",
                "{}: {} = '{}' is not known (expected cpu, meta or mixed)", m.source("init_device"),
                m.full("init_device"), init_device);
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
                 "low_precision_rmsnorm)", m.source("norm_type"), m.full("norm_type"), norm_type);
    }
    double norm_eps = 1e-5;
    m.get("norm_eps", norm_eps);
    c.norm_eps = static_cast<float>(norm_eps);
    ANVIL_CHECK(c.norm == NormKind::kRmsNorm || c.norm_eps == 1e-5f, "{}: {} = {} is not supported with a LayerNorm "
                "(anvil's LayerNorm uses eps 1e-5)", m.source("norm_eps"), m.full("norm_eps"), norm_eps);
    m.get("tie_word_embeddings", c.tied_embeddings);
    read_pdrop(m, "emb_pdrop", c.emb_pdrop);
    read_pdrop(m, "resid_pdrop", c.resid_pdrop);
    only(m, "embedding_fraction", 1.0, "the embeddings' gradient is never scaled down");
    unset(m, "logit_scale", "the logits are never scaled");
    ignored<bool>(m, "use_cache");  // generation's key/value cache: no effect on training
    std::string loss_fn = "fused_crossentropy";
    m.get("loss_fn", loss_fn);
    ANVIL_CHECK(loss_fn == "fused_crossentropy" || loss_fn == "torch_crossentropy",
                "{}: {} = '{}' is not known (expected fused_crossentropy or torch_crossentropy; anvil's own fused "
                "cross-entropy computes either)", m.source("loss_fn"), m.full("loss_fn"), loss_fn);

    bool learned_pos_emb = true;
    const bool learned_given = m.has("learned_pos_emb");
    m.get("learned_pos_emb", learned_pos_emb);
    bool alibi = false, rope = false;
    {
      MapReader a = m.sub("attn_config");
      read_attn_config(a, c, alibi, rope);
      a.finish();
    }
    ANVIL_CHECK(!(alibi && rope), "{}: {} and {} cannot both be true", m.source("attn_config"),
                m.full("attn_config.alibi"), m.full("attn_config.rope"));
    ANVIL_CHECK(!((alibi || rope) && learned_given && learned_pos_emb),
                "{}: {} = true with {} is not supported: anvil adds positions one way (leave learned_pos_emb unset "
                "or false)", m.source("learned_pos_emb"), m.full("learned_pos_emb"), alibi ? "ALiBi" : "RoPE");
    c.positions = alibi                ? PositionKind::kAlibi
                  : rope               ? PositionKind::kRope
                  : learned_pos_emb    ? PositionKind::kLearned
                                       : PositionKind::kNone;
    {
      MapReader f = m.sub("ffn_config");
      read_ffn_config(f, c, expansion_ratio, m);
      f.finish();
    }
    {
      MapReader i = m.sub("init_config");
      only(i, "name", std::string("kaiming_normal_"), kDefaultInitOnly);
      only(i, "fan_mode", std::string("fan_in"), kDefaultInitOnly);
      only(i, "init_nonlinearity", std::string("relu"), kDefaultInitOnly);
      only(i, "init_div_is_residual", true, kDefaultInitOnly);
      only(i, "init_gain", 0.0, kDefaultInitOnly);
      for (const char* key : {"emb_init_std", "emb_init_uniform_lim", "init_std"}) unset(i, key, kDefaultInitOnly);
      i.finish();
    }
  }

  void write_keys(YAML::Emitter& e, const ModelConfig& c) const override {
    auto key = [&](const char* k, const auto& v) { e << YAML::Key << k << YAML::Value << yaml_value(v); };
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
    key("rope_theta", c.rope.theta);
    key("qk_ln", c.qk_norm == QkNorm::kWhole);
    e << YAML::EndMap;
    e << YAML::Key << "ffn_config" << YAML::Value << YAML::BeginMap;
    if (c.has_moe()) {
      key("ffn_type", c.moe.capacity_factor > 0 ? "mb_moe" : "mb_dmoe");
      key("mlp_type", c.mlp == MlpKind::kSwiglu ? "glu" : "mlp");
      key("moe_num_experts", c.moe.experts);
      key("moe_top_k", c.moe.top_k);
      if (c.moe.capacity_factor > 0) key("moe_capacity_factor", c.moe.capacity_factor);
      if (c.moe.normalize_p > 0) key("moe_normalize_expert_weights", c.moe.normalize_p);
      key("moe_loss_weight", c.moe.loss_weight);
    } else {
      key("ffn_type", c.mlp == MlpKind::kSwiglu ? "mptglu" : "mptmlp");
    }
    e << YAML::Key << "ffn_act_fn" << YAML::Value << YAML::BeginMap;
    key("name", c.mlp == MlpKind::kSwiglu ? "silu" : "gelu");
    if (c.mlp != MlpKind::kSwiglu) key("approximate", c.mlp == MlpKind::kGeluTanh ? "tanh" : "none");
    e << YAML::EndMap;
    key("ffn_hidden_size", c.mlp_width());
    e << YAML::EndMap;
  }

  void keys_from_hf(HfFields& f) const override {
    for (const char* key : {"d_model", "n_heads", "n_layers", "expansion_ratio", "max_seq_len", "vocab_size"})
      f.copy(key, key);
    f.set("no_bias", true);  // transformers' MPT has no biases, whatever the field says
    f.only<bool>("no_bias", true, "transformers' MPT has no biases");
    f.only<double>("layer_norm_epsilon", 1e-5, "anvil's LayerNorm uses eps 1e-5");
    f.only<bool>("learned_pos_emb", false, "transformers' MPT uses ALiBi, not a position table");
    f.copy("resid_pdrop", "resid_pdrop");
    f.copy("emb_pdrop", "emb_pdrop");
    f.only<double>("embedding_fraction", 1.0, "the embeddings' gradient is never scaled down");
    f.absent("logit_scale", "the logits are never scaled");
    f.set("attn_config.alibi", true);
    HfFields a = f.sub("attn_config");
    a.copy("alibi_bias_max", "attn_config.alibi_bias_max");
    a.only<bool>("alibi", true, "transformers' MPT always uses ALiBi");
    a.only<bool>("qk_ln", false, "transformers' MPT has no QK LayerNorm");
    a.absent("clip_qkv", "q, k and v are never clipped");
    a.absent("softmax_scale", "scores are scaled by 1/sqrt(head size)");
    a.only<bool>("prefix_lm", false, "attention is causal");
    a.only<bool>("attn_uses_sequence_id", false, "attention is not cut at sequence ids");
    a.copy("attn_pdrop", "attn_config.attn_pdrop");
  }

  void check_hf(const ModelConfig& c) const override {
    require(c.positions == PositionKind::kAlibi, "positions other than ALiBi (attn_config.alibi: true)");
    require(c.norm == NormKind::kLayerNorm, "RMSNorm (transformers' MPT has LayerNorm)");
    require(!c.norm_bias && !c.linear_bias, "biases (transformers' MPT is no_bias: true)");
    require(!c.has_moe(), "mixture-of-experts MLPs (ffn_type mb_moe or mb_dmoe: transformers' MPT has none)");
    require(c.mlp == MlpKind::kGeluErf && c.mlp_width() == 4 * c.d_model,
            "an MLP other than exact GELU with expansion_ratio 4");
    require(c.kv_heads() == c.n_heads, "grouped-query attention (attn_config.kv_n_heads)");
    require(c.tied_embeddings, "its own LM head (tie_word_embeddings: false)");
    require(c.qk_norm == QkNorm::kNone, "QK LayerNorm (attn_config.qk_ln: transformers' MPT has none)");
    ANVIL_CHECK(c.alibi_bias_max == static_cast<float>(static_cast<int>(c.alibi_bias_max)),
                "transformers' MPT takes an integer attn_config.alibi_bias_max; the model has {}", c.alibi_bias_max);
  }

  nlohmann::ordered_json hf_config(const ModelConfig& c) const override {
    // MosaicML's published config.json files name LLM Foundry's class, which transformers maps
    // to its MptForCausalLM.
    return {{"architectures", {"MPTForCausalLM"}},
            {"model_type", hf_model_type},
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
  }

  void hf_tensors(const ModelConfig& c, HfTensorList& t) const override {
    const int64_t C = c.d_model, V = c.vocab_size, F = c.mlp_width();
    t.whole("transformer.wte.weight", "wte", {V, C});
    for (int l = 0; l < c.n_layers; l++) {
      const std::string h = fmt::format(fmt::runtime(hf_block_prefix), l), a = fmt::format("h.{}.", l);
      t.whole(h + "norm_1.weight", a + "ln1w", {C});
      t.whole(h + "attn.Wqkv.weight", a + "qkvw", {3 * C, C});
      t.whole(h + "attn.out_proj.weight", a + "attprojw", {C, C});
      t.whole(h + "norm_2.weight", a + "ln2w", {C});
      t.whole(h + "ffn.up_proj.weight", a + "fcw", {F, C});
      t.whole(h + "ffn.down_proj.weight", a + "fcprojw", {C, F});
    }
    t.whole("transformer.norm_f.weight", "lnfw", {C});
  }

  std::vector<LoraModule> lora_modules(const ModelConfig& c) const override {
    const int C = c.d_model, F = c.mlp_width();
    const bool glu = c.mlp == MlpKind::kSwiglu;
    using P = BlockProduct;
    std::vector<LoraModule> m = {{"attn.Wqkv", P::kQkv, 0, c.qkv_width(), C}, {"attn.out_proj", P::kAttnOut, 0, C, C}};
    // MegaBlocks' experts are weights, not linear layers; its router is one (PEFT's all-linear
    // adapts it).
    if (c.has_moe()) {
      m.push_back({"ffn.router.layer", P::kRouter, 0, c.moe.experts, C});
      return m;
    }
    // LLM Foundry's MPTGLU holds its gate beside up_proj.
    if (glu) m.push_back({"ffn.gate_proj", P::kFc, 0, F, C});
    m.push_back({"ffn.up_proj", P::kFc, glu ? F : 0, F, C});
    m.push_back({"ffn.down_proj", P::kFcProj, 0, C, F});
    return m;
  }

 private:
  static void read_attn_config(MapReader& a, ModelConfig& c, bool& alibi, bool& rope) {
    std::string impl = "flash";
    a.get("attn_impl", impl);
    // triton: the Triton flash attention of Foundry's older files.
    ANVIL_CHECK(impl == "flash" || impl == "torch" || impl == "triton", "{}: {} = '{}' is not known (expected flash, "
                "torch or triton; anvil runs its own attention whichever)", a.source("attn_impl"), a.full("attn_impl"),
                impl);
    std::string type = "multihead_attention";
    a.get("attn_type", type);
    int kv_n_heads = 1;
    a.get("kv_n_heads", kv_n_heads);
    if (type == "multihead_attention") {
      c.n_kv_heads = 0;
    } else if (type == "multiquery_attention") {
      c.n_kv_heads = 1;
    } else if (type == "grouped_query_attention") {
      c.n_kv_heads = kv_n_heads;  // checked with the other sizes (check_model_sizes)
    } else {
      ANVIL_FAIL("{}: {} = '{}' is not known (expected multihead_attention, multiquery_attention or "
                 "grouped_query_attention)", a.source("attn_type"), a.full("attn_type"), type);
    }
    a.get("alibi", alibi);
    read_positive(a, "alibi_bias_max", c.alibi_bias_max);
    a.get("rope", rope);
    read_positive(a, "rope_theta", c.rope.theta);
    // Both implementations rotate halves (flash-attn's rotary, non-interleaved, and Hugging Face's).
    std::string rope_impl = "dail";
    a.get("rope_impl", rope_impl);
    ANVIL_CHECK(rope_impl == "dail" || rope_impl == "hf", "{}: {} = '{}' is not known (expected dail or hf)",
                a.source("rope_impl"), a.full("rope_impl"), rope_impl);
    {
      MapReader d = a.sub("rope_dail_config");
      only(d, "type", std::string("original"), "RoPE without scaling only");
      only(d, "pos_idx_in_fp32", true, "positions are formed in fp32");
      ignored<int>(d, "xpos_scale_base");  // used only by the xpos type
      d.finish();
    }
    {
      MapReader h = a.sub("rope_hf_config");
      only(h, "type", std::string("no_scaling"), "RoPE without scaling only");
      ignored<double>(h, "factor");  // used only by the scaling types
      h.finish();
    }
    read_pdrop(a, "attn_pdrop", c.attn_pdrop);
    bool qk_ln = false;
    a.get("qk_ln", qk_ln);
    c.qk_norm = qk_ln ? QkNorm::kWhole : QkNorm::kNone;
    only(a, "qk_gn", false, "no group norm on queries and keys");
    only(a, "fused_qkv", true, "q, k and v are one fused product");
    only(a, "sliding_window_size", -1, "attention is causal over the whole sequence");
    only(a, "attn_uses_sequence_id", false, "sequences are not packed");
    unset(a, "clip_qkv", "q, k and v are not clipped");
    unset(a, "softmax_scale", "the scale is 1/sqrt(head size)");
  }

  // LLM Foundry's MegaBlocks keys (ffn_type mb_moe or mb_dmoe), with MegaBlocks' defaults.
  static void read_moe_keys(MapReader& f, ModelConfig& c, bool dropless) {
    MoeConfig& moe = c.moe;
    f.get("moe_num_experts", moe.experts);
    ANVIL_CHECK(moe.experts >= 1, "{}: {} = {} must be at least 1 (the experts of each block's MLP)",
                f.source("moe_num_experts"), f.full("moe_num_experts"), moe.experts);
    f.get("moe_top_k", moe.top_k);
    ANVIL_CHECK(moe.top_k >= 1 && moe.top_k <= moe.experts, "{}: {} = {} must be between 1 and moe_num_experts ({})",
                f.source("moe_top_k"), f.full("moe_top_k"), moe.top_k, moe.experts);
    if (dropless) {
      ignored<double>(f, "moe_capacity_factor");  // mb_dmoe never drops: MegaBlocks ignores it too
    } else {
      moe.capacity_factor = 1.0f;
      f.get("moe_capacity_factor", moe.capacity_factor);
      ANVIL_CHECK(moe.capacity_factor > 0, "{}: {} = {} must be positive", f.source("moe_capacity_factor"),
                  f.full("moe_capacity_factor"), moe.capacity_factor);
    }
    f.get("moe_normalize_expert_weights", moe.normalize_p);
    ANVIL_CHECK(moe.normalize_p >= 0, "{}: {} = {} must be a positive p (of the p-norm), or null",
                f.source("moe_normalize_expert_weights"), f.full("moe_normalize_expert_weights"), moe.normalize_p);
    f.get("moe_loss_weight", moe.loss_weight);
    ANVIL_CHECK(moe.loss_weight >= 0, "{}: {} = {} must not be negative", f.source("moe_loss_weight"),
                f.full("moe_loss_weight"), moe.loss_weight);
    unset(f, "moe_jitter_eps", "the router's input is never jittered");
    only(f, "uniform_expert_assignment", false, "the router chooses the experts");
    only(f, "moe_expert_model_parallelism", false, "anvil places the experts with distributed.expert_parallel");
    only(f, "moe_weight_parallelism", false, "every rank holds all the experts' weights");
    only(f, "moe_world_size", 1, "anvil places the experts with distributed.expert_parallel");
    only(f, "shared_expert", false, "there is no shared expert");
    // Foundry sets MegaBlocks' bias from no_bias, and never adds the router's z-loss.
    ignored<bool>(f, "bias");
    ignored<double>(f, "moe_zloss_weight");
    // The balancing loss is summed in double whatever this says; the MLP's implementation choices
    // change no value.
    ignored<bool>(f, "moe_lbl_in_fp32");
    ignored<bool>(f, "memory_optimized_mlp");
    ignored<std::string>(f, "mlp_impl");
  }

  static void read_ffn_config(MapReader& f, ModelConfig& c, double expansion_ratio, const MapReader& m) {
    std::string type = "mptmlp";
    f.get("ffn_type", type);
    ANVIL_CHECK(type == "mptmlp" || type == "mptglu" || type == "mb_moe" || type == "mb_dmoe",
                "{}: {} = '{}' is not supported (expected mptmlp, mptglu, mb_moe or mb_dmoe)", f.source("ffn_type"),
                f.full("ffn_type"), type);
    const bool moe = type == "mb_moe" || type == "mb_dmoe";
    // MegaBlocks' experts are MLPs (mlp_type mlp) or gated ones (glu, SwiGLU with silu).
    std::string mlp_type = "mlp";
    if (moe) {
      read_moe_keys(f, c, type == "mb_dmoe");
      ANVIL_CHECK(!c.linear_bias, "{}: {} with no_bias: false is not supported (MegaBlocks' experts would add an "
                  "output bias, which anvil's do not); set model.no_bias: true", f.source("ffn_type"),
                  f.full("ffn_type"));
      f.get("mlp_type", mlp_type);
      ANVIL_CHECK(mlp_type == "mlp" || mlp_type == "glu", "{}: {} = '{}' is not supported (expected mlp or glu)",
                  f.source("mlp_type"), f.full("mlp_type"), mlp_type);
      ANVIL_CHECK(mlp_type == "mlp" || type == "mb_dmoe", "{}: {} = glu needs ffn_type mb_dmoe (MegaBlocks' mb_moe "
                  "builds ungated experts whatever mlp_type says)", f.source("mlp_type"), f.full("mlp_type"));
    }
    const bool glu = type == "mptglu" || mlp_type == "glu";
    // MegaBlocks' experts default to GELU's tanh form; Foundry's dense MLP to the exact one.
    std::string act = "gelu", approximate = moe ? "tanh" : "none";
    {
      MapReader a = f.sub("ffn_act_fn");
      a.get("name", act);
      a.get("approximate", approximate);
      a.finish();
    }
    if (glu) {
      ANVIL_CHECK(act == "silu", "{}: {} = '{}' with a gated MLP is not supported: anvil's gated MLP is SwiGLU "
                  "(name: silu)", f.source("ffn_act_fn"), f.full("ffn_act_fn.name"), act);
      c.mlp = MlpKind::kSwiglu;
    } else {
      ANVIL_CHECK(act == "gelu" && (approximate == "none" || approximate == "tanh"),
                  "{}: {} = {} (approximate {}) is not supported with an ungated MLP: expected gelu, approximate none "
                  "or tanh",
                  f.source("ffn_act_fn"), f.full("ffn_act_fn"), act, approximate);
      c.mlp = approximate == "tanh" ? MlpKind::kGeluTanh : MlpKind::kGeluErf;
    }
    int hidden = 0;
    f.get("ffn_hidden_size", hidden);
    if (hidden > 0) {
      c.mlp_hidden = hidden;  // as in Foundry, it wins over expansion_ratio
    } else {
      const double h = expansion_ratio * c.d_model;
      ANVIL_CHECK(h >= 1 && h == std::floor(h), "{}: {} × d_model = {} is not a whole number of hidden units",
                  m.source("expansion_ratio"), m.full("expansion_ratio"), h);
      c.mlp_hidden = static_cast<int>(h);
    }
  }
};

}  // namespace

const Family& mpt_family() {
  static const Mpt f;
  return f;
}

}  // namespace anvil
