// config.json is turned into the model section a config would spell for the same model, then read
// by the section reader: one set of rules for both.
#include "config/hf_model_config.h"

#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "config/families/family.h"
#include "config/families/hf_fields.h"
#include "config/lora_config.h"
#include "config/model_section.h"
#include "core/error.h"
#include "core/fs.h"

namespace anvil {
namespace {

// A YAML value as JSON, typed as YAML 1.2's core schema types plain scalars.
nlohmann::json yaml_to_json(const YAML::Node& n) {
  if (!n || n.IsNull()) return nullptr;
  if (n.IsSequence()) {
    nlohmann::json a = nlohmann::json::array();
    for (const YAML::Node& e : n) a.push_back(yaml_to_json(e));
    return a;
  }
  if (n.IsMap()) {
    nlohmann::json o = nlohmann::json::object();
    for (auto it = n.begin(); it != n.end(); ++it) o[it->first.as<std::string>()] = yaml_to_json(it->second);
    return o;
  }
  const std::string& s = n.Scalar();
  if (n.Tag() == "!") return s;  // quoted: a string
  if (s == "true" || s == "True") return true;
  if (s == "false" || s == "False") return false;
  if (s == "null" || s == "~") return nullptr;
  try {
    size_t used = 0;
    const long long i = std::stoll(s, &used);
    if (used == s.size()) return i;
    const double d = std::stod(s, &used);
    if (used == s.size()) return d;
  } catch (const std::exception&) {
  }
  return s;
}

// The published config.json fields of OpenAI's GPT-2 sizes (their architecture only).
nlohmann::json published_config(const std::string& name) {
  struct Size {
    const char* name;
    int layers, heads, width;
  };
  static const Size sizes[] = {{"gpt2", 12, 12, 768}, {"gpt2-medium", 24, 16, 1024}, {"gpt2-large", 36, 20, 1280},
                               {"gpt2-xl", 48, 25, 1600}};
  std::string bare = name;
  if (bare.rfind("openai-community/", 0) == 0) bare = bare.substr(17);
  for (const Size& s : sizes)
    if (bare == s.name)
      return {{"model_type", "gpt2"}, {"n_layer", s.layers}, {"n_head", s.heads}, {"n_embd", s.width},
              {"n_positions", 1024}, {"n_ctx", 1024}, {"vocab_size", 50257}, {"activation_function", "gelu_new"},
              {"layer_norm_epsilon", 1e-5}, {"embd_pdrop", 0.1}, {"attn_pdrop", 0.1}, {"resid_pdrop", 0.1},
              {"initializer_range", 0.02}, {"bos_token_id", 50256}, {"eos_token_id", 50256}};
  return nullptr;
}

// hf_model_config, noting in fields_read (when given) each top-level field it looks at.
ModelConfig read_hf_config(const nlohmann::json& j, const std::string& where, std::set<std::string>* fields_read) {
  ANVIL_CHECK(j.is_object(), "{}: expected a JSON object", where);
  HfFields fields(j, where, fields_read);
  const std::string type = fields.need<std::string>("model_type");
  const Family* f = family_for_hf_model_type(type);
  ANVIL_CHECK(f, "{}: model_type '{}' is not one anvil can import (expected {})", where, type, hf_model_types());
  fields.set("name", choice_name(f->id));
  f->keys_from_hf(fields);
  ModelConfig c;
  MapReader m(fields.section(), "model", where, nullptr, nullptr, &fields.origins());
  read_model_section(m, c);
  ANVIL_CHECK(c.max_seq_len > 0, "{}: the context size must be positive, not {}", m.source("max_seq_len"),
              c.max_seq_len);
  return c;
}

}  // namespace

ModelConfig hf_model_config(const nlohmann::json& j, const std::string& where) { return read_hf_config(j, where, nullptr); }

HfCausalLm read_hf_causal_lm(MapReader& m, const std::string& file) {
  namespace fs = std::filesystem;
  std::string source;
  m.get("pretrained_model_name_or_path", source);
  ANVIL_CHECK(!source.empty(), "{}: {} is required with model.name hf_causal_lm (a transformers model directory, or "
              "gpt2, gpt2-medium, gpt2-large or gpt2-xl)", file, m.full("pretrained_model_name_or_path"));
  bool pretrained = true;  // Foundry's default
  m.get("pretrained", pretrained);
  std::string init_device = "cpu";
  m.get("init_device", init_device);
  ANVIL_CHECK(init_device == "cpu" || init_device == "meta" || init_device == "mixed",
              "{}: {} = '{}' is not known (expected cpu, meta or mixed)", file, m.full("init_device"), init_device);
  ANVIL_CHECK(!(pretrained && init_device == "meta"), "{}: {} = meta cannot hold pretrained weights (as in LLM "
              "Foundry): use cpu or mixed, or pretrained: false", file, m.full("init_device"));
  // Foundry's switches that change nothing anvil computes: no code is downloaded or run, no
  // token is needed, and anvil's attention is one implementation whatever the flag asks for.
  for (const char* key : {"trust_remote_code", "use_auth_token", "use_flash_attention_2", "use_train_metrics",
                          "use_logits", "should_save_peft_only"}) {
    bool ignored = false;
    m.get(key, ignored);
  }
  for (const char* key : {"load_in_8bit", "allow_embedding_resizing", "shift_labels"}) {
    bool v = false;
    m.get(key, v);
    ANVIL_CHECK(!v, "{}: {} = true is not supported; leave it false", file, m.full(key));
  }
  ANVIL_CHECK(!m.has("pretrained_lora_id_or_path"), "{}: {} is not supported (a PEFT adapter from the hub); "
              "continue an adapter run with autoresume, or merge it with `anvil export --merge-lora`", file,
              m.full("pretrained_lora_id_or_path"));
  for (const char* key : {"additional_train_metrics", "additional_eval_metrics"})
    ANVIL_CHECK(!m.has(key), "{}: {} is not supported (anvil reports loss and perplexity); leave it unset", file,
                m.full(key));

  nlohmann::json config = published_config(source);
  std::string where = fmt::format("{} (the published {})", file, source);
  const fs::path dir(source);
  std::error_code ec;
  if (fs::is_directory(dir, ec)) {
    const std::string path = (dir / "config.json").string();
    ANVIL_CHECK(fs::is_regular_file(path, ec), "{}: '{}' has no config.json (expected a transformers model directory)",
                file, source);
    try {
      config = nlohmann::json::parse(read_file(path, "model config"));
    } catch (const nlohmann::json::exception& e) {
      ANVIL_FAIL("'{}' is not valid JSON: {}", path, e.what());
    }
    where = path;
  } else {
    ANVIL_CHECK(!config.is_null(), "{}: {} '{}' is neither a local transformers model directory nor a published "
                "architecture anvil knows (gpt2, gpt2-medium, gpt2-large, gpt2-xl); anvil does not download from the "
                "Hugging Face hub: fetch the model's directory and name it", file, m.full("pretrained_model_name_or_path"),
                source);
    ANVIL_CHECK(!pretrained, "{}: '{}' names the hub's weights, which anvil does not download: set {}: false to train "
                "its architecture from scratch, or `anvil import` a local copy and name that directory", file, source,
                m.full("pretrained"));
  }
  ANVIL_CHECK(config.is_object(), "{}: expected a JSON object", where);

  // config_overrides as Foundry's set_config_overrides applies them: a field the config has (or
  // that anvil reads for its model type) is replaced, a mapping field updated key by key.
  const nlohmann::json original = config;
  std::set<std::string> overridden;
  if (m.has("config_overrides")) {
    const YAML::Node overrides = m.raw("config_overrides");
    ANVIL_CHECK(overrides.IsMap(), "{}: {} must be a mapping of config.json fields to values", file,
                m.full("config_overrides"));
    for (auto it = overrides.begin(); it != overrides.end(); ++it) {
      const std::string key = it->first.as<std::string>();
      const nlohmann::json value = yaml_to_json(it->second);
      if (config.contains(key) && config[key].is_object() && value.is_object()) {
        for (const auto& [sub, v] : value.items()) {
          ANVIL_CHECK(config[key].contains(sub), "{}: {}.{}.{}: {}'s {} has no field '{}'", file,
                      m.full("config_overrides"), key, sub, where, key, sub);
          config[key][sub] = v;
        }
      } else {
        config[key] = value;
      }
      overridden.insert(key);
    }
  }
  std::set<std::string> fields_read;
  HfCausalLm out;
  out.model = read_hf_config(config, where, &fields_read);
  for (const std::string& key : overridden)
    ANVIL_CHECK(original.contains(key) || fields_read.count(key), "{}: {}.{}: the config ({}) has no field '{}'",
                file, m.full("config_overrides"), key, where, key);
  if (pretrained) out.weights_dir = fs::absolute(dir, ec).lexically_normal().string();
  // The dtype transformers would hold the weights in (torch_dtype; dtype in transformers 5): anvil
  // keeps fp32 master weights whatever it is, its matrix products following `precision`.
  for (const char* key : {"torch_dtype", "dtype"})
    if (overridden.count(key))
      out.notes.push_back(fmt::format("{}: {}.{} = {}: anvil keeps fp32 master weights; the matrix products follow "
                                      "precision", file, m.full("config_overrides"), key, config[key].dump()));
  read_peft_config(m, out.model);
  m.finish();
  return out;
}

}  // namespace anvil
