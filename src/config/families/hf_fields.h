// The reading of a transformers config.json into a model section (config/hf_model_config.cpp),
// as each family's keys_from_hf uses it: a field is copied under the family's key, or checked
// where anvil honours one value. Every field looked at is noted, so that config_overrides can
// tell a field the model type reads from one it does not have; every key copied remembers its
// field, so that an error about the key names the field the user wrote.
#pragma once
#include <map>
#include <memory>
#include <set>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "config/yaml_document.h"
#include "core/error.h"

namespace anvil {

class HfFields {
 public:
  // j: config.json (or a mapping inside it, at `path`: "attn_config."); where: the file, for errors.
  HfFields(const nlohmann::json& j, const std::string& where, std::set<std::string>* fields_read = nullptr,
           std::string path = "")
      : j_(j), where_(where), path_(std::move(path)), fields_read_(fields_read) {}

  bool has(const char* key) const {
    if (fields_read_ && path_.empty()) fields_read_->insert(key);
    return j_.contains(key) && !j_.at(key).is_null();
  }
  template <typename T>
  T get(const char* key, T fallback) const {
    if (!has(key)) return fallback;
    try {
      return j_.at(key).get<T>();
    } catch (const nlohmann::json::exception&) {
      throw Error(fmt::format("{}: field '{}{}' has the wrong type ({})", where_, path_, key, j_.at(key).dump()));
    }
  }
  template <typename T>
  T need(const char* key) const {
    ANVIL_CHECK(has(key), "{}: field '{}{}' is missing", where_, path_, key);
    return get<T>(key, T{});
  }
  // The field's value as the section's key `anvil_key` (a dotted path: "attn_config.alibi").
  void copy(const char* key, const std::string& anvil_key) {
    if (has(key)) set(anvil_key, YAML::Load(j_.at(key).dump()), key);
  }
  // The mapping field `key`, less its fields named in `skip`, as the section's key `anvil_key`.
  void copy_mapping(const char* key, const std::string& anvil_key, const std::set<std::string>& skip) {
    if (!has(key)) return;
    ANVIL_CHECK(j_.at(key).is_object(), "{}: field '{}{}' must be a mapping ({})", where_, path_, key,
                j_.at(key).dump());
    nlohmann::json kept = nlohmann::json::object();
    for (const auto& [k, v] : j_.at(key).items())
      if (!skip.count(k)) kept[k] = v;
    set(anvil_key, YAML::Load(kept.dump()), key);
  }
  // Sets the section's key to a value the family derives from `field` ("" for none).
  template <typename T>
  void set(const std::string& anvil_key, const T& value, const std::string& field = "") {
    set_dotted(section_, anvil_key, YAML::Node(value));
    if (!field.empty()) (*origins_)["model." + anvil_key] = fmt::format("{} (field '{}{}')", where_, path_, field);
  }
  template <typename T>
  void only(const char* key, T allowed, const std::string& why) const {
    ANVIL_CHECK(!has(key) || get<T>(key, allowed) == allowed, "{}: field '{}{}' = {} cannot be honoured ({})", where_,
                path_, key, j_.at(key).dump(), why);
  }
  void absent(const char* key, const std::string& why) const {
    ANVIL_CHECK(!has(key), "{}: field '{}{}' = {} cannot be honoured ({})", where_, path_, key, j_.at(key).dump(), why);
  }
  // The mapping field `key` ({} when absent), read into the same section.
  HfFields sub(const char* key) {
    static const nlohmann::json empty = nlohmann::json::object();
    HfFields s(has(key) && j_.at(key).is_object() ? j_.at(key) : empty, where_, nullptr, path_ + key + ".");
    s.section_ = section_;  // a YAML::Node shares what it refers to
    s.origins_ = origins_;
    return s;
  }

  const std::string& where() const { return where_; }
  YAML::Node section() const { return section_; }
  // Each key of the section set from a field, to where the field is ("config.json (field 'n_head')").
  const std::map<std::string, std::string>& origins() const { return *origins_; }

 private:
  const nlohmann::json& j_;
  const std::string& where_;
  std::string path_;
  std::set<std::string>* fields_read_;
  YAML::Node section_{YAML::NodeType::Map};
  std::shared_ptr<std::map<std::string, std::string>> origins_ = std::make_shared<std::map<std::string, std::string>>();
};

}  // namespace anvil
