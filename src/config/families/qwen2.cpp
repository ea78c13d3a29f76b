// Qwen2 and Qwen2.5 (transformers' Qwen2ForCausalLM): Llama's shape (llama_shaped.h) with biases on
// the query, key and value products (never on the output or the MLP's). Its config.json carries
// a sliding window that transformers applies only under use_sliding_window, which no published
// Qwen2 sets: anvil honours use_sliding_window false and refuses true.
#include <yaml-cpp/yaml.h>

#include "config/families/hf_fields.h"
#include "config/families/llama_shaped.h"

namespace anvil {
namespace {

class Qwen2 final : public LlamaShaped {
 public:
  Qwen2()
      : LlamaShaped(ModelFamily::kQwen2, "Qwen2", "qwen2", "Qwen2ForCausalLM", /*rope_scaling=*/true,
                    /*sliding_window=*/false) {}

 protected:
  void own_defaults(ModelConfig& c) const override {
    c.qkv_bias = true;
    c.vocab_size = 151936;  // Qwen2Config's
  }
  void read_own_keys(MapReader&, ModelConfig&) const override {}
  void write_own_keys(YAML::Emitter&, const ModelConfig&) const override {}
  void own_keys_from_hf(HfFields& f) const override {
    f.only<bool>("use_sliding_window", false, "attention covers the whole causal context");
  }
  void own_hf_config(const ModelConfig& c, nlohmann::ordered_json& j) const override {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.n_layers;
  }
};

}  // namespace

const Family& qwen2_family() {
  static const Qwen2 f;
  return f;
}

}  // namespace anvil
