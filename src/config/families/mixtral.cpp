// Mixtral (transformers' MixtralForCausalLM): Mistral's shape (llama_shaped.h, with its sliding
// window option) whose MLPs are sparse mixtures of SwiGLU experts. A bias-free router (`gate`)
// scores num_local_experts experts; each token takes its num_experts_per_tok most probable
// (softmax) experts, their weights renormalised to sum to 1 (the 1-norm), and every choice is kept
// (no capacity). transformers adds its router loss only with output_router_logits, which fine-tuning
// leaves off; anvil trains without it.
#include <yaml-cpp/yaml.h>

#include "config/families/hf_fields.h"
#include "config/families/keys.h"
#include "config/families/llama_shaped.h"
#include "config/map_reader.h"

namespace anvil {
namespace {

class Mixtral final : public LlamaShaped {
 public:
  Mixtral()
      : LlamaShaped(ModelFamily::kMixtral, "Mixtral", "mixtral", "MixtralForCausalLM", /*rope_scaling=*/false,
                    /*sliding_window=*/true) {}

 protected:
  // MixtralConfig's defaults.
  void own_defaults(ModelConfig& c) const override {
    c.rope.theta = 1e6f;
    c.moe.experts = 8;
    c.moe.top_k = 2;
    c.moe.capacity_factor = 0.0f;
    c.moe.normalize_p = 1.0f;
    c.moe.loss_weight = 0.0f;
  }
  void read_own_keys(MapReader& m, ModelConfig& c) const override {
    read_routing(m, c, "num_local_experts");
    only(m, "router_jitter_noise", 0.0, "the router's input is never jittered");
  }
  void write_own_keys(YAML::Emitter& e, const ModelConfig& c) const override {
    e << YAML::Key << "num_local_experts" << YAML::Value << c.moe.experts;
    e << YAML::Key << "num_experts_per_tok" << YAML::Value << c.moe.top_k;
  }
  void own_keys_from_hf(HfFields& f) const override {
    f.copy("num_local_experts", "num_local_experts");
    f.copy("num_experts_per_tok", "num_experts_per_tok");
    f.copy("output_router_logits", "output_router_logits");
    f.copy("router_jitter_noise", "router_jitter_noise");
    f.copy("router_aux_loss_coef", "router_aux_loss_coef");
  }
  void own_hf_config(const ModelConfig& c, nlohmann::ordered_json& j) const override {
    j["num_local_experts"] = c.moe.experts;
    j["num_experts_per_tok"] = c.moe.top_k;
    j["output_router_logits"] = false;
    j["router_jitter_noise"] = 0.0;
  }
};

}  // namespace

const Family& mixtral_family() {
  static const Mixtral f;
  return f;
}

}  // namespace anvil
