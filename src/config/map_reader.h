// MapReader: reads one YAML mapping of a config file, remembering which keys were consumed so
// that finish() can reject the rest by name. Every conversion error names the file and the full
// dotted key.
#pragma once
#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "config/choices.h"
#include "config/duration.h"
#include "config/train_config.h"
#include "core/error.h"
#include "core/suggest.h"

namespace anvil {

// The unknown keys that the readers of one config found, reported together once the config has
// been read, so that a user learns all of them in one run.
class UnknownKeys {
 public:
  struct Key {
    std::string source;   // the file (or what set it) that gives the key
    std::string key;      // its full dotted name
    std::string nearest;  // the full name of the nearest valid key, or ""
    std::vector<std::string> allowed;  // the valid keys where it stands
  };
  void add(Key key) { found_.push_back(std::move(key)); }
  const std::vector<Key>& found() const { return found_; }
  // Throws every unknown key found, followed by `stopped_by` (the error that ended the reading,
  // if any); returns when there is nothing to report.
  void raise(const std::string& stopped_by = "") const {
    if (found_.empty()) return;
    if (found_.size() == 1 && stopped_by.empty()) ANVIL_FAIL("{}", message(found_[0]));
    std::string msg = fmt::format("{} unknown key{}:", found_.size(), found_.size() == 1 ? "" : "s");
    for (const Key& k : found_) msg += "\n  " + message(k);
    if (!stopped_by.empty()) msg += "\nthen: " + stopped_by;
    ANVIL_FAIL("{}", msg);
  }

 private:
  static std::string message(const Key& k) {
    return fmt::format("{}: unknown key '{}'{} (expected one of: {})", k.source, k.key,
                       k.nearest.empty() ? "" : " (did you mean '" + k.nearest + "'?)", fmt::join(k.allowed, ", "));
  }
  std::vector<Key> found_;
};

class MapReader {
 public:
  // keys_read (may be null) collects the full dotted name of every key this reader and its
  // sub-readers accept, present or not. unknown (may be null) collects the keys finish() rejects;
  // without it, finish() throws them. origins (may be null) maps dotted keys set elsewhere than
  // the file (by the command line, by a ds_config) to where, so that their errors blame it.
  MapReader(const YAML::Node& node, std::string prefix, const std::string& file,
            std::set<std::string>* keys_read = nullptr, UnknownKeys* unknown = nullptr,
            const std::map<std::string, std::string>* origins = nullptr)
      : node_(node), prefix_(std::move(prefix)), file_(file), keys_read_(keys_read), unknown_(unknown),
        origins_(origins) {
    ANVIL_CHECK(node.IsMap(), "{}: '{}' must be a mapping of keys to values", file_,
                prefix_.empty() ? "the top level" : prefix_);
  }

  bool has(const std::string& key) {
    allowed_.insert(key);
    if (keys_read_) keys_read_->insert(full(key));
    return static_cast<bool>(node_[key]) && !node_[key].IsNull();
  }

  template <typename T>
  void get(const std::string& key, T& out) {
    if (!has(key)) return;
    const YAML::Node& v = node_[key];
    ANVIL_CHECK(v.IsScalar(), "{}: {} must be a single value", source(key), full(key));
    if constexpr (std::is_enum_v<T>) {
      ANVIL_CHECK(parse_choice(v.Scalar(), &out), "{}: {} '{}' is not valid: expected {}", source(key), full(key),
                  v.Scalar(), choice_list<T>());
    } else {
      try {
        out = v.as<T>();
      } catch (const YAML::Exception&) {
        ANVIL_FAIL("{}: {} = '{}' is not {}", source(key), full(key), v.Scalar(), expected<T>());
      }
    }
  }

  void get_duration(const std::string& key, Duration& out) {
    std::string text;
    get(key, text);
    if (!text.empty()) out = parse_duration(text, source(key) + ": " + full(key));
  }

  // A size in bytes ("64kb", "10gb", see parse_bytes); -1 (none) is kept as -1.
  void get_bytes(const std::string& key, int64_t& out) {
    std::string text;
    get(key, text);
    if (!text.empty() && text != "-1") out = parse_bytes(text, source(key) + ": " + full(key));
  }

  // A section; absent or null ("lr_monitor:" with nothing after it) reads as an empty one.
  MapReader sub(const std::string& key) {
    return MapReader(has(key) ? node_[key] : YAML::Node(YAML::NodeType::Map), full(key), file_, keys_read_, unknown_,
                     origins_);
  }

  YAML::Node raw(const std::string& key) {
    has(key);
    return node_[key];
  }

  // Rejects the keys of this mapping that no get/has/sub/raw asked for: into `into` when given
  // (a reader whose unknown keys mean something else, such as a ds_config's that DeepSpeed
  // ignores), else into the reader's collector, else at once.
  void finish(UnknownKeys* into = nullptr) {
    std::set<std::string> seen;
    UnknownKeys here;
    UnknownKeys& out = into ? *into : unknown_ ? *unknown_ : here;
    const std::vector<std::string> allowed(allowed_.begin(), allowed_.end());
    for (auto it = node_.begin(); it != node_.end(); ++it) {
      const std::string key = it->first.as<std::string>();
      ANVIL_CHECK(seen.insert(key).second, "{}: key '{}' is given twice", file_, full(key));
      if (allowed_.count(key)) continue;
      const std::string near = nearest_name(key, allowed);
      out.add({source(key), full(key), near.empty() ? "" : full(near), allowed});
    }
    here.raise();
  }

  const std::string& file() const { return file_; }
  // Where a key's value came from: what set it or a section above it (the command line, a
  // ds_config), else the file.
  std::string source(const std::string& key) const {
    const std::string k = full(key);
    if (origins_)
      for (size_t i = 0; i <= k.size(); ++i)
        if (i == k.size() || k[i] == '.')
          if (const auto it = origins_->find(k.substr(0, i)); it != origins_->end()) return it->second;
    return file_;
  }
  std::string full(const std::string& key) const { return prefix_.empty() ? key : prefix_ + "." + key; }

 private:
  template <typename T>
  static const char* expected() {
    if constexpr (std::is_same_v<T, bool>) return "true or false";
    else if constexpr (std::is_integral_v<T>) return "an integer";
    else if constexpr (std::is_floating_point_v<T>) return "a number";
    else return "a string";
  }

  YAML::Node node_;
  std::string prefix_;
  std::string file_;
  std::set<std::string> allowed_;
  std::set<std::string>* keys_read_;
  UnknownKeys* unknown_;
  const std::map<std::string, std::string>* origins_;
};

}  // namespace anvil
