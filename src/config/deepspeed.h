// DeepSpeed's ds_config.json, given as `deepspeed_config:` (a mapping, or the path of a JSON file,
// as Composer's Trainer takes it), is translated into anvil's own keys before the config is
// read, so that it is validated and written to the resolved config.yaml like any other key.
#pragma once
#include <yaml-cpp/yaml.h>

#include <string>

#include "config/map_reader.h"

namespace anvil {

// Replaces root["deepspeed_config"] by the anvil keys it means. A DeepSpeed key that anvil
// cannot honour is an error naming it and what to write instead; a DeepSpeed value that
// contradicts an anvil key given in the file or an override is an error naming both. Unknown
// DeepSpeed keys go to `unknown`.
void apply_deepspeed_config(YAML::Node root, const std::string& file, UnknownKeys* unknown);

}  // namespace anvil
