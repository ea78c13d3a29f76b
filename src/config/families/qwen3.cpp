// Qwen3 (transformers' Qwen3ForCausalLM): Llama's shape (llama_shaped.h) with an RMSNorm over each
// head's queries and keys (q_norm and k_norm: one weight of head_dim, shared by the heads, applied
// before RoPE) and a head size of its own (head_dim, 128 by default, not hidden_size /
// num_attention_heads: Qwen3-0.6B's queries are 2048 wide over a hidden size of 1024). No biases.
// As Qwen2's, its config.json's sliding window applies only under use_sliding_window, which anvil
// refuses.
#include <yaml-cpp/yaml.h>

#include "config/families/hf_fields.h"
#include "config/families/llama_shaped.h"

namespace anvil {
namespace {

class Qwen3 final : public LlamaShaped {
 public:
  Qwen3()
      : LlamaShaped(ModelFamily::kQwen3, "Qwen3", "qwen3", "Qwen3ForCausalLM", /*rope_scaling=*/true,
                    /*sliding_window=*/false) {}

 protected:
  void own_defaults(ModelConfig& c) const override {  // Qwen3Config's
    c.qk_norm = QkNorm::kPerHead;
    c.head_dim = 128;
    c.vocab_size = 151936;
    c.norm_eps = 1e-6f;
  }
  void read_own_keys(MapReader&, ModelConfig&) const override {}
  void write_own_keys(YAML::Emitter&, const ModelConfig&) const override {}
  void own_keys_from_hf(HfFields& f) const override {
    f.only<bool>("attention_bias", false, "anvil's Qwen3 has no biases");
    f.only<bool>("use_sliding_window", false, "attention covers the whole causal context");
  }
  void own_hf_config(const ModelConfig& c, nlohmann::ordered_json& j) const override {
    j["attention_bias"] = false;
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.n_layers;
  }
};

}  // namespace

const Family& qwen3_family() {
  static const Qwen3 f;
  return f;
}

}  // namespace anvil
