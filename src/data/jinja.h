// A Jinja2 interpreter for chat templates: the language as Jinja 3 runs it in the environment
// transformers renders `chat_template` with (trim_blocks, lstrip_blocks, loop controls, sandboxed:
// no mutation of lists and dicts, namespaces excepted). No C++ Jinja library is packaged in
// Debian, and the templates published with models use a small, stable part of the language:
// statements (if, for with else and a filter, set, set blocks, macros, break/continue,
// transformers' generation block), expressions with Python's semantics (strings index by code
// point, deep ==, chained comparisons, slices), Jinja's filters and tests, Python's string and
// dict methods, and the globals transformers adds (raise_exception, strftime_now). Whatever a
// template uses beyond that is a one-line error naming it and where it is.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace anvil::jinja {

class Value;
using List = std::vector<Value>;
// A dict keeps insertion order (Python's); keys are strings, as in JSON and the templates.
using Dict = std::vector<std::pair<std::string, Value>>;
struct Args;
using Function = std::function<Value(Args&)>;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };

  Value() = default;  // undefined
  static Value undefined(std::string name);
  static Value none();
  Value(bool b);
  Value(int64_t i);
  Value(int i) : Value(static_cast<int64_t>(i)) {}
  Value(double f);
  Value(std::string s);
  Value(const char* s) : Value(std::string(s)) {}
  Value(List l, bool is_tuple = false);
  Value(Dict d, bool is_namespace = false);
  static Value function(std::string name, Function f);
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool; }
  bool is_list() const { return kind_ == Kind::kList; }  // a list or a tuple
  bool is_tuple() const { return kind_ == Kind::kList && tuple_; }
  // What Jinja's select, map, items and reverse filters give: a generator, iterable once, always
  // true, without a length or an index (anvil keeps the items, so iterating twice repeats them).
  static Value lazy(List l);
  bool is_lazy() const { return kind_ == Kind::kList && lazy_; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kDict && namespace_; }
  bool is_function() const { return kind_ == Kind::kFunction; }

  bool truthy() const;
  bool as_bool() const { return b_; }
  int64_t as_int() const;  // bool and int
  double as_double() const;
  const std::string& str() const { return *s_; }
  const List& list() const { return *list_; }
  const Dict& dict() const { return *dict_; }
  Dict& mutable_dict() const { return *dict_; }  // a namespace's attributes
  const Value* find(const std::string& key) const;  // a dict's item, or nullptr
  Value call(Args& args) const;
  const std::string& name() const { return name_; }  // an undefined's or a function's name

  std::string to_string() const;  // Python's str(): what {{ }} prints
  std::string repr() const;       // Python's repr(), as str() shows items of a list or dict
  std::string type_name() const;  // Python's name of the type, for errors

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false, namespace_ = false, tuple_ = false, lazy_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::shared_ptr<const std::string> s_;
  std::shared_ptr<const List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<const Function> fn_;
  std::string name_;
};

// A call's arguments, positional then keyword; `take` hands them to a function by Python's rules.
struct Args {
  std::string callee;  // for errors: "filter 'join'", "method 'split'", ...
  List positional;
  Dict keyword;
  // The argument at `index` or named `key`, else `fallback`; `required` makes a missing one an error.
  Value take(size_t index, const std::string& key, Value fallback = Value::none(), bool required = false);
  void done() const;  // an argument no parameter took is an error
  std::vector<bool> used_positional;
  std::vector<bool> used_keyword;
};

// Python's json.dumps(value, ensure_ascii, indent, separators, sort_keys), which transformers'
// tojson filter is (ensure_ascii false by default there).
struct JsonStyle {
  bool ensure_ascii = false, sort_keys = false;
  std::optional<std::string> indent;  // none: one line
  std::string item_separator = ", ", key_separator = ": ";
};
std::string to_json(const Value& v, const JsonStyle& style = {});

class Template {
 public:
  // Parses `source` (`name` names it in errors); a syntax error or an unsupported construct
  // throws an Error naming the line.
  Template(const std::string& source, std::string name);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with `variables` (JSON values) and `globals` (functions and values) in scope.
  std::string render(const nlohmann::ordered_json& variables, const Dict& globals = {}) const;

 private:
  struct Program;
  std::unique_ptr<Program> program_;
};

}  // namespace anvil::jinja
