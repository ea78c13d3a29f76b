// Reading and writing the `model:` section of a config: model.name chooses the family, and the
// family's keys, under the family's own names, set the architecture options of ModelConfig.
#pragma once
#include <string>

#include "config/map_reader.h"
#include "config/model_config.h"

namespace YAML {
class Emitter;
}

namespace anvil {

// model.name, then that family's keys (config/families/<family>.cpp), the sizes checked against
// each other (check_model_sizes), then peft_config. A key of another family is an unknown key, and
// a value anvil cannot honour an error naming it. A max_seq_len left 0 is the top-level one,
// which the config reader fills in.
void read_model_section(MapReader& m, ModelConfig& out);
// The section under the family's names, so that reading it back gives the same ModelConfig.
void write_model_section(YAML::Emitter& e, const ModelConfig& c);

}  // namespace anvil
