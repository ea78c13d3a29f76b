// What the families built as Llama is share (Llama, Mistral, Mixtral, Qwen2, Qwen3): RMSNorm, RoPE
// in the rotate-half order, SwiGLU (Mixtral's in experts), no biases (Qwen2's on q, k and v
// aside), grouped-query attention, their own LM head unless tied; keys under anvil's size names
// and transformers' LlamaConfig names for the rest; transformers' tensor names
// (model.layers.N.self_attn.q_proj, ...) and PEFT's modules. Each family adds its own keys and
// config.json fields through the hooks.
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
  std::string lora_unadaptable(const ModelConfig& c) const final;

 protected:
  // rope_scaling: transformers' config class of the family has rope_scaling (Llama's and Qwen2's do;
  // Mistral's does not, so anvil neither reads nor writes it there). sliding_window: the family's
  // attention takes Mistral's `sliding_window` (keys back from a query, null or 0: none).
  LlamaShaped(ModelFamily id, const char* title, const char* hf_model_type, const char* hf_architecture,
              bool rope_scaling, bool sliding_window)
      : Family(id, title, hf_model_type, hf_architecture, "model.layers.{}.", "", /*hf_conv1d=*/false, "n_kv_heads",
               "intermediate_size", {"q_proj", "v_proj"}),
        rope_scaling(rope_scaling),
        sliding_window(sliding_window) {}

  const bool rope_scaling, sliding_window;

  // The family's own defaults, set before any key is read.
  virtual void own_defaults(ModelConfig&) const {}
  // The family's own keys, read after the shared ones, and written back.
  virtual void read_own_keys(MapReader&, ModelConfig&) const {}
  virtual void write_own_keys(YAML::Emitter&, const ModelConfig&) const {}
  // Its own config.json fields, both ways.
  virtual void own_keys_from_hf(HfFields&) const {}
  virtual void own_hf_config(const ModelConfig&, nlohmann::ordered_json&) const {}
  // A mixture of experts' transformers names: the sparse block's (its router is `gate` in it), and
  // each expert's gate, up and down products. Mixtral's unless the family says otherwise.
  struct MoeNames {
    const char *block, *gate, *up, *down;
  };
  virtual MoeNames moe_names() const { return {"block_sparse_moe.", "w1", "w3", "w2"}; }
  // A sparse family's routing keys, read alike: the experts (under experts_key), each token's
  // num_experts_per_tok of them, and transformers' router loss (output_router_logits, refused;
  // router_aux_loss_coef, which weighs it, read without effect).
  void read_routing(MapReader& m, ModelConfig& c, const char* experts_key) const;
  // Whether the chosen experts' weights may be left as their probabilities (Qwen3-MoE's
  // norm_topk_prob: false) besides renormalised to sum to 1.
  virtual bool optional_renormalization() const { return false; }
};

}  // namespace anvil
