// The `model.peft_config` section: which of a family's LoRA modules (config/families/family.h)
// are adapted, and how.
#pragma once
#include <string>
#include <vector>

#include "config/families/family.h"
#include "config/model_config.h"

namespace YAML {
class Emitter;
}

namespace anvil {

class MapReader;

// Every module of cfg's family a block has, in the order transformers lists them
// (Family::lora_modules).
std::vector<LoraModule> lora_modules(const ModelConfig& cfg);
// The modules cfg.lora.target_modules names, in that order.
std::vector<LoraModule> lora_targets(const ModelConfig& cfg);

// `peft_config` under m (PEFT's LoraConfig keys) into cfg.lora, for cfg's family: peft_type
// LORA, r > 0, lora_alpha, lora_dropout in [0, 1), target_modules (a list of names, each naming
// at least one module, or all-linear), use_rslora; bias, init_lora_weights, modules_to_save and
// the rest of PEFT's options only at the values anvil computes. Absent: no LoRA.
void read_peft_config(MapReader& m, ModelConfig& cfg);
// cfg.lora as peft_config reads it back (nothing without LoRA).
void write_peft_config(YAML::Emitter& e, const ModelConfig& cfg);

}  // namespace anvil
