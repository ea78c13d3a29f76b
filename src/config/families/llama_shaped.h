// What the families built as Llama is share (Llama, Mistral): RMSNorm, RoPE in the rotate-half
// order, SwiGLU, no biases, grouped-query attention, their own LM head unless tied; keys under
// anvil's size names and transformers' LlamaConfig names for the rest; transformers' tensor
// names (model.layers.N.self_attn.q_proj, ...) and PEFT's modules. Each family adds its own keys
// and config.json fields through the hooks.
#pragma once
#include <string>
#include <vector>

#include "config/families/family.h"

namespace anvil {

class LlamaShaped : public Family {
 public:
  void read_keys(MapReader& m, ModelConfig& c) const final;
  void write_keys(YAML::Emitter& e, const ModelConfig& c) const final;
  void keys_from_hf(HfFields& f) const final;
  void check_hf(const ModelConfig& c) const final;
  nlohmann::ordered_json hf_config(const ModelConfig& c) const final;
  void hf_tensors(const ModelConfig& c, HfTensorList& out) const final;
  std::vector<LoraModule> lora_modules(const ModelConfig& c) const final;

 protected:
  LlamaShaped(ModelFamily id, const char* title, const char* hf_model_type, const char* hf_architecture)
      : Family(id, title, hf_model_type, hf_architecture, "model.layers.{}.", "", /*hf_conv1d=*/false, "n_kv_heads",
               "intermediate_size", {"q_proj", "v_proj"}) {}

  // The family's own keys, read after the shared ones, and written back.
  virtual void read_own_keys(MapReader& m, ModelConfig& c) const = 0;
  virtual void write_own_keys(YAML::Emitter& e, const ModelConfig& c) const = 0;
  // Its own config.json fields, both ways.
  virtual void own_keys_from_hf(HfFields& f) const = 0;
  virtual void own_hf_config(const ModelConfig& c, nlohmann::ordered_json& j) const = 0;
};

}  // namespace anvil
