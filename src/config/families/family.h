// A model family: everything anvil knows of one architecture, in one file per family
// (config/families/<family>.cpp) and one registry (family.cpp). The config reader, Hugging Face
// import and export, LoRA and the model's display all ask the family, so that no other code
// switches on ModelFamily.
//
// A family is a choice of ModelConfig's architecture options (model_config.h), which the one
// decoder builds; the family's file says how its keys spell those options in each dialect it is
// written in (anvil's and LLM Foundry's YAML, transformers' config.json), what its transformers
// state dict names and how each tensor is oriented, which modules PEFT adapts, and what of a
// ModelConfig transformers' class for it cannot hold.
//
// The registry sits in the config floor because the config reader is its lowest user; the model
// and interop, above it, read it too.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/model_config.h"

namespace YAML {
class Emitter;
}

namespace anvil {

class MapReader;
class HfFields;

// A block's four matrix products, as the decoder fuses them (model/decoder.h).
enum class BlockProduct { kQkv, kAttnOut, kFc, kFcProj, kRouter };

// A module LoRA can adapt: one of transformers' linear layers of a block, which is all of a
// product or a block of its output rows (Llama's q_proj is the first rows of anvil's fused qkv).
struct LoraModule {
  std::string name;  // its path inside a block, as transformers names it: "attn.c_attn", "self_attn.q_proj"
  BlockProduct product;
  int row0 = 0, rows = 0;  // its outputs: rows [row0, row0 + rows) of the product's weight
  int in = 0;              // its inputs
};

// One transformers tensor: rows [row0, row0 + rows) of anvil's tensor `source` (all of its rows
// when rows is 0), stored as it is or transposed (GPT-2's Conv1D weights are input × output).
struct HfTensor {
  std::string name;            // transformers' key, e.g. "model.layers.3.self_attn.k_proj.weight"
  std::string source;          // anvil's tensor, e.g. "h.3.qkvw"
  std::vector<int64_t> shape;  // transformers' shape
  int64_t row0 = 0, rows = 0;
  bool transposed = false;
};

// The rows of a family's tensor map, written as the family's file lists them.
struct HfTensorList {
  std::vector<HfTensor> tensors;
  // A whole anvil tensor as it is.
  void whole(std::string name, std::string source, std::vector<int64_t> shape);
  // A whole anvil (out, in) weight stored transposed, as Conv1D's (in, out).
  void conv1d(std::string name, std::string source, int64_t in, int64_t out);
  // Rows [row0, row0 + n) of an anvil weight, stored as they are.
  void rows(std::string name, std::string source, int64_t row0, int64_t n, std::vector<int64_t> shape);
};

class Family {
 public:
  virtual ~Family() = default;

  ModelFamily id;
  const char* title;            // for people: "GPT-2"
  const char* hf_model_type;    // config.json's model_type: "gpt2"
  const char* hf_architecture;  // transformers' class that holds it: "GPT2LMHeadModel"
  // Where block l's modules are in transformers' model, as a format of l: "transformer.h.{}.".
  const char* hf_block_prefix;
  // A prefix of transformers' keys that the family's original files leave out ("transformer."
  // for OpenAI's GPT-2 files), or "".
  const char* hf_optional_prefix;
  // Its products are transformers' Conv1D, weights stored (input, output): PEFT's fan_in_fan_out.
  bool hf_conv1d;
  // The keys of the model section that set the key/value heads and the MLP's width, for errors
  // ("" where the family has no such key).
  const char* kv_heads_key;
  const char* mlp_width_key;
  // PEFT's default target_modules (its TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING).
  std::vector<std::string> lora_default_targets;

  // The family's keys of the model section (model.name already read): their defaults, values
  // and the errors for what anvil cannot honour, each naming the key.
  virtual void read_keys(MapReader& m, ModelConfig& c) const = 0;
  // The same keys for c, so that read_keys gives c back.
  virtual void write_keys(YAML::Emitter& e, const ModelConfig& c) const = 0;

  // config.json's fields as the family's keys of a model section (which read_keys then reads):
  // each field copied, or checked where anvil honours one value.
  virtual void keys_from_hf(HfFields& f) const = 0;
  // What of c transformers' class cannot hold, as an error naming the option.
  virtual void check_hf(const ModelConfig& c) const = 0;
  // config.json's fields for c (the caller adds the tokenizer's ids, dtype and use_cache).
  virtual nlohmann::ordered_json hf_config(const ModelConfig& c) const = 0;
  // transformers' tensors of c but the untied LM head, in the order transformers lists them.
  virtual void hf_tensors(const ModelConfig& c, HfTensorList& out) const = 0;

  // Every module of a block that LoRA can adapt, in the order transformers lists them.
  virtual std::vector<LoraModule> lora_modules(const ModelConfig& c) const = 0;
  // The linear layers PEFT's all-linear would adapt beyond lora_modules (empty: none), which make
  // all-linear an error rather than a smaller set of adapters.
  virtual std::string lora_unadaptable(const ModelConfig&) const { return ""; }

 protected:
  // An error unless ok: "a GPT-2 model cannot be written as transformers' GPT2LMHeadModel: it has <what>".
  void require(bool ok, const std::string& what) const;

  Family(ModelFamily id, const char* title, const char* hf_model_type, const char* hf_architecture,
         const char* hf_block_prefix, const char* hf_optional_prefix, bool hf_conv1d, const char* kv_heads_key,
         const char* mlp_width_key, std::vector<std::string> lora_default_targets)
      : id(id), title(title), hf_model_type(hf_model_type), hf_architecture(hf_architecture),
        hf_block_prefix(hf_block_prefix), hf_optional_prefix(hf_optional_prefix), hf_conv1d(hf_conv1d),
        kv_heads_key(kv_heads_key), mlp_width_key(mlp_width_key), lora_default_targets(std::move(lora_default_targets)) {}
};

// The family of a model.
const Family& family(ModelFamily id);
// The family whose config.json model_type is `model_type`; null when anvil has none.
const Family* family_for_hf_model_type(const std::string& model_type);
// Every family's config.json model_type, for errors: "gpt2, mpt, llama or mistral".
std::string hf_model_types();

// The sizes of c checked against each other: positive, heads dividing the width, key/value heads
// dividing the heads, an even head size under RoPE. With the model section's reader m, each error
// names the key as the family spells it and where its value came from; without, the key under
// anvil's names. A max_seq_len of 0 (not yet resolved from the top-level one) is not checked.
void check_model_sizes(const ModelConfig& c, const MapReader* m);

}  // namespace anvil
