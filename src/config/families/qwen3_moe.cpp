// Qwen3-MoE (transformers' Qwen3MoeForCausalLM; Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention
// (qwen3.cpp: per-head q/k norms, head_dim) with every MLP a sparse mixture of SwiGLU experts of
// moe_intermediate_size. A bias-free router (`mlp.gate`) scores num_experts experts; each token
// takes its num_experts_per_tok most probable (softmax) experts, their probabilities as weights,
// renormalised to sum to 1 under norm_topk_prob; every choice is kept (no capacity).
// intermediate_size is the width of the dense MLPs of mlp_only_layers and of the layers
// decoder_sparse_step skips, which anvil's blocks (every one sparse) do not have: read, unused.
// As Mixtral's, the router loss applies only under output_router_logits, which anvil refuses.
#include <yaml-cpp/yaml.h>

#include "config/families/hf_fields.h"
#include "config/families/keys.h"
#include "config/families/llama_shaped.h"
#include "config/map_reader.h"

namespace anvil {
namespace {

constexpr int kExpertWidth = 768;  // Qwen3MoeConfig's moe_intermediate_size

class Qwen3Moe final : public LlamaShaped {
 public:
  Qwen3Moe()
      : LlamaShaped(ModelFamily::kQwen3Moe, "Qwen3-MoE", "qwen3_moe", "Qwen3MoeForCausalLM", /*rope_scaling=*/true,
                    /*sliding_window=*/false) {}

 protected:
  // Qwen3MoeConfig's defaults.
  void own_defaults(ModelConfig& c) const override {
    c.qk_norm = QkNorm::kPerHead;
    c.head_dim = 128;
    c.vocab_size = 151936;
    c.norm_eps = 1e-6f;
    c.mlp_hidden = kExpertWidth;
    c.moe.experts = 128;
    c.moe.top_k = 8;
    c.moe.capacity_factor = 0.0f;
    c.moe.normalize_p = 0.0f;  // norm_topk_prob: false
    c.moe.loss_weight = 0.0f;
  }
  MoeNames moe_names() const override { return {"mlp.", "gate_proj", "up_proj", "down_proj"}; }
  bool optional_renormalization() const override { return true; }
  void read_own_keys(MapReader& m, ModelConfig& c) const override {
    int width = kExpertWidth;
    m.get("moe_intermediate_size", width);
    ANVIL_CHECK(width >= 1, "{}: {} = {} must be a positive number of units", m.source("moe_intermediate_size"),
                m.full("moe_intermediate_size"), width);
    c.mlp_hidden = width;
    read_routing(m, c, "num_experts");
    bool renormalize = false;
    m.get("norm_topk_prob", renormalize);
    c.moe.normalize_p = renormalize ? 1.0f : 0.0f;
    only(m, "decoder_sparse_step", 1, "every block's MLP is a mixture of experts");
    const YAML::Node dense = m.raw("mlp_only_layers");
    ANVIL_CHECK(!dense || dense.IsNull() || (dense.IsSequence() && dense.size() == 0), "{}: {} is not supported (every "
                "block's MLP is a mixture of experts); expected [] or none", m.source("mlp_only_layers"),
                m.full("mlp_only_layers"));
  }
  void write_own_keys(YAML::Emitter& e, const ModelConfig& c) const override {
    e << YAML::Key << "moe_intermediate_size" << YAML::Value << c.mlp_width();
    e << YAML::Key << "num_experts" << YAML::Value << c.moe.experts;
    e << YAML::Key << "num_experts_per_tok" << YAML::Value << c.moe.top_k;
    e << YAML::Key << "norm_topk_prob" << YAML::Value << (c.moe.normalize_p == 1.0f);
  }
  void own_keys_from_hf(HfFields& f) const override {
    f.only<bool>("attention_bias", false, "anvil's Qwen3-MoE has no biases");
    f.only<bool>("use_sliding_window", false, "attention covers the whole causal context");
    f.copy("moe_intermediate_size", "moe_intermediate_size");
    f.copy("num_experts", "num_experts");
    f.copy("num_local_experts", "num_experts");  // transformers 5's attribute name for it
    f.copy("num_experts_per_tok", "num_experts_per_tok");
    f.copy("norm_topk_prob", "norm_topk_prob");
    f.copy("decoder_sparse_step", "decoder_sparse_step");
    f.copy("mlp_only_layers", "mlp_only_layers");
    f.copy("output_router_logits", "output_router_logits");
    f.copy("router_aux_loss_coef", "router_aux_loss_coef");
  }
  void own_hf_config(const ModelConfig& c, nlohmann::ordered_json& j) const override {
    j["moe_intermediate_size"] = c.mlp_width();
    j["num_experts"] = c.moe.experts;
    j["num_experts_per_tok"] = c.moe.top_k;
    j["norm_topk_prob"] = c.moe.normalize_p == 1.0f;
    j["decoder_sparse_step"] = 1;
    j["mlp_only_layers"] = nlohmann::ordered_json::array();
    j["output_router_logits"] = false;
    j["attention_bias"] = false;
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.n_layers;
  }
};

}  // namespace

const Family& qwen3_moe_family() {
  static const Qwen3Moe f;
  return f;
}

}  // namespace anvil
