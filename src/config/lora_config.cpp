// PEFT's LoraConfig keys, and the modules they choose among a family's (config/families/).
#include "config/lora_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>

#include "config/families/family.h"
#include "config/map_reader.h"
#include "config/yaml_number.h"
#include "core/error.h"

namespace anvil {
namespace {

// Whether PEFT's target name matches the module: its whole path, or the path's last components.
bool names_module(const std::string& target, const std::string& module) {
  if (module == target) return true;
  return module.size() > target.size() && module.ends_with(target) &&
         module[module.size() - target.size() - 1] == '.';
}

constexpr const char* kAllLinear = "all-linear";

}  // namespace

std::vector<LoraModule> lora_modules(const ModelConfig& cfg) { return family(cfg.name).lora_modules(cfg); }

std::vector<LoraModule> lora_targets(const ModelConfig& cfg) {
  std::vector<LoraModule> chosen;
  const std::vector<std::string>& targets = cfg.lora.target_modules;
  const bool all = targets.size() == 1 && targets[0] == kAllLinear;
  for (const LoraModule& m : lora_modules(cfg))
    if (all || std::any_of(targets.begin(), targets.end(), [&](const std::string& t) { return names_module(t, m.name); }))
      chosen.push_back(m);
  return chosen;
}

void read_peft_config(MapReader& model, ModelConfig& cfg) {
  if (!model.has("peft_config")) return;
  MapReader m = model.sub("peft_config");
  std::string peft_type = "LORA", task_type = "CAUSAL_LM";
  m.get("peft_type", peft_type);
  ANVIL_CHECK(peft_type == "LORA", "{}: {} = '{}' is not supported; anvil fine-tunes with LORA", m.source("peft_type"),
              m.full("peft_type"), peft_type);
  m.get("task_type", task_type);
  ANVIL_CHECK(task_type == "CAUSAL_LM", "{}: {} = '{}' is not supported; anvil's models are CAUSAL_LM", m.source("task_type"),
              m.full("task_type"), task_type);
  LoraConfig& l = cfg.lora;
  l = {};
  l.r = 8;  // PEFT's defaults
  m.get("r", l.r);
  ANVIL_CHECK(l.r > 0, "{}: {} = {} must be a positive rank", m.source("r"), m.full("r"), l.r);
  double alpha = l.alpha, dropout = l.dropout;
  m.get("lora_alpha", alpha);
  ANVIL_CHECK(alpha > 0, "{}: {} = {} must be positive", m.source("lora_alpha"), m.full("lora_alpha"), alpha);
  m.get("lora_dropout", dropout);
  ANVIL_CHECK(dropout >= 0 && dropout < 1, "{}: {} = {} must be in [0, 1)", m.source("lora_dropout"), m.full("lora_dropout"), dropout);
  l.alpha = static_cast<float>(alpha);
  l.dropout = static_cast<float>(dropout);
  m.get("use_rslora", l.rslora);

  const std::vector<LoraModule> modules = lora_modules(cfg);
  std::vector<std::string> names;
  for (const LoraModule& x : modules) names.push_back(x.name);
  if (m.has("target_modules")) {
    const YAML::Node t = m.raw("target_modules");
    if (t.IsScalar()) {
      // A string is a regular expression in PEFT; its one special value is all-linear.
      ANVIL_CHECK(t.Scalar() == kAllLinear, "{}: {} = '{}': give a list of module names (or all-linear); a "
                  "regular expression is not supported. {}'s modules: {}", m.source("target_modules"), m.full("target_modules"), t.Scalar(),
                  family(cfg.name).title, fmt::join(names, ", "));
      const std::string beyond = family(cfg.name).lora_unadaptable(cfg);
      ANVIL_CHECK(beyond.empty(), "{}: {} = all-linear would adapt {} too, which anvil does not adapt yet: list the "
                  "modules to adapt ({})", m.source("target_modules"), m.full("target_modules"), beyond,
                  fmt::join(names, ", "));
      l.target_modules = {kAllLinear};
    } else {
      ANVIL_CHECK(t.IsSequence() && t.size() > 0, "{}: {} must be a list of module names (or all-linear)", m.source("target_modules"),
                  m.full("target_modules"));
      for (const YAML::Node& n : t) {
        ANVIL_CHECK(n.IsScalar(), "{}: {} must be a list of module names", m.source("target_modules"), m.full("target_modules"));
        const std::string name = n.Scalar();
        ANVIL_CHECK(std::any_of(names.begin(), names.end(), [&](const std::string& x) { return names_module(name, x); }),
                    "{}: {}: '{}' names no module of a {} block; its modules are {}", m.source("target_modules"), m.full("target_modules"),
                    name, family(cfg.name).title, fmt::join(names, ", "));
        l.target_modules.push_back(name);
      }
    }
  } else {
    l.target_modules = family(cfg.name).lora_default_targets;
  }

  // PEFT's options whose values anvil computes, and the rest at the one value it honours.
  bool flag = false;
  for (const char* key : {"inference_mode", "fan_in_fan_out"}) m.get(key, flag);  // PEFT sets fan_in_fan_out itself
  for (const char* key : {"base_model_name_or_path", "revision"}) {
    std::string ignored;
    m.get(key, ignored);
  }
  std::string bias = "none";
  m.get("bias", bias);
  ANVIL_CHECK(bias == "none", "{}: {} = '{}' is not supported (the base's biases stay frozen); expected none", m.source("bias"),
              m.full("bias"), bias);
  bool init = true;
  m.get("init_lora_weights", init);
  ANVIL_CHECK(init, "{}: {} = false is not supported; anvil initialises as PEFT does by default (A Kaiming-uniform, "
              "B zero)", m.source("init_lora_weights"), m.full("init_lora_weights"));
  for (const char* key : {"use_dora", "lora_bias"}) {
    bool v = false;
    m.get(key, v);
    ANVIL_CHECK(!v, "{}: {} = true is not supported; leave it false", m.source(key), m.full(key));
  }
  for (const char* key : {"modules_to_save", "layers_to_transform", "layers_pattern", "exclude_modules", "rank_pattern",
                          "alpha_pattern", "loftq_config", "layer_replication", "megatron_config"}) {
    const bool empty = !m.has(key) || (m.raw(key).IsMap() || m.raw(key).IsSequence() ? m.raw(key).size() == 0 : false);
    ANVIL_CHECK(empty, "{}: {} is not supported (every block gets the same adapters, and nothing else trains); leave "
                "it unset", m.source(key), m.full(key));
  }
  m.finish();
}

void write_peft_config(YAML::Emitter& e, const ModelConfig& cfg) {
  if (!cfg.has_lora()) return;
  const LoraConfig& l = cfg.lora;
  e << YAML::Key << "peft_config" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "peft_type" << YAML::Value << "LORA";
  e << YAML::Key << "r" << YAML::Value << l.r;
  e << YAML::Key << "lora_alpha" << YAML::Value << yaml_number(l.alpha);
  e << YAML::Key << "lora_dropout" << YAML::Value << yaml_number(l.dropout);
  e << YAML::Key << "use_rslora" << YAML::Value << l.rslora;
  e << YAML::Key << "target_modules" << YAML::Value;
  if (l.target_modules.size() == 1 && l.target_modules[0] == kAllLinear)
    e << kAllLinear;
  else
    e << YAML::Flow << l.target_modules;
  e << YAML::EndMap;
}

}  // namespace anvil
