// The config file as one YAML document, before any key is read: YAML's merge keys (`<<`)
// resolved, the command line's key=value overrides set, and OmegaConf's ${...} interpolation
// applied, as LLM Foundry's files are written. The config readers then see one tree, so a key
// set on the command line is checked exactly like the same key written in the file.
#pragma once
#include <map>
#include <set>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

namespace anvil {

// path's document with overrides ("optimizer.lr=3e-4") applied, each recorded in origins (dotted
// key -> "the command line"), and interpolated; variables: the top-level keys interpolation read
// (they configure nothing themselves and are no unknown keys).
// Sets the value at a dotted key ("optimizer.lr") below node, making the mappings on the way (a
// value that is not a mapping is replaced by one).
void set_dotted(YAML::Node node, const std::string& key, const YAML::Node& value);

YAML::Node load_config_yaml(const std::string& path, const std::vector<std::string>& overrides,
                            std::map<std::string, std::string>& origins, std::set<std::string>& variables);

}  // namespace anvil
