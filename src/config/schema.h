// A config section as one table. Each key is written once, with what reads it, what writes it
// back into the resolved config, the check its value must pass and the row that documents it;
// the reader, to_yaml, the unknown-key suggestions (the keys MapReader was asked for) and
// docs/config.md's tables all come from the table, so none of them can know a key the others miss.
#pragma once
#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "config/choices.h"
#include "config/duration.h"
#include "config/map_reader.h"
#include "config/yaml_number.h"
#include "core/error.h"

namespace anvil {

// One row of docs/config.md's tables. key may list several keys ("a, b"), documented together.
struct KeyDoc {
  std::string key, default_text, meaning;
};

// What a section's reader is told by the sections read before it; most need nothing.
struct NoContext {};

// A condition one value must meet; `must` completes "KEY = VALUE must ...".
template <class T>
struct Check {
  std::function<bool(const T&)> ok;
  std::string must;
};

template <class T>
Check<T> at_least(T least) {
  return {[least](const T& v) { return v >= least; }, fmt::format("be at least {}", least)};
}
template <class T>
Check<T> positive() {
  return {[](const T& v) { return v > 0; }, "be positive"};
}
template <class T>
Check<T> not_negative() {
  return {[](const T& v) { return v >= 0; }, "not be negative"};
}
// -1 meaning "all" or "none", else a positive count.
template <class T>
Check<T> minus_one_or_positive(const char* minus_one_means) {
  return {[](const T& v) { return v == -1 || v > 0; }, fmt::format("be -1 ({}) or positive", minus_one_means)};
}
// A value anvil has one meaning for: the default of the tool whose key it is.
template <class T>
Check<T> only(T honoured, std::string why) {
  return {[honoured](const T& v) { return v == honoured; }, fmt::format("be {} ({})", YAML::Node(honoured).Scalar(), why)};
}

// A name from another tool's closed set, each of which anvil honours (or has nothing to do for).
inline Check<std::string> one_of(std::vector<std::string> names) {
  std::string listed;
  for (size_t i = 0; i < names.size(); i++)
    listed += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return {[names](const std::string& v) { return std::find(names.begin(), names.end(), v) != names.end(); },
          "be " + listed};
}

// How the docs and the messages show a value.
template <class T>
std::string shown(const T& v) {
  if constexpr (std::is_same_v<T, bool>) return v ? "true" : "false";
  else if constexpr (std::is_enum_v<T>) return choice_name(v);
  else if constexpr (std::is_same_v<T, Duration>) return v.text;
  else if constexpr (std::is_same_v<T, std::string>) return v;
  else return fmt::format("{}", v);
}

template <class S, class C = NoContext>
struct Field {
  std::string key;
  std::string default_text;  // the docs' default column
  std::string meaning;       // the docs' meaning column; "" with rows: the section documents itself
  std::function<void(MapReader&, S&, const C&)> read;
  // Emits the key and its value, or nothing (a value not set); null: accepted and not recorded
  // (a spelling of another key, or a setting with nothing for anvil to keep).
  std::function<void(YAML::Emitter&, const S&)> write;
  std::vector<KeyDoc> rows;  // a section's own rows, keys relative to this one

  // The docs' default column, where the struct's default does not say it.
  Field defaults(std::string text) && {
    default_text = std::move(text);
    return std::move(*this);
  }
  // A key every config must give; what_to_give says what, e.g. "e.g. 1000ba or 1ep".
  Field required(std::string what_to_give) && {
    read = [inner = std::move(read), key = key, what_to_give](MapReader& r, S& s, const C& c) {
      ANVIL_CHECK(r.has(key), "{}: {} is required ({})", r.file(), r.full(key), what_to_give);
      inner(r, s, c);
    };
    default_text = "required";
    return std::move(*this);
  }
};

// Reads each field of the table from r, the section's reader (whose finish() then rejects the
// keys no table asked for).
template <class S, class C>
void read_fields(MapReader& r, const std::vector<Field<S, C>>& table, S& out, const C& context) {
  for (const Field<S, C>& f : table) f.read(r, out, context);
}

// Emits the table's keys and values (the caller opens and closes the mapping).
template <class S, class C>
void write_fields(YAML::Emitter& e, const std::vector<Field<S, C>>& table, const S& value) {
  for (const Field<S, C>& f : table)
    if (f.write) f.write(e, value);
}

// The table's documentation rows, keys prefixed by the section's dotted name.
template <class S, class C>
std::vector<KeyDoc> key_docs(const std::vector<Field<S, C>>& table, const std::string& prefix = "") {
  std::vector<KeyDoc> out;
  for (const Field<S, C>& f : table) {
    const std::string key = f.key.empty() ? prefix : prefix + f.key;
    if (!f.meaning.empty() || !f.default_text.empty()) out.push_back({key, f.default_text, f.meaning});
    for (const KeyDoc& row : f.rows)
      out.push_back({(key.empty() ? "" : key + ".") + row.key, row.default_text, row.meaning});
  }
  return out;
}

// docs/config.md's table: one row per entry, each key in backticks.
std::string key_docs_markdown(const std::vector<KeyDoc>& rows);

// The builders of a section's fields.
template <class S, class C = NoContext>
struct Fields {
  using F = Field<S, C>;

