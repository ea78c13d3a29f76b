// The model section: model.name chooses the family (config/families/), whose file reads the rest.
#include "config/model_section.h"

#include <yaml-cpp/yaml.h>

#include "config/families/family.h"
#include "config/lora_config.h"
#include "config/yaml_number.h"

namespace anvil {

void read_model_section(MapReader& m, ModelConfig& c) {
  m.get("name", c.name);
  family(c.name).read_keys(m, c);
  check_model_sizes(c, &m);
  read_peft_config(m, c);
  m.finish();
}

void write_model_section(YAML::Emitter& e, const ModelConfig& c) {
  auto key = [&](const char* k, const auto& v) { e << YAML::Key << k << YAML::Value << yaml_value(v); };
  e << YAML::BeginMap;
  key("name", choice_name(c.name));
  key("n_layers", c.n_layers);
  key("n_heads", c.n_heads);
  key("d_model", c.d_model);
  key("vocab_size", c.vocab_size);
  key("max_seq_len", c.max_seq_len);
  family(c.name).write_keys(e, c);
  write_peft_config(e, c);
  e << YAML::EndMap;
}

}  // namespace anvil
