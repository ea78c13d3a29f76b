// LoRA's modules as PEFT names them in each family's transformers model, and the
// `model.peft_config` section that chooses them.
#pragma once
#include <string>
#include <vector>

#include "config/map_reader.h"
#include "config/model_config.h"

namespace YAML {
class Emitter;
}

namespace anvil {

// A block's four matrix products, as the decoder fuses them (model/decoder.h).
enum class BlockProduct { kQkv, kAttnOut, kFc, kFcProj };

// A module LoRA can adapt: one of transformers' linear layers of a block, which is all of a
// product or a block of its output rows (Llama's q_proj is the first rows of anvil's fused qkv).
struct LoraModule {
  std::string name;  // its path inside a block, as transformers names it: "attn.c_attn", "self_attn.q_proj"
  BlockProduct product;
  int row0 = 0, rows = 0;  // its outputs: rows [row0, row0 + rows) of the product's weight
  int in = 0;              // its inputs
};

// Every module of cfg's family a block has, in the order transformers lists them.
std::vector<LoraModule> lora_modules(const ModelConfig& cfg);
// The modules cfg.lora.target_modules names, in that order.
std::vector<LoraModule> lora_targets(const ModelConfig& cfg);
// PEFT's default target_modules for the family (its TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING).
std::vector<std::string> lora_default_targets(ModelFamily family);

// `peft_config` under m (PEFT's LoraConfig keys) into cfg.lora, for cfg's family: peft_type
// LORA, r > 0, lora_alpha, lora_dropout in [0, 1), target_modules (a list of names, each naming
// at least one module, or all-linear), use_rslora; bias, init_lora_weights, modules_to_save and
// the rest of PEFT's options only at the values anvil computes. Absent: no LoRA.
void read_peft_config(MapReader& m, ModelConfig& cfg, const std::string& file);
// cfg.lora as peft_config reads it back (nothing without LoRA).
void write_peft_config(YAML::Emitter& e, const ModelConfig& cfg);

}  // namespace anvil
