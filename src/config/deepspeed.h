// DeepSpeed's ds_config.json, given as `deepspeed_config:` (a mapping, or the path of a JSON file,
// as Composer's Trainer takes it), is a layer of the configuration: its keys are translated into
// anvil's and win over the YAML's, and the command line's overrides win over both. It is applied
// before the config is read, so that the result is validated and written to the resolved
// config.yaml like any other key.
#pragma once
#include <yaml-cpp/yaml.h>

#include <map>
#include <string>
#include <vector>

#include "config/map_reader.h"

namespace anvil {

// Replaces root["deepspeed_config"] by the anvil keys it means. root holds the YAML with the
// overrides applied and interpolated; `origins` holds the dotted keys the command line set, which
// the ds_config leaves alone, and gets the keys the ds_config sets (blamed on its file). A key the ds_config leaves out takes DeepSpeed's default
// where anvil's differs (no scheduler: a constant rate; Adam's betas (0.9, 0.999); fp16's
// loss_scale_window 1000), and Hugging Face's "auto" values take the rest of the configuration's.
// A DeepSpeed key anvil cannot honour is an error naming it and what to write instead; unknown
// keys go to `unknown`. Returns one line per anvil key it set or removed, for the run log.
std::vector<std::string> apply_deepspeed_config(YAML::Node root, const std::string& file,
                                                std::map<std::string, std::string>& origins, UnknownKeys* unknown);

}  // namespace anvil