  template <class T>
  static void emit(YAML::Emitter& e, const std::string& key, const T& v) {
    e << YAML::Key << key << YAML::Value;
    if constexpr (std::is_enum_v<T>) e << choice_name(v);
    else if constexpr (std::is_same_v<T, Duration>) e << v.text;
    else e << yaml_value(v);
  }

  template <class T>
  static void check(const MapReader& r, const std::string& key, const T& v, const Check<T>& c) {
    ANVIL_CHECK(!c.ok || c.ok(v), "{}: {} = {} must {}", r.source(key), r.full(key), shown(v), c.must);
  }

  // A key kept in a member, written back as read. Durations are read as Composer's time strings.
  template <class T>
  static F value(std::string key, T S::*member, std::string meaning, Check<T> check_value = {}) {
    const S defaults{};
    std::string default_text = shown(defaults.*member);
    if (std::is_enum_v<T> || std::is_same_v<T, Duration> || (std::is_same_v<T, std::string> && !default_text.empty()))
      default_text = "`" + default_text + "`";
    return F{key, default_text, std::move(meaning),
             [key, member, check_value](MapReader& r, S& s, const C&) {
               if constexpr (std::is_same_v<T, Duration>) r.get_duration(key, s.*member);
               else r.get(key, s.*member);
               check(r, key, s.*member, check_value);
             },
             [key, member](YAML::Emitter& e, const S& s) { emit(e, key, s.*member); }, {}};
  }

  // A size in bytes ("64kb", "10gb"; -1 for none).
  static F bytes(std::string key, int64_t S::*member, std::string meaning) {
    return F{key, fmt::format("{}", S{}.*member), std::move(meaning),
             [key, member](MapReader& r, S& s, const C&) { r.get_bytes(key, s.*member); },
             [key, member](YAML::Emitter& e, const S& s) { emit(e, key, s.*member); }, {}};
  }

  // A key accepted from another tool's files that anvil has nothing to keep of: its value is
  // read (so a wrong type is an error) and checked, and not written back.
  template <class T>
  static F accepted(std::string key, T assumed, std::string meaning, Check<T> check_value = {}) {
    return F{key, shown(assumed), std::move(meaning), [key, assumed, check_value](MapReader& r, S&, const C&) {
               T v = assumed;
               r.get(key, v);
               check(r, key, v, check_value);
             }, nullptr, {}};
  }

  // A key whose every use is an error, saying what to do instead.
  static F refused(std::string key, std::string meaning, std::string instead) {
    return F{key, "", std::move(meaning), [key, instead](MapReader& r, S&, const C&) {
               ANVIL_CHECK(!r.has(key), "{}: {} is not supported: {}", r.source(key), r.full(key), instead);
             }, nullptr, {}};
  }

  // A sub-section of its own table, kept in a member. to_context gives the sub-section's context
  // from the section read so far.
  template <class T, class D>
  static F section(std::string key, T S::*member, const std::vector<Field<T, D>>& table,
                   std::function<D(const S&, const C&)> to_context, std::string meaning = "") {
    return F{key, "", std::move(meaning),
             [key, member, &table, to_context](MapReader& r, S& s, const C& c) {
               MapReader sub = r.sub(key);
               read_fields(sub, table, s.*member, to_context(s, c));
               sub.finish();
             },
             [key, member, &table](YAML::Emitter& e, const S& s) {
               e << YAML::Key << key << YAML::Value << YAML::BeginMap;
               write_fields(e, table, s.*member);
               e << YAML::EndMap;
             },
             key_docs(table)};
  }
  template <class T>
  static F section(std::string key, T S::*member, const std::vector<Field<T>>& table, std::string meaning = "") {
    return section<T, NoContext>(std::move(key), member, table, [](const S&, const C&) { return NoContext{}; },
                                 std::move(meaning));
  }

  // A sub-section whose keys set the section's own struct (a spelling of keys kept elsewhere, or
  // a group of keys with no struct of their own).
  static F group(std::string key, const std::vector<F>& table, bool written, std::string meaning = "") {
    F f{key, "", std::move(meaning),
        [key, &table](MapReader& r, S& s, const C& c) {
          MapReader sub = r.sub(key);
          read_fields(sub, table, s, c);
          sub.finish();
        },
        nullptr, key_docs(table)};
    if (written)
      f.write = [key, &table](YAML::Emitter& e, const S& s) {
        e << YAML::Key << key << YAML::Value << YAML::BeginMap;
        write_fields(e, table, s);
        e << YAML::EndMap;
      };
    return f;
  }

  // Anything else: its reader and writer given.
  static F custom(std::string key, std::string default_text, std::string meaning,
                  std::function<void(MapReader&, S&, const C&)> read,
                  std::function<void(YAML::Emitter&, const S&)> write = nullptr) {
    return F{std::move(key), std::move(default_text), std::move(meaning), std::move(read), std::move(write), {}};
  }
};

}  // namespace anvil
