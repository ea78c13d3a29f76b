#include "config/yaml_document.h"

#include <algorithm>
#include <filesystem>
#include <functional>

#include "core/error.h"

namespace anvil {
namespace {

// The node at a dotted path (from position pos on) below node, or an undefined node. A const walk:
// looking a key up never adds it.
YAML::Node node_at(const YAML::Node& node, const std::string& path, size_t pos = 0) {
  const size_t end = std::min(path.find('.', pos), path.size());
  const std::string key = path.substr(pos, end - pos);
  if (!node.IsMap() || !node[key]) return YAML::Node(YAML::NodeType::Undefined);
  return end == path.size() ? node[key] : node_at(node[key], path, end + 1);
}

// YAML's merge key (`<<: *anchor`, or a list of anchors), as LLM Foundry's fine-tuning files use
// it, which yaml-cpp 0.7 leaves as an ordinary key: the merged mappings' keys are added where the
// mapping does not give them itself (earlier mappings of a list first).
void merge_keys(YAML::Node node, const std::string& file) {
  if (node.IsSequence()) {
    for (size_t i = 0; i < node.size(); i++) merge_keys(node[i], file);
    return;
  }
  if (!node.IsMap()) return;
  if (const YAML::Node merged = node["<<"]) {
    node.remove("<<");
    std::vector<YAML::Node> sources;
    if (merged.IsSequence())
      for (size_t i = 0; i < merged.size(); i++) sources.push_back(merged[i]);
    else
      sources.push_back(merged);
    for (const YAML::Node& src : sources) {
      ANVIL_CHECK(src.IsMap(), "{}: a merge key (<<) must name a mapping or a list of mappings", file);
      for (auto it = src.begin(); it != src.end(); ++it) {
        const std::string key = it->first.as<std::string>();
        if (!node[key]) node[key] = YAML::Clone(it->second);
      }
    }
  }
  for (auto it = node.begin(); it != node.end(); ++it) merge_keys(it->second, file);
}

// OmegaConf's interpolation, as LLM Foundry's files use it: "${a.b}" as a whole value is replaced
// by the value at that dotted path from the root: ${variables.x}, or in Foundry's older files a
// top-level key (${data_local}, ${global_seed}), which is then a variable and no unknown key;
// inside a longer string ("s3://bucket/${variables.run_name}/ckpt") by that value's text. A value
// that is itself an interpolation is resolved in turn. `variables` collects the top-level keys
// referred to.
void interpolate(YAML::Node node, const YAML::Node& root, const std::string& file, std::set<std::string>& variables) {
  auto whole = [](const YAML::Node& v) {
    return v.IsScalar() && v.Scalar().size() >= 4 && v.Scalar().rfind("${", 0) == 0 && v.Scalar().back() == '}' &&
           v.Scalar().find('}') == v.Scalar().size() - 1;
  };
  auto embedded = [](const YAML::Node& v) { return v.IsScalar() && v.Scalar().find("${") != std::string::npos; };
  auto target_of = [&](const std::string& expr) {
    const std::string path = expr.substr(2, expr.size() - 3);
    const YAML::Node target = node_at(root, path);
    ANVIL_CHECK(target.IsDefined(), "{}: '{}' refers to {}, which is not defined", file, expr, path);
    variables.insert(path.substr(0, path.find('.')));
    return target;
  };
  std::function<YAML::Node(YAML::Node, int)> resolve = [&](YAML::Node value, int depth) -> YAML::Node {
    ANVIL_CHECK(depth < 16, "{}: '{}' is part of an interpolation cycle", file, value.Scalar());
    if (whole(value)) return resolve(target_of(value.Scalar()), depth + 1);
    if (!embedded(value)) return value;
    std::string text = value.Scalar(), out;
    for (size_t pos = 0;;) {
      const size_t start = text.find("${", pos);
      if (start == std::string::npos) {
        out += text.substr(pos);
        break;
      }
      const size_t end = text.find('}', start);
      ANVIL_CHECK(end != std::string::npos, "{}: '{}' has an unclosed ${{", file, text);
      const YAML::Node target = resolve(target_of(text.substr(start, end - start + 1)), depth + 1);
      ANVIL_CHECK(target.IsScalar(), "{}: '{}' puts {} inside a string, but it is not a single value", file, text,
                  text.substr(start, end - start + 1));
      out += text.substr(pos, start - pos) + target.Scalar();
      pos = end + 1;
    }
    return YAML::Node(out);
  };
  if (node.IsMap()) {
    for (auto it = node.begin(); it != node.end(); ++it) {
      if (embedded(it->second))
        node[it->first.as<std::string>()] = resolve(it->second, 0);
      else if (!it->second.IsScalar())
        interpolate(it->second, root, file, variables);
    }
  } else if (node.IsSequence()) {
    for (size_t i = 0; i < node.size(); i++) {
      if (embedded(node[i]))
        node[i] = resolve(node[i], 0);
      else if (!node[i].IsScalar())
        interpolate(node[i], root, file, variables);
    }
  }
}

}  // namespace

void set_dotted(YAML::Node node, const std::string& key, const YAML::Node& value) {
  const size_t dot = key.find('.');
  if (dot == std::string::npos) {
    node[key] = value;
    return;
  }
  const std::string first = key.substr(0, dot);
  if (!node[first] || !node[first].IsMap()) node[first] = YAML::Node(YAML::NodeType::Map);
  set_dotted(node[first], key.substr(dot + 1), value);
}

YAML::Node load_config_yaml(const std::string& path, const std::vector<std::string>& overrides,
                            std::map<std::string, std::string>& origins, std::set<std::string>& variables) {
  ANVIL_CHECK(std::filesystem::is_regular_file(path), "config file '{}' not found", path);
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    ANVIL_FAIL("{}: malformed YAML at line {}, column {}: {}", path, e.mark.line + 1, e.mark.column + 1, e.msg);
  }
  if (root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  ANVIL_CHECK(root.IsMap(), "{}: the top level must be a mapping of keys to values", path);
  merge_keys(root, path);
  for (const std::string& o : overrides) {
    const size_t eq = o.find('=');
    ANVIL_CHECK(eq != std::string::npos && eq > 0, "override '{}' must be written key=value (e.g. optimizer.lr=3e-4)", o);
    const std::string key = o.substr(0, eq);
    ANVIL_CHECK(key.front() != '.' && key.back() != '.' && key.find("..") == std::string::npos,
                "override '{}' has an empty key part", o);
    YAML::Node value;
    try {
      value = YAML::Load(o.substr(eq + 1));
    } catch (const YAML::Exception& e) {
      ANVIL_FAIL("override '{}': the value is not valid YAML: {}", o, e.msg);
    }
    set_dotted(root, key, value);
    origins[key] = "the command line";
  }
  variables = {"variables"};
  interpolate(root, YAML::Clone(root), path, variables);
  return root;
}


}  // namespace anvil
