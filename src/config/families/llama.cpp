// Llama (transformers' LlamaForCausalLM), on the shared Llama shape (llama_shaped.h): its
// config.json has the bias and tensor-parallel switches, which anvil honours at their defaults,
// and no sliding window.
#include <yaml-cpp/yaml.h>

#include "config/families/hf_fields.h"
#include "config/families/llama_shaped.h"

namespace anvil {
namespace {

class Llama final : public LlamaShaped {
 public:
  Llama()
      : LlamaShaped(ModelFamily::kLlama, "Llama", "llama", "LlamaForCausalLM", /*rope_scaling=*/true,
                    /*sliding_window=*/false) {}

 protected:
  void read_own_keys(MapReader&, ModelConfig&) const override {}
  void write_own_keys(YAML::Emitter&, const ModelConfig&) const override {}
  void own_keys_from_hf(HfFields& f) const override {
    f.absent("sliding_window", "attention covers the whole causal context");
    f.only<bool>("attention_bias", false, "anvil's Llama has no biases");
    f.only<bool>("mlp_bias", false, "anvil's Llama has no biases");
    f.only<int>("pretraining_tp", 1, "tensor-parallel slicing of the products");
  }
  void own_hf_config(const ModelConfig&, nlohmann::ordered_json& j) const override {
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  }
};

}  // namespace

const Family& llama_family() {
  static const Llama f;
  return f;
}

}  // namespace anvil
