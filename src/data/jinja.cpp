#include "data/jinja.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <fmt/format.h>
#include <optional>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <set>
#include <unicode/uchar.h>
#include <unordered_map>

#include "core/error.h"
#include "data/byte_level.h"
#include "data/python_text.h"

namespace anvil::jinja {
namespace {

// --- Text as Python sees it: strings index, slice and measure by code point ----------------------

std::string strip(const std::string& s, const Value& chars, bool left, bool right) {
  const std::u32string cp = code_points(s);
  std::u32string set;
  const bool whitespace = chars.is_none() || chars.is_undefined();
  if (!whitespace) set = code_points(chars.to_string());
  auto strippable = [&](char32_t c) { return whitespace ? python_isspace(c) : set.find(c) != std::u32string::npos; };
  size_t b = 0, e = cp.size();
  if (left) while (b < e && strippable(cp[b])) b++;
  if (right) while (e > b && strippable(cp[e - 1])) e--;
  return utf8(cp.substr(b, e - b));
}

std::string case_map(const std::string& s, bool upper) { return upper ? python_upper(s) : python_lower(s); }

// Python's str.title() and str.capitalize().
std::string title_case(const std::string& s, bool only_first) {
  std::u32string cp = code_points(s);
  std::string out;
  bool previous_cased = false;
  for (size_t i = 0; i < cp.size(); i++) {
    const bool first = only_first ? i == 0 : !previous_cased;
    std::string one;
    append_utf8(one, cp[i]);
    out += case_map(one, first);
    previous_cased = u_hasBinaryProperty(cp[i], UCHAR_CASED);
  }
  return out;
}

// Python's repr(float).
std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const size_t e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  const int exponent = std::stoi(sci.substr(e + 1));
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa) if (c != '.') digits += c;
  std::string out;
  if (exponent < -4 || exponent >= 16) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
  } else if (exponent < 0) {
    out = "0." + std::string(-exponent - 1, '0') + digits;
  } else {
    if (digits.size() <= static_cast<size_t>(exponent) + 1) digits += std::string(exponent + 1 - digits.size(), '0');
    out = digits.substr(0, exponent + 1) + ".";
    const std::string fraction = digits.substr(exponent + 1);
    out += fraction.empty() ? "0" : fraction;
  }
  return negative ? "-" + out : out;
}

std::string string_repr(const std::string& s) {
  const bool double_quote = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = double_quote ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == q) out += std::string("\\") + static_cast<char>(q);
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7F) out += fmt::format("\\x{:02x}", c);
    else out += static_cast<char>(c);
  }
  return out + q;
}

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (size_t i = 0; i < s.size(); i++) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          out += fmt::format("\\u{:04x}", c);
        } else if (c >= 0x80 && ensure_ascii) {
          // A code point as \uXXXX, beyond the BMP as a surrogate pair (Python's json).
          size_t n = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
          if (i + n > s.size()) n = 1;
          char32_t cp = n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
          for (size_t k = 1; k < n; k++) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
          i += n - 1;
          if (cp >= 0x10000) {
            cp -= 0x10000;
            out += fmt::format("\\u{:04x}\\u{:04x}", static_cast<uint32_t>(0xD800 + (cp >> 10)),
                               static_cast<uint32_t>(0xDC00 + (cp & 0x3FF)));
          } else {
            out += fmt::format("\\u{:04x}", static_cast<uint32_t>(cp));
          }
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

void json_write(std::string& out, const Value& v, const JsonStyle& style, int depth) {
  auto newline = [&](int d) {
    if (!style.indent) return;
    out += "\n";
    for (int k = 0; k < d; k++) out += *style.indent;
  };
  switch (v.kind()) {
    case Value::Kind::kNone: out += "null"; return;
    case Value::Kind::kBool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::kInt: out += std::to_string(v.as_int()); return;
    case Value::Kind::kFloat: {
      const double d = v.as_double();
      out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : float_repr(d);
      return;
    }
    case Value::Kind::kString: json_string(out, v.str(), style.ensure_ascii); return;
    case Value::Kind::kList: {
      if (v.is_lazy()) break;
      if (v.list().empty()) { out += "[]"; return; }
      out += '[';
      for (size_t i = 0; i < v.list().size(); i++) {
        if (i) out += style.item_separator;
        newline(depth + 1);
        json_write(out, v.list()[i], style, depth + 1);
      }
      newline(depth);
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      if (v.is_namespace()) break;
      if (v.dict().empty()) { out += "{}"; return; }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict()) items.push_back(&kv);
      if (style.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](const auto* a, const auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t i = 0; i < items.size(); i++) {
        if (i) out += style.item_separator;
        newline(depth + 1);
        json_string(out, items[i]->first, style.ensure_ascii);
        out += style.key_separator;
        json_write(out, items[i]->second, style, depth + 1);
      }
      newline(depth);
      out += '}';
      return;
    }
    default: break;
  }
  ANVIL_FAIL("tojson: an object of type {} is not JSON serializable", v.type_name());
}

}  // namespace

// --- Value ----------------------------------------------------------------------------------------

Value Value::undefined(std::string name) {
  Value v;
  v.name_ = std::move(name);
  return v;
}
Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value::Value(bool b) : kind_(Kind::kBool), b_(b), i_(b) {}
Value::Value(int64_t i) : kind_(Kind::kInt), i_(i) {}
Value::Value(double f) : kind_(Kind::kFloat), f_(f) {}
Value::Value(std::string s) : kind_(Kind::kString), s_(std::make_shared<const std::string>(std::move(s))) {}
Value::Value(List l, bool is_tuple)
    : kind_(Kind::kList), tuple_(is_tuple), list_(std::make_shared<const List>(std::move(l))) {}
Value Value::lazy(List l) {
  Value v(std::move(l));
  v.lazy_ = true;
  return v;
}
Value::Value(Dict d, bool is_namespace)
    : kind_(Kind::kDict), namespace_(is_namespace), dict_(std::make_shared<Dict>(std::move(d))) {}
Value Value::function(std::string name, Function f) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.name_ = std::move(name);
  v.fn_ = std::make_shared<const Function>(std::move(f));
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      // Beyond int64: held as a float (Python's int would be exact; no chat needs such numbers).
      if (j.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) return Value(j.get<double>());
      return Value(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      for (const auto& e : j) l.push_back(from_json(e));
      return Value(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (auto it = j.begin(); it != j.end(); ++it) d.emplace_back(it.key(), from_json(it.value()));
      return Value(std::move(d));
    }
    default: return none();
  }
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return b_;
    case Kind::kInt: return i_ != 0;
    case Kind::kFloat: return f_ != 0;
    case Kind::kString: return !s_->empty();
    case Kind::kList: return lazy_ || !list_->empty();
    case Kind::kDict: return namespace_ || !dict_->empty();
    case Kind::kFunction: return true;
  }
  return false;
}

int64_t Value::as_int() const { return kind_ == Kind::kFloat ? static_cast<int64_t>(f_) : i_; }
double Value::as_double() const { return kind_ == Kind::kFloat ? f_ : static_cast<double>(i_); }

const Value* Value::find(const std::string& key) const {
  if (kind_ != Kind::kDict) return nullptr;
  for (const auto& [k, v] : *dict_) if (k == key) return &v;
  return nullptr;
}

Value Value::call(Args& args) const { return (*fn_)(args); }

std::string Value::to_string() const {
  switch (kind_) {
    case Kind::kUndefined: return "";
    case Kind::kNone: return "None";
    case Kind::kBool: return b_ ? "True" : "False";
    case Kind::kInt: return std::to_string(i_);
    case Kind::kFloat: return float_repr(f_);
    case Kind::kString: return *s_;
    case Kind::kList: {
      if (lazy_) return "<generator object>";
      std::string out = tuple_ ? "(" : "[";
      for (size_t i = 0; i < list_->size(); i++) out += (i ? ", " : "") + (*list_)[i].repr();
      if (tuple_ && list_->size() == 1) out += ",";
      return out + (tuple_ ? ")" : "]");
    }
    case Kind::kDict: {
      if (namespace_) return "<Namespace>";
      std::string out = "{";
      for (size_t i = 0; i < dict_->size(); i++)
        out += (i ? ", " : "") + string_repr((*dict_)[i].first) + ": " + (*dict_)[i].second.repr();
      return out + "}";
    }
    case Kind::kFunction: return "<function " + name_ + ">";
  }
  return "";
}

std::string Value::repr() const { return kind_ == Kind::kString ? string_repr(*s_) : to_string(); }

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return lazy_ ? "generator" : tuple_ ? "tuple" : "list";
    case Kind::kDict: return namespace_ ? "Namespace" : "dict";
    case Kind::kFunction: return "function";
  }
  return "object";
}

Value Args::take(size_t index, const std::string& key, Value fallback, bool required) {
  used_positional.resize(positional.size());
  used_keyword.resize(keyword.size());
  if (index < positional.size()) {
    used_positional[index] = true;
    return positional[index];
  }
  for (size_t i = 0; i < keyword.size(); i++) {
    if (keyword[i].first == key) {
      used_keyword[i] = true;
      return keyword[i].second;
    }
  }
  ANVIL_CHECK(!required, "{} needs its argument '{}'", callee, key);
  return fallback;
}

void Args::done() const {
  for (size_t i = 0; i < positional.size(); i++)
    ANVIL_CHECK(i < used_positional.size() && used_positional[i], "{} takes {} positional argument(s), got {}",
                callee, std::count(used_positional.begin(), used_positional.end(), true), positional.size());
  for (size_t i = 0; i < keyword.size(); i++)
    ANVIL_CHECK(i < used_keyword.size() && used_keyword[i], "{} has no argument '{}'", callee, keyword[i].first);
}

std::string to_json(const Value& v, const JsonStyle& style) {
  std::string out;
  json_write(out, v, style, 0);
  return out;
}

// --- Lexer ----------------------------------------------------------------------------------------

namespace {

enum class Tok { kData, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };

struct Token {
  Tok type;
  std::string text;  // data, name, operator, string value, number's digits
  int line;
};

struct Lexer {
  const std::string& name;
  std::string src;
  std::vector<Token> tokens;

  [[noreturn]] void fail(int line, const std::string& msg) const { ANVIL_FAIL("{} line {}: {}", name, line, msg); }

  // Lines are counted forward from the last position asked about (tokens come in order).
  size_t counted_pos = 0;
  int counted_line = 1;
  int line_at(size_t pos) {
    if (pos < counted_pos) {
      counted_pos = 0;
      counted_line = 1;
    }
    counted_line += static_cast<int>(std::count(src.begin() + counted_pos, src.begin() + pos, '\n'));
    counted_pos = pos;
    return counted_line;
  }

  static bool ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

  Lexer(const std::string& source, const std::string& template_name) : name(template_name) {
    // Jinja reads every newline sequence as \n and, without keep_trailing_newline, drops one
    // newline at the end of the template.
    src.reserve(source.size());
    for (size_t i = 0; i < source.size(); i++) {
      if (source[i] == '\r') {
        src += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') i++;
      } else {
        src += source[i];
      }
    }
    if (!src.empty() && src.back() == '\n') src.pop_back();
    run();
  }

  void run() {
    size_t pos = 0;
    const size_t n = src.size();
    while (pos < n) {
      size_t start = pos;
      while (true) {
        start = src.find('{', start);
        if (start == std::string::npos || start + 1 >= n) break;
        const char k = src[start + 1];
        if (k == '{' || k == '%' || k == '#') break;
        start++;
      }
      if (start == std::string::npos || start + 1 >= n) {
        tokens.push_back({Tok::kData, src.substr(pos), line_at(pos)});
        break;
      }
      std::string text = src.substr(pos, start - pos);
      const char kind = src[start + 1];
      size_t p = start + 2;
      const bool strip_before = p < n && src[p] == '-';
      const bool keep_before = p < n && src[p] == '+';
      if (strip_before || keep_before) p++;
      if (strip_before) {
        while (!text.empty() && ws(text.back())) text.pop_back();
      } else if ((kind == '%' || kind == '#') && !keep_before) {
        // lstrip_blocks: spaces and tabs before a block or comment tag alone on its line go.
        const size_t line_start = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        const bool at_line_start = line_start > 0 || pos == 0 || src[pos - 1] == '\n';
        if (at_line_start && text.find_first_not_of(" \t", line_start) == std::string::npos) text.resize(line_start);
      }
      if (!text.empty()) tokens.push_back({Tok::kData, text, line_at(pos)});
      const int line = line_at(start);
      if (kind == '#') {
        const size_t end = src.find("#}", p);
        if (end == std::string::npos) fail(line, "a comment {# is not closed by #}");
        pos = end + 2;
        after_tag(pos, end > p && src[end - 1] == '-', end > p && src[end - 1] == '+', true);
        continue;
      }
      tokens.push_back({kind == '{' ? Tok::kVarBegin : Tok::kBlockBegin, "", line});
      pos = expression(p, kind == '{' ? '}' : '%', line);
    }
    tokens.push_back({Tok::kEof, "", line_at(n)});
  }

  // Whitespace control after a tag: `-` strips all following whitespace; trim_blocks drops the
  // one newline after a block or comment tag unless `+` keeps it.
  void after_tag(size_t& pos, bool strip, bool keep, bool block) {
    if (strip) {
      while (pos < src.size() && ws(src[pos])) pos++;
    } else if (block && !keep && pos < src.size() && src[pos] == '\n') {
      pos++;
    }
  }

  // Tokens of an expression up to its closing `}}` or `%}`; returns the position after it.
  size_t expression(size_t p, char close, int line) {
    const size_t n = src.size();
    int open_brackets = 0;  // a `}}` inside a dict literal's braces does not close the tag
    while (true) {
      while (p < n && ws(src[p])) p++;
      if (p >= n) fail(line, fmt::format("the tag opened here is not closed by {}}}", close));
      const int here = line_at(p);
      auto closes = [&](size_t at) { return open_brackets == 0 && at + 1 < n && src[at] == close && src[at + 1] == '}'; };
      if (closes(p) || ((src[p] == '-' || (src[p] == '+' && close == '%')) && closes(p + 1))) {
        const bool strip = src[p] == '-', keep = src[p] == '+';
        p += (strip || keep) ? 3 : 2;
        tokens.push_back({close == '}' ? Tok::kVarEnd : Tok::kBlockEnd, "", here});
        after_tag(p, strip, keep, close == '%');
        return p;
      }
      const char c = src[p];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = p;
        while (e < n && (std::isalnum(static_cast<unsigned char>(src[e])) || src[e] == '_')) e++;
        tokens.push_back({Tok::kName, src.substr(p, e - p), here});
        p = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t e = p;
        auto digits = [&] { while (e < n && (std::isdigit(static_cast<unsigned char>(src[e])) || src[e] == '_')) e++; };
        digits();
        bool is_float = false;
        if (e + 1 < n && src[e] == '.' && std::isdigit(static_cast<unsigned char>(src[e + 1]))) {
          e++;
          digits();
          is_float = true;
        }
        if (e < n && (src[e] == 'e' || src[e] == 'E')) {
          size_t x = e + 1;
          if (x < n && (src[x] == '+' || src[x] == '-')) x++;
          if (x < n && std::isdigit(static_cast<unsigned char>(src[x]))) {
            e = x;
            digits();
            is_float = true;
          }
        }
        std::string text = src.substr(p, e - p);
        text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
        tokens.push_back({is_float ? Tok::kFloat : Tok::kInt, text, here});
        p = e;
      } else if (c == '\'' || c == '"') {
        p = string_literal(p, here);
      } else {
        static const char* kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                     "=", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|"};
        bool found = false;
        for (const char* op : kOps) {
          const size_t len = std::char_traits<char>::length(op);
          if (src.compare(p, len, op) == 0) {
            if (len == 1 && (*op == '(' || *op == '[' || *op == '{')) open_brackets++;
            if (len == 1 && (*op == ')' || *op == ']' || *op == '}')) open_brackets = std::max(0, open_brackets - 1);
            tokens.push_back({Tok::kOp, op, here});
            p += len;
            found = true;
            break;
          }
        }
        if (!found) fail(here, fmt::format("unexpected character '{}'", c));
      }
    }
  }

  // A quoted string, its escapes read as Python's unicode-escape codec reads them.
  size_t string_literal(size_t p, int line) {
    const char quote = src[p++];
    std::string out;
    while (true) {
      if (p >= src.size()) fail(line, "a string is not closed");
      const char c = src[p];
      if (c == quote) break;
      if (c != '\\' || p + 1 >= src.size()) {
        out += c;
        p++;
        continue;
      }
      const char e = src[p + 1];
      p += 2;
      auto hex = [&](int count) {
        ANVIL_CHECK(p + count <= src.size(), "{} line {}: a truncated \\x, \\u or \\U escape", name, line);
        uint32_t cp = 0;
        for (int i = 0; i < count; i++) {
          const char h = src[p + i];
          if (!std::isxdigit(static_cast<unsigned char>(h))) fail(line, "a malformed \\x, \\u or \\U escape");
          cp = cp * 16 + (std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
        }
        p += count;
        append_utf8(out, cp);
      };
      switch (e) {
        case '\n': break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x': hex(2); break;
        case 'u': hex(4); break;
        case 'U': hex(8); break;
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = e - '0';
            for (int i = 0; i < 2 && p < src.size() && src[p] >= '0' && src[p] <= '7'; i++) cp = cp * 8 + (src[p++] - '0');
            append_utf8(out, cp);
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    tokens.push_back({Tok::kString, out, line});
    return p + 1;
  }
};

// --- Syntax tree ----------------------------------------------------------------------------------

struct Expr {
  enum Type {
    kLiteral, kName, kList, kTuple, kDict, kGetattr, kGetitem, kSlice, kCall, kFilter, kTest,
    kNeg, kPos, kNot, kAnd, kOr, kBinary, kCompare, kConcat, kCond
  };
  Type type;
  int line = 0;
  Value literal;
  std::string name;                           // a name, attribute, filter, test or operator
  std::vector<std::unique_ptr<Expr>> items;   // operands, elements, positional arguments
  std::vector<std::string> keywords;          // names of the keyword arguments that follow `items`' positional ones
  std::vector<std::string> ops;               // a comparison's operators
  bool negated = false;                        // `is not`
};
using ExprPtr = std::unique_ptr<Expr>;

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum Type { kText, kOutput, kIf, kFor, kSet, kSetBlock, kMacro, kBreak, kContinue, kGeneration };
  Type type;
  int line = 0;
  std::string text;                    // kText; kSetBlock/kMacro's name; kSet's namespace attribute
  std::vector<std::string> targets;    // kFor/kSet's names (more than one: unpacking); kMacro's parameters
  std::vector<ExprPtr> exprs;          // kOutput: one; kIf: the conditions; kFor: iterable, filter; kSet: value; kMacro: defaults
  std::vector<Body> bodies;            // kIf: one per condition, then else; kFor: body, else; kSetBlock/kMacro/kGeneration: body
};

struct Parser {
  const std::string& name;
  std::vector<Token>& toks;
  size_t i = 0;

  [[noreturn]] void fail(int line, const std::string& msg) const { ANVIL_FAIL("{} line {}: {}", name, line, msg); }
  const Token& cur() const { return toks[i]; }
  const Token& peek(size_t k = 1) const { return toks[std::min(i + k, toks.size() - 1)]; }
  bool is_op(const char* op) const { return cur().type == Tok::kOp && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::kName && cur().text == n; }
  std::string describe(const Token& t) const {
    switch (t.type) {
      case Tok::kVarEnd: return "'}}'";
      case Tok::kBlockEnd: return "'%}'";
      case Tok::kEof: return "the end of the template";
      case Tok::kData: return "text";
      default: return "'" + t.text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(cur().line, fmt::format("expected '{}', found {}", op, describe(cur())));
    i++;
  }
  std::string expect_name() {
    if (cur().type != Tok::kName) fail(cur().line, fmt::format("expected a name, found {}", describe(cur())));
    return toks[i++].text;
  }
  void expect(Tok t, const char* what) {
    if (cur().type != t) fail(cur().line, fmt::format("expected {}, found {}", what, describe(cur())));
    i++;
  }

  ExprPtr node(Expr::Type t, int line) {
    auto e = std::make_unique<Expr>();
    e->type = t;
    e->line = line;
    return e;
  }

  // Expressions, with Jinja's precedence.
  ExprPtr parse_expression(bool with_condexpr = true) {
    ExprPtr e = parse_or();
    if (!with_condexpr) return e;
    while (is_name("if")) {
      const int line = toks[i++].line;
      auto c = node(Expr::kCond, line);
      ExprPtr test = parse_or();
      c->items.push_back(std::move(test));
      c->items.push_back(std::move(e));
      if (is_name("else")) {
        i++;
        c->items.push_back(parse_expression());
      }
      e = std::move(c);
    }
    return e;
  }
  ExprPtr parse_or() {
    ExprPtr l = parse_and();
    while (is_name("or")) {
      auto n = node(Expr::kOr, toks[i++].line);
      n->items.push_back(std::move(l));
      n->items.push_back(parse_and());
      l = std::move(n);
    }
    return l;
  }
  ExprPtr parse_and() {
    ExprPtr l = parse_not();
    while (is_name("and")) {
      auto n = node(Expr::kAnd, toks[i++].line);
      n->items.push_back(std::move(l));
      n->items.push_back(parse_not());
      l = std::move(n);
    }
    return l;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      auto n = node(Expr::kNot, toks[i++].line);
      n->items.push_back(parse_not());
      return n;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    const int line = cur().line;
    ExprPtr first = parse_math1();
    auto c = node(Expr::kCompare, line);
    while (true) {
      std::string op;
      if (cur().type == Tok::kOp && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                     cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
        op = toks[i++].text;
      } else if (is_name("in")) {
        i++;
        op = "in";
      } else if (is_name("not") && peek().type == Tok::kName && peek().text == "in") {
        i += 2;
        op = "not in";
      } else {
        break;
      }
      c->ops.push_back(op);
      c->items.push_back(parse_math1());
    }
    if (c->ops.empty()) return first;
    c->items.insert(c->items.begin(), std::move(first));
    return c;
  }
  ExprPtr binary(ExprPtr l, ExprPtr r, const std::string& op, int line) {
    auto n = node(Expr::kBinary, line);
    n->name = op;
    n->items.push_back(std::move(l));
    n->items.push_back(std::move(r));
    return n;
  }
  ExprPtr parse_math1() {
    ExprPtr l = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = toks[i++];
      l = binary(std::move(l), parse_concat(), t.text, t.line);
    }
    return l;
  }
  ExprPtr parse_concat() {
    ExprPtr l = parse_math2();
    if (!is_op("~")) return l;
    auto n = node(Expr::kConcat, cur().line);
    n->items.push_back(std::move(l));
    while (is_op("~")) {
      i++;
      n->items.push_back(parse_math2());
    }
    return n;
  }
  ExprPtr parse_math2() {
    ExprPtr l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = toks[i++];
      l = binary(std::move(l), parse_pow(), t.text, t.line);
    }
    return l;
  }
  ExprPtr parse_pow() {
    ExprPtr l = parse_unary();
    while (is_op("**")) {
      const Token& t = toks[i++];
      l = binary(std::move(l), parse_unary(), t.text, t.line);
    }
    return l;
  }
  ExprPtr parse_unary(bool with_filter = true) {
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token& t = toks[i++];
      e = node(t.text == "-" ? Expr::kNeg : Expr::kPos, t.line);
      e->items.push_back(parse_unary(false));
    } else {
      e = parse_postfix(parse_primary());
    }
    return with_filter ? parse_filter_expr(std::move(e)) : std::move(e);
  }
  ExprPtr parse_primary() {
    const Token& t = cur();
    switch (t.type) {
      case Tok::kName: {
        i++;
        if (t.text == "true" || t.text == "True") return literal(Value(true), t.line);
        if (t.text == "false" || t.text == "False") return literal(Value(false), t.line);
        if (t.text == "none" || t.text == "None") return literal(Value::none(), t.line);
        auto n = node(Expr::kName, t.line);
        n->name = t.text;
        return n;
      }
      case Tok::kString: {
        std::string s;
        while (cur().type == Tok::kString) s += toks[i++].text;  // adjacent strings join
        return literal(Value(s), t.line);
      }
      case Tok::kInt: {
        i++;
        int64_t v = 0;
        const auto r = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
        if (r.ec != std::errc()) fail(t.line, fmt::format("the integer {} is too large", t.text));
        return literal(Value(v), t.line);
      }
      case Tok::kFloat: i++; return literal(Value(std::strtod(t.text.c_str(), nullptr)), t.line);
      case Tok::kOp:
        if (t.text == "(") {
          i++;
          ExprPtr e = parse_tuple(true, true);
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          i++;
          auto l = node(Expr::kList, t.line);
          while (!is_op("]")) {
            if (!l->items.empty()) expect_op(",");
            if (is_op("]")) break;
            l->items.push_back(parse_expression());
          }
          i++;
          return l;
        }
        if (t.text == "{") {
          i++;
          auto d = node(Expr::kDict, t.line);
          while (!is_op("}")) {
            if (!d->items.empty()) expect_op(",");
            if (is_op("}")) break;
            d->items.push_back(parse_expression());
            expect_op(":");
            d->items.push_back(parse_expression());
          }
          i++;
          return d;
        }
        break;
      default: break;
    }
    fail(t.line, fmt::format("unexpected {}", describe(t)));
  }
  ExprPtr literal(Value v, int line) {
    auto n = node(Expr::kLiteral, line);
    n->literal = std::move(v);
    return n;
  }
  // A comma-separated list as a tuple (one expression without a comma stays itself).
  ExprPtr parse_tuple(bool with_condexpr = true, bool explicit_parens = false) {
    const int line = cur().line;
    std::vector<ExprPtr> items;
    bool comma = false;
    while (true) {
      if (!items.empty()) {
        if (!is_op(",")) break;
        i++;
        comma = true;
      }
      if (cur().type == Tok::kVarEnd || cur().type == Tok::kBlockEnd || is_op(")") ||
          (!items.empty() && (is_name("if") || is_name("in") || is_op("="))))
        break;
      items.push_back(parse_expression(with_condexpr));
    }
    if (items.size() == 1 && !comma) return std::move(items[0]);
    if (items.empty() && !explicit_parens) fail(line, "expected an expression");
    auto t = node(Expr::kTuple, line);
    t->items = std::move(items);
    return t;
  }
  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        const int line = toks[i++].line;
        auto g = node(Expr::kGetattr, line);
        if (cur().type == Tok::kInt) {
          g->type = Expr::kGetitem;
          g->items.push_back(std::move(e));
          g->items.push_back(literal(Value(static_cast<int64_t>(std::stoll(toks[i++].text))), line));
        } else {
          g->name = expect_name();
          g->items.push_back(std::move(e));
        }
        e = std::move(g);
      } else if (is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }
  ExprPtr parse_subscript(ExprPtr e) {
    const int line = toks[i++].line;
    // [a], or a slice [a:b:c] with any part left out
    ExprPtr parts[3];
    int colons = 0;
    while (!is_op("]")) {
      if (is_op(":")) {
        if (++colons > 2) fail(line, "a slice has at most two ':'");
        i++;
        continue;
      }
      if (parts[colons]) fail(line, fmt::format("expected ']' or ':', found {}", describe(cur())));
      parts[colons] = parse_expression();
    }
    i++;
    if (colons == 0) {
      if (!parts[0]) fail(line, "an empty subscript []");
      auto g = node(Expr::kGetitem, line);
      g->items.push_back(std::move(e));
      g->items.push_back(std::move(parts[0]));
      return g;
    }
    auto s = node(Expr::kSlice, line);
    s->items.push_back(std::move(e));
    for (auto& p : parts) s->items.push_back(p ? std::move(p) : literal(Value::none(), line));
    return s;
  }
  // Arguments `(a, b, key=c)` into n->items and n->keywords.
  void parse_args(Expr& n) {
    expect_op("(");
    for (bool first = true; !is_op(")"); first = false) {
      if (!first) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*") || is_op("**")) fail(cur().line, "*args and **kwargs in a call are not supported");
      if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().text == "=") {
        n.keywords.push_back(toks[i].text);
        i += 2;
        n.items.push_back(parse_expression());
      } else {
        if (!n.keywords.empty()) fail(cur().line, "a positional argument follows a keyword argument");
        n.items.push_back(parse_expression());
      }
    }
    i++;
  }
  ExprPtr parse_call(ExprPtr callee) {
    auto c = node(Expr::kCall, cur().line);
    c->items.push_back(std::move(callee));
    parse_args(*c);
    return c;
  }
  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        const int line = toks[i++].line;
        auto f = node(Expr::kFilter, line);
        f->name = expect_name();
        while (is_op(".")) {
          i++;
          f->name += '.';
          f->name += expect_name();  // (not "." + name: GCC 12 warns falsely of an overlapping copy at -O1)
        }
        f->items.push_back(std::move(e));
        if (is_op("(")) parse_args(*f);
        e = std::move(f);
      } else if (is_name("is")) {
        const int line = toks[i++].line;
        auto t = node(Expr::kTest, line);
        if (is_name("not")) {
          i++;
          t->negated = true;
        }
        t->name = expect_name();
        t->items.push_back(std::move(e));
        if (is_op("(")) {
          parse_args(*t);
        } else if ((cur().type == Tok::kName || cur().type == Tok::kString || cur().type == Tok::kInt ||
                    cur().type == Tok::kFloat || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          t->items.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  // Statements.
  std::vector<std::string> parse_targets(const char* what) {
    std::vector<std::string> names;
    const bool parens = is_op("(");
    if (parens) i++;
    do {
      if (!names.empty()) i++;
      if (cur().type != Tok::kName) fail(cur().line, fmt::format("expected a name to {}, found {}", what, describe(cur())));
      names.push_back(toks[i++].text);
    } while (is_op(","));
    if (parens) expect_op(")");
    return names;
  }

  // Nodes until a block tag whose name is in `ends` (left unread) or the end of the template.
  Body parse_body(const std::set<std::string>& ends) {
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::kEof) {
        if (!ends.empty()) {
          const auto end = std::find_if(ends.begin(), ends.end(), [](const std::string& e) { return e.rfind("end", 0) == 0; });
          fail(t.line, fmt::format("the template ends inside a block: expected {{% {} %}}", *end));
        }
        return body;
      }
      if (t.type == Tok::kData) {
        auto n = std::make_unique<Node>();
        n->type = Node::kText;
        n->text = t.text;
        n->line = t.line;
        body.push_back(std::move(n));
        i++;
        continue;
      }
      if (t.type == Tok::kVarBegin) {
        i++;
        auto n = std::make_unique<Node>();
        n->type = Node::kOutput;
        n->line = t.line;
        n->exprs.push_back(parse_tuple());
        expect(Tok::kVarEnd, "'}}'");
        body.push_back(std::move(n));
        continue;
      }
      if (t.type != Tok::kBlockBegin) fail(t.line, fmt::format("unexpected {}", describe(t)));
      const Token& tag = peek();
      if (tag.type == Tok::kName && ends.count(tag.text)) return body;
      i++;
      body.push_back(parse_statement());
    }
  }

  void end_tag(const char* name) {
    expect(Tok::kBlockBegin, "'{%'");
    if (!is_name(name)) fail(cur().line, fmt::format("expected {{% {} %}}, found {}", name, describe(cur())));
    i++;
    expect(Tok::kBlockEnd, "'%}'");
  }

  std::unique_ptr<Node> parse_statement() {
    const int line = cur().line;
    const std::string keyword = expect_name();
    auto n = std::make_unique<Node>();
    n->line = line;
    if (keyword == "if") {
      n->type = Node::kIf;
      n->exprs.push_back(parse_tuple(false));
      expect(Tok::kBlockEnd, "'%}'");
      while (true) {
        n->bodies.push_back(parse_body({"elif", "else", "endif"}));
        i++;  // {%
        const std::string which = expect_name();
        if (which == "elif") {
          n->exprs.push_back(parse_tuple(false));
          expect(Tok::kBlockEnd, "'%}'");
          continue;
        }
        expect(Tok::kBlockEnd, "'%}'");
        if (which == "else") {
          n->bodies.push_back(parse_body({"endif"}));
          end_tag("endif");
        }
        break;
      }
    } else if (keyword == "for") {
      n->type = Node::kFor;
      n->targets = parse_targets("loop over");
      if (!is_name("in")) fail(cur().line, fmt::format("expected 'in', found {}", describe(cur())));
      i++;
      n->exprs.push_back(parse_tuple(false));
      if (is_name("if")) {
        i++;
        n->exprs.push_back(parse_expression());
      }
      if (is_name("recursive")) fail(cur().line, "recursive loops are not supported");
      expect(Tok::kBlockEnd, "'%}'");
      n->bodies.push_back(parse_body({"else", "endfor"}));
      i++;
      const std::string which = expect_name();
      expect(Tok::kBlockEnd, "'%}'");
      if (which == "else") {
        n->bodies.push_back(parse_body({"endfor"}));
        end_tag("endfor");
      }
    } else if (keyword == "set") {
      if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().text == ".") {
        n->type = Node::kSet;
        n->targets.push_back(toks[i].text);
        i += 2;
        n->text = expect_name();
        expect_op("=");
        n->exprs.push_back(parse_tuple());
      } else {
        n->targets = parse_targets("assign to");
        if (is_op("=")) {
          n->type = Node::kSet;
          i++;
          n->exprs.push_back(parse_tuple());
        } else {
          if (n->targets.size() != 1) fail(line, "a {% set %} block assigns one name");
          if (is_op("|")) fail(cur().line, "a filter on a {% set %} block is not supported");
          n->type = Node::kSetBlock;
          n->text = n->targets[0];
          expect(Tok::kBlockEnd, "'%}'");
          n->bodies.push_back(parse_body({"endset"}));
          end_tag("endset");
          return n;
        }
      }
      expect(Tok::kBlockEnd, "'%}'");
    } else if (keyword == "macro") {
      n->type = Node::kMacro;
      n->text = expect_name();
      expect_op("(");
      bool defaults = false;
      while (!is_op(")")) {
        if (!n->targets.empty()) expect_op(",");
        if (is_op(")")) break;
        n->targets.push_back(expect_name());
        if (is_op("=")) {
          i++;
          n->exprs.push_back(parse_expression());
          defaults = true;
        } else if (defaults) {
          fail(cur().line, "a macro parameter without a default follows one with a default");
        } else {
          n->exprs.push_back(nullptr);
        }
      }
      i++;
      expect(Tok::kBlockEnd, "'%}'");
      n->bodies.push_back(parse_body({"endmacro"}));
      end_tag("endmacro");
    } else if (keyword == "break" || keyword == "continue") {
      n->type = keyword == "break" ? Node::kBreak : Node::kContinue;
      expect(Tok::kBlockEnd, "'%}'");
    } else if (keyword == "generation") {
      // transformers' marker of the assistant's tokens; it renders its body.
      n->type = Node::kGeneration;
      expect(Tok::kBlockEnd, "'%}'");
      n->bodies.push_back(parse_body({"endgeneration"}));
      end_tag("endgeneration");
    } else if (keyword.rfind("end", 0) == 0 || keyword == "elif" || keyword == "else") {
      fail(line, fmt::format("{{% {} %}} without a block to close", keyword));
    } else {
      fail(line, fmt::format("the statement {{% {} %}} is not supported (anvil's Jinja runs if, for, set, macro, "
                             "break, continue and generation)", keyword));
    }
    return n;
  }
};

// --- Evaluation ----------------------------------------------------------------------------------

struct Frame {
  std::unordered_map<std::string, Value> vars;
};

enum class Flow { kNormal, kBreak, kContinue };

constexpr int kMaxDepth = 200;        // nested macro calls
constexpr int64_t kMaxItems = 1 << 24;  // range() and repetition

bool equals(const Value& a, const Value& b);

int compare_values(const Value& a, const Value& b, const std::string& op) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() != Value::Kind::kFloat && b.kind() != Value::Kind::kFloat) return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int();
    return a.as_double() < b.as_double() ? -1 : a.as_double() > b.as_double();
  }
  if (a.is_string() && b.is_string()) return a.str().compare(b.str()) < 0 ? -1 : a.str() == b.str() ? 0 : 1;
  if (a.is_list() && b.is_list()) {
    const List &x = a.list(), &y = b.list();
    for (size_t i = 0; i < std::min(x.size(), y.size()); i++) {
      if (equals(x[i], y[i])) continue;
      return compare_values(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size();
  }
  ANVIL_FAIL("'{}' is not supported between a {} and a {}", op, a.type_name(), b.type_name());
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() != Value::Kind::kFloat && b.kind() != Value::Kind::kFloat) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return true;
    case Value::Kind::kString: return a.str() == b.str();
    case Value::Kind::kList:
      if (a.is_lazy() || b.is_lazy()) return &a.list() == &b.list();
      if (a.is_tuple() != b.is_tuple() || a.list().size() != b.list().size()) return false;
      for (size_t i = 0; i < a.list().size(); i++) if (!equals(a.list()[i], b.list()[i])) return false;
      return true;
    case Value::Kind::kDict:
      if (a.is_namespace() || b.is_namespace()) return &a.dict() == &b.dict();
      if (a.dict().size() != b.dict().size()) return false;
      for (const auto& [k, v] : a.dict()) {
        const Value* w = b.find(k);
        if (!w || !equals(v, *w)) return false;
      }
      return true;
    default: return false;
  }
}

// What `for` walks: a list's items, a dict's keys, a string's characters.
List iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return {};
    case Value::Kind::kList: return v.list();
    case Value::Kind::kDict: {
      ANVIL_CHECK(!v.is_namespace(), "a namespace is not iterable");
      List keys;
      for (const auto& kv : v.dict()) keys.emplace_back(kv.first);
      return keys;
    }
    case Value::Kind::kString: {
      List chars;
      for (char32_t c : code_points(v.str())) chars.emplace_back(utf8(std::u32string(1, c)));
      return chars;
    }
    default: ANVIL_FAIL("a {} is not iterable", v.type_name());
  }
}

bool contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    ANVIL_CHECK(item.is_string(), "'in <string>' needs a string on the left, not a {}", item.type_name());
    return container.str().find(item.str()) != std::string::npos;
  }
  if (container.is_dict()) return item.is_string() && container.find(item.str()) != nullptr;
  if (container.is_list() || container.is_undefined()) {
    for (const Value& v : iterate(container)) if (equals(v, item)) return true;
    return false;
  }
  ANVIL_FAIL("'in' needs a string, list or dict on the right, not a {}", container.type_name());
}

int64_t length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return 0;
    case Value::Kind::kString: return static_cast<int64_t>(code_points(v.str()).size());
    case Value::Kind::kList: if (!v.is_lazy()) return static_cast<int64_t>(v.list().size()); break;
    case Value::Kind::kDict: if (!v.is_namespace()) return static_cast<int64_t>(v.dict().size()); break;
    default: break;
  }
  ANVIL_FAIL("a {} has no length", v.type_name());
}

// Python's index rules: negative from the end; out of range is undefined (Jinja's getitem).
Value item_at(const Value& seq, int64_t index) {
  if (seq.is_list()) {
    const int64_t n = static_cast<int64_t>(seq.list().size());
    if (index < 0) index += n;
    if (index < 0 || index >= n) return Value::undefined(fmt::format("list index {} out of range", index));
    return seq.list()[index];
  }
  const std::u32string cp = code_points(seq.str());
  const int64_t n = static_cast<int64_t>(cp.size());
  if (index < 0) index += n;
  if (index < 0 || index >= n) return Value::undefined(fmt::format("string index {} out of range", index));
  return Value(utf8(cp.substr(index, 1)));
}

Value slice(const Value& seq, const Value& start_v, const Value& stop_v, const Value& step_v) {
  auto as_index = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    ANVIL_CHECK(v.kind() == Value::Kind::kInt || v.kind() == Value::Kind::kBool, "a slice's {} must be an integer, not a {}",
                what, v.type_name());
    return v.as_int();
  };
  const int64_t step = as_index(step_v, "step").value_or(1);
  ANVIL_CHECK(step != 0, "a slice's step cannot be zero");
  const bool is_string = seq.is_string();
  ANVIL_CHECK(is_string || seq.is_list(), "a {} cannot be sliced", seq.type_name());
  const std::u32string cp = is_string ? code_points(seq.str()) : std::u32string();
  const int64_t n = is_string ? static_cast<int64_t>(cp.size()) : static_cast<int64_t>(seq.list().size());
  auto clamp = [&](std::optional<int64_t> v, int64_t fallback) {
    if (!v) return fallback;
    int64_t x = *v < 0 ? *v + n : *v;
    if (step > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t start = clamp(as_index(start_v, "start"), step > 0 ? 0 : n - 1);
  const int64_t stop = clamp(as_index(stop_v, "stop"), step > 0 ? n : -1);
  std::u32string s;
  List l;
  for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
    if (is_string) s.push_back(cp[k]); else l.push_back(seq.list()[k]);
  }
  return is_string ? Value(utf8(s)) : Value(std::move(l));
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

Value require_string(const Value& v, const std::string& what) {
  ANVIL_CHECK(v.is_string(), "{} needs a string, not a {}", what, v.type_name());
  return v;
}

// Python's str.split(sep, maxsplit) and str.rsplit.
Value split(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right) {
  List parts;
  if (sep.is_none()) {
    std::u32string cp = code_points(s);
    std::vector<std::pair<size_t, size_t>> words;
    for (size_t i = 0; i < cp.size();) {
      while (i < cp.size() && python_isspace(cp[i])) i++;
      if (i >= cp.size()) break;
      size_t e = i;
      while (e < cp.size() && !python_isspace(cp[e])) e++;
      words.emplace_back(i, e);
      i = e;
    }
    if (maxsplit >= 0 && static_cast<int64_t>(words.size()) > maxsplit + 1) {
      if (from_right) {
        const size_t keep = words.size() - maxsplit;
        size_t b = 0;
        while (python_isspace(cp[b])) b++;
        parts.emplace_back(utf8(cp.substr(b, words[keep - 1].second - b)));
        for (size_t k = keep; k < words.size(); k++) parts.emplace_back(utf8(cp.substr(words[k].first, words[k].second - words[k].first)));
        return Value(std::move(parts));
      }
      for (int64_t k = 0; k < maxsplit; k++) parts.emplace_back(utf8(cp.substr(words[k].first, words[k].second - words[k].first)));
      size_t e = cp.size();
      while (e > 0 && python_isspace(cp[e - 1])) e--;
      parts.emplace_back(utf8(cp.substr(words[maxsplit].first, e - words[maxsplit].first)));
      return Value(std::move(parts));
    }
    for (auto [b, e] : words) parts.emplace_back(utf8(cp.substr(b, e - b)));
    return Value(std::move(parts));
  }
  const std::string d = require_string(sep, "split's separator").str();
  ANVIL_CHECK(!d.empty(), "split: an empty separator");
  std::vector<std::string> pieces;
  size_t b = 0;
  while (true) {
    const size_t e = s.find(d, b);
    if (e == std::string::npos) break;
    pieces.push_back(s.substr(b, e - b));
    b = e + d.size();
  }
  pieces.push_back(s.substr(b));
  const int64_t cuts = static_cast<int64_t>(pieces.size()) - 1;
  if (maxsplit >= 0 && cuts > maxsplit) {
    std::vector<std::string> joined;
    if (from_right) {
      const size_t first = pieces.size() - maxsplit;
      std::string head = pieces[0];
      for (size_t k = 1; k < first; k++) head += d + pieces[k];
      joined.push_back(head);
      for (size_t k = first; k < pieces.size(); k++) joined.push_back(pieces[k]);
    } else {
      for (int64_t k = 0; k < maxsplit; k++) joined.push_back(pieces[k]);
      std::string tail = pieces[maxsplit];
      for (size_t k = maxsplit + 1; k < pieces.size(); k++) tail += d + pieces[k];
      joined.push_back(tail);
    }
    pieces = std::move(joined);
  }
  for (auto& p : pieces) parts.emplace_back(std::move(p));
  return Value(std::move(parts));
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` around every character.
    const std::u32string cp = code_points(s);
    int64_t done = 0;
    for (size_t i = 0; i <= cp.size(); i++) {
      if (count < 0 || done < count) { out += to; done++; }
      if (i < cp.size()) out += utf8(cp.substr(i, 1));
    }
    return out;
  }
  size_t b = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t e = s.find(from, b);
    if (e == std::string::npos) break;
    out += s.substr(b, e - b) + to;
    b = e + from.size();
    done++;
  }
  return out + s.substr(b);
}

class Renderer {
 public:
  Renderer(const std::string& name, const Dict& globals, const nlohmann::ordered_json& variables) : name_(name) {
    frames_.push_back(std::make_shared<Frame>());
    Frame& g = *frames_.back();
    add_builtins(g);
    for (const auto& [k, v] : globals) g.vars[k] = v;
    for (auto it = variables.begin(); it != variables.end(); ++it) g.vars[it.key()] = Value::from_json(it.value());
    frames_.push_back(std::make_shared<Frame>());  // the template's own assignments
  }

  ~Renderer() {
    for (const auto& f : closed_over_) f->vars.clear();
    for (const Value& ns : namespaces_) ns.mutable_dict().clear();
  }
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;

  std::string run(const Body& body) {
    std::string out;
    render(body, out);
    return out;
  }

 private:
  std::string name_;
  std::vector<std::shared_ptr<Frame>> frames_;
  // What can hold itself: a macro holds the scopes it was defined in, which hold the macro; a
  // namespace can be set as its own attribute. Emptied when the rendering ends, so that no such
  // cycle outlives it.
  std::vector<std::shared_ptr<Frame>> closed_over_;
  std::vector<Value> namespaces_;
  int depth_ = 0;
  int line_ = 0;

  [[noreturn]] void fail(int line, const std::string& msg) const { ANVIL_FAIL("{} line {}: {}", name_, line, msg); }

  Value lookup(const std::string& n) const {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
      auto f = (*it)->vars.find(n);
      if (f != (*it)->vars.end()) return f->second;
    }
    return Value::undefined(fmt::format("'{}' is undefined", n));
  }
  void assign(const std::string& n, Value v) { frames_.back()->vars[n] = std::move(v); }

  void assign_targets(const std::vector<std::string>& targets, const Value& v, int line) {
    if (targets.size() == 1) {
      assign(targets[0], v);
      return;
    }
    const List items = iterate(v);
    if (items.size() != targets.size())
      fail(line, fmt::format("cannot unpack {} value(s) into {} names", items.size(), targets.size()));
    for (size_t k = 0; k < targets.size(); k++) assign(targets[k], items[k]);
  }

  // --- statements ---
  Flow render(const Body& body, std::string& out) {
    for (const auto& n : body) {
      const Flow f = render(*n, out);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  Flow render(const Node& n, std::string& out) {
    line_ = n.line;
    switch (n.type) {
      case Node::kText: out += n.text; return Flow::kNormal;
      case Node::kOutput: out += eval(*n.exprs[0]).to_string(); return Flow::kNormal;
      case Node::kIf:
        for (size_t k = 0; k < n.exprs.size(); k++)
          if (eval(*n.exprs[k]).truthy()) return render(n.bodies[k], out);
        if (n.bodies.size() > n.exprs.size()) return render(n.bodies.back(), out);
        return Flow::kNormal;
      case Node::kFor: return render_for(n, out);
      case Node::kSet: {
        Value v = eval(*n.exprs[0]);
        if (!n.text.empty()) {
          const Value ns = lookup(n.targets[0]);
          if (!ns.is_namespace()) fail(n.line, fmt::format("cannot assign an attribute of '{}': it is not a namespace()", n.targets[0]));
          Dict& d = ns.mutable_dict();
          for (auto& [k, x] : d) {
            if (k == n.text) {
              x = std::move(v);
              return Flow::kNormal;
            }
          }
          d.emplace_back(n.text, std::move(v));
          return Flow::kNormal;
        }
        assign_targets(n.targets, v, n.line);
        return Flow::kNormal;
      }
      case Node::kSetBlock: {
        std::string captured;
        render(n.bodies[0], captured);
        assign(n.text, Value(captured));
        return Flow::kNormal;
      }
      case Node::kMacro: assign(n.text, macro(n)); return Flow::kNormal;
      case Node::kBreak: return Flow::kBreak;
      case Node::kContinue: return Flow::kContinue;
      case Node::kGeneration: return render(n.bodies[0], out);
    }
    return Flow::kNormal;
  }

  Flow render_for(const Node& n, std::string& out) {
    const Value iterable = eval(*n.exprs[0]);
    if (iterable.is_none()) fail(n.line, "cannot loop over none");
    List items = iterate(iterable);
    // Each iteration has a scope of its own: what the body sets neither outlives the loop nor
    // reaches the next iteration (Jinja's semantics).
    frames_.push_back(std::make_shared<Frame>());
    if (n.exprs.size() > 1) {
      List kept;
      for (const Value& v : items) {
        assign_targets(n.targets, v, n.line);
        if (eval(*n.exprs[1]).truthy()) kept.push_back(v);
      }
      items = std::move(kept);
    }
    const int64_t count = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < count; k++) {
      frames_.back() = std::make_shared<Frame>();
      assign_targets(n.targets, items[k], n.line);
      Dict loop{{"index", Value(k + 1)},
                {"index0", Value(k)},
                {"revindex", Value(count - k)},
                {"revindex0", Value(count - k - 1)},
                {"first", Value(k == 0)},
                {"last", Value(k == count - 1)},
                {"length", Value(count)},
                {"depth", Value(int64_t{1})},
                {"depth0", Value(int64_t{0})},
                {"previtem", k > 0 ? items[k - 1] : Value::undefined("there is no previous item")},
                {"nextitem", k + 1 < count ? items[k + 1] : Value::undefined("there is no next item")}};
        loop.emplace_back("cycle", Value::function("loop.cycle", [k](Args& a) {
          ANVIL_CHECK(!a.positional.empty(), "loop.cycle needs at least one value");
          a.used_positional.assign(a.positional.size(), true);
          a.done();
          return a.positional[k % a.positional.size()];
        }));
      assign("loop", Value(std::move(loop)));
      const Flow f = render(n.bodies[0], out);
      if (f == Flow::kBreak) break;
    }
    if (count == 0 && n.bodies.size() > 1) render(n.bodies[1], out);
    frames_.pop_back();
    return Flow::kNormal;
  }

  Value macro(const Node& n) {
    // A macro sees the scope it was defined in (a closure, as in Jinja) and its arguments; a
    // default is evaluated there, after the parameters before it.
    const std::vector<std::shared_ptr<Frame>> defined_in = frames_;
    closed_over_.insert(closed_over_.end(), frames_.begin(), frames_.end());
    return Value::function(n.text, [this, &n, defined_in](Args& a) {
      a.callee = "macro '" + n.text + "'";
      auto frame = std::make_shared<Frame>();
      std::vector<std::shared_ptr<Frame>> scope = defined_in;
      scope.push_back(frame);
      for (size_t k = 0; k < n.targets.size(); k++) {
        const Value missing = Value::undefined(fmt::format("'{}' is undefined", n.targets[k]));
        Value v = a.take(k, n.targets[k], missing);
        const bool given = k < a.positional.size() ||
                           std::any_of(a.keyword.begin(), a.keyword.end(), [&](const auto& kw) { return kw.first == n.targets[k]; });
        if (!given && n.exprs[k]) {
          std::swap(scope, frames_);
          try {
            v = eval(*n.exprs[k]);
          } catch (...) {
            std::swap(scope, frames_);
            throw;
          }
          std::swap(scope, frames_);
        }
        frame->vars[n.targets[k]] = v;
      }
      a.done();
      if (++depth_ > kMaxDepth) fail(n.line, "macros nest deeper than 200 calls");
      std::vector<std::shared_ptr<Frame>> saved = std::move(scope);
      std::swap(saved, frames_);
      std::string out;
      try {
        render(n.bodies[0], out);
      } catch (...) {
        std::swap(saved, frames_);
        depth_--;
        throw;
      }
      std::swap(saved, frames_);
      depth_--;
      return Value(out);
    });
  }

  // --- expressions ---
  Value eval(const Expr& e) {
    try {
      return eval_inner(e);
    } catch (const Error& err) {
      const std::string what = err.what();
      if (what.rfind(name_, 0) == 0) throw;
      fail(e.line, what);
    }
  }

  Args args_of(const Expr& e, size_t first, const std::string& callee) {
    Args a;
    a.callee = callee;
    const size_t positional = e.items.size() - first - e.keywords.size();
    for (size_t k = 0; k < positional; k++) a.positional.push_back(eval(*e.items[first + k]));
    for (size_t k = 0; k < e.keywords.size(); k++)
      a.keyword.emplace_back(e.keywords[k], eval(*e.items[first + positional + k]));
    return a;
  }

  Value eval_inner(const Expr& e) {
    switch (e.type) {
      case Expr::kLiteral: return e.literal;
      case Expr::kName: return lookup(e.name);
      case Expr::kList:
      case Expr::kTuple: {
        List l;
        for (const auto& x : e.items) l.push_back(eval(*x));
        return Value(std::move(l), e.type == Expr::kTuple);
      }
      case Expr::kDict: {
        Dict d;
        for (size_t k = 0; k < e.items.size(); k += 2) {
          const Value key = eval(*e.items[k]);
          ANVIL_CHECK(key.is_string(), "dict keys must be strings here, not a {}", key.type_name());
          Value v = eval(*e.items[k + 1]);
          bool replaced = false;
          for (auto& kv : d) if (kv.first == key.str()) { kv.second = v; replaced = true; }
          if (!replaced) d.emplace_back(key.str(), std::move(v));
        }
        return Value(std::move(d));
      }
      case Expr::kGetattr: return getattr(eval(*e.items[0]), e.name);
      case Expr::kGetitem: return getitem(eval(*e.items[0]), eval(*e.items[1]));
      case Expr::kSlice: {
        const Value seq = eval(*e.items[0]);
        ANVIL_CHECK(!seq.is_undefined(), "{}", seq.name());
        return slice(seq, eval(*e.items[1]), eval(*e.items[2]), eval(*e.items[3]));
      }
      case Expr::kCall: {
        const Value f = eval(*e.items[0]);
        if (f.is_undefined()) ANVIL_FAIL("{} (called as a function)", f.name());
        ANVIL_CHECK(f.is_function(), "a {} is not callable", f.type_name());
        Args a = args_of(e, 1, "'" + f.name() + "'");
        return f.call(a);
      }
      case Expr::kFilter: {
        const Value v = eval(*e.items[0]);
        Args a = args_of(e, 1, "filter '" + e.name + "'");
        return filter(e.name, v, a);
      }
      case Expr::kTest: {
        const Value v = eval(*e.items[0]);
        Args a = args_of(e, 1, "test '" + e.name + "'");
        return Value(test(e.name, v, a) != e.negated);
      }
      case Expr::kNeg:
      case Expr::kPos: {
        const Value v = eval(*e.items[0]);
        ANVIL_CHECK(v.is_number(), "unary '{}' needs a number, not a {}", e.type == Expr::kNeg ? '-' : '+', v.type_name());
        if (e.type == Expr::kPos) return v.kind() == Value::Kind::kBool ? Value(v.as_int()) : v;
        return v.kind() == Value::Kind::kFloat ? Value(-v.as_double()) : Value(-v.as_int());
      }
      case Expr::kNot: return Value(!eval(*e.items[0]).truthy());
      case Expr::kAnd: {
        Value l = eval(*e.items[0]);
        return l.truthy() ? eval(*e.items[1]) : l;
      }
      case Expr::kOr: {
        Value l = eval(*e.items[0]);
        return l.truthy() ? l : eval(*e.items[1]);
      }
      case Expr::kConcat: {
        std::string s;
        for (const auto& x : e.items) s += eval(*x).to_string();
        return Value(s);
      }
      case Expr::kCond: {
        if (eval(*e.items[0]).truthy()) return eval(*e.items[1]);
        if (e.items.size() > 2) return eval(*e.items[2]);
        return Value::undefined("the inline if's condition was false and it has no else");
      }
      case Expr::kCompare: {
        Value left = eval(*e.items[0]);
        for (size_t k = 0; k < e.ops.size(); k++) {
          Value right = eval(*e.items[k + 1]);
          const std::string& op = e.ops[k];
          bool r;
          if (op == "==") r = equals(left, right);
          else if (op == "!=") r = !equals(left, right);
          else if (op == "in") r = contains(right, left);
          else if (op == "not in") r = !contains(right, left);
          else {
            const int c = compare_values(left, right, op);
            r = op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0;
          }
          if (!r) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case Expr::kBinary: return arithmetic(e.name, eval(*e.items[0]), eval(*e.items[1]));
    }
    return Value();
  }

  static Value arithmetic(const std::string& op, const Value& a, const Value& b) {
    ANVIL_CHECK(!a.is_undefined(), "{} (used with '{}')", a.name(), op);
    ANVIL_CHECK(!b.is_undefined(), "{} (used with '{}')", b.name(), op);
    const bool ints = a.is_number() && b.is_number() && a.kind() != Value::Kind::kFloat && b.kind() != Value::Kind::kFloat;
    if (op == "+") {
      if (a.is_string() && b.is_string()) return Value(a.str() + b.str());
      if (a.is_list() && b.is_list() && !a.is_lazy() && !b.is_lazy() && a.is_tuple() == b.is_tuple()) {
        List l = a.list();
        l.insert(l.end(), b.list().begin(), b.list().end());
        return Value(std::move(l), a.is_tuple());
      }
    }
    if (op == "*" && (a.is_string() || a.is_list() || b.is_string() || b.is_list())) {
      const Value& seq = (a.is_string() || a.is_list()) ? a : b;
      const Value& times = (a.is_string() || a.is_list()) ? b : a;
      ANVIL_CHECK(times.kind() == Value::Kind::kInt || times.kind() == Value::Kind::kBool,
                  "a {} can be repeated by an integer, not a {}", seq.type_name(), times.type_name());
      const int64_t n = std::max<int64_t>(0, times.as_int());
      ANVIL_CHECK(n * std::max<int64_t>(1, length(seq)) <= kMaxItems, "a repetition of more than {} items", kMaxItems);
      if (seq.is_string()) {
        std::string s;
        for (int64_t k = 0; k < n; k++) s += seq.str();
        return Value(s);
      }
      List l;
      for (int64_t k = 0; k < n; k++) l.insert(l.end(), seq.list().begin(), seq.list().end());
      return Value(std::move(l));
    }
    ANVIL_CHECK(a.is_number() && b.is_number(), "'{}' is not supported between a {} and a {}", op, a.type_name(), b.type_name());
    if (op == "+") return ints ? Value(a.as_int() + b.as_int()) : Value(a.as_double() + b.as_double());
    if (op == "-") return ints ? Value(a.as_int() - b.as_int()) : Value(a.as_double() - b.as_double());
    if (op == "*") return ints ? Value(a.as_int() * b.as_int()) : Value(a.as_double() * b.as_double());
    if (op == "/") {
      ANVIL_CHECK(b.as_double() != 0, "division by zero");
      return Value(a.as_double() / b.as_double());
    }
    if (op == "//" || op == "%") {
      if (ints) {
        ANVIL_CHECK(b.as_int() != 0, "integer division or modulo by zero");
        int64_t q = a.as_int() / b.as_int(), r = a.as_int() % b.as_int();
        if (r != 0 && ((r < 0) != (b.as_int() < 0))) {
          q--;
          r += b.as_int();
        }
        return op == "//" ? Value(q) : Value(r);
      }
      ANVIL_CHECK(b.as_double() != 0, "float division or modulo by zero");
      const double q = std::floor(a.as_double() / b.as_double());
      return op == "//" ? Value(q) : Value(a.as_double() - q * b.as_double());
    }
    if (op == "**") {
      if (ints && b.as_int() >= 0) {
        int64_t r = 1;
        for (int64_t k = 0; k < b.as_int(); k++) r *= a.as_int();
        return Value(r);
      }
      return Value(std::pow(a.as_double(), b.as_double()));
    }
    ANVIL_FAIL("unknown operator '{}'", op);
  }

  // Jinja's getattr: the object's attribute (a method), else its item; getitem the other way round.
  Value getattr(const Value& obj, const std::string& attr) {
    ANVIL_CHECK(!obj.is_undefined(), "{} (reading its attribute '{}')", obj.name(), attr);
    // Python's own attributes (__class__, ...) are what the sandbox guards; a dict's item named
    // with an underscore is an item like any other.
    ANVIL_CHECK(attr.rfind("__", 0) != 0, "access to the attribute '{}' is unsafe", attr);
    if (Value m = method(obj, attr); !m.is_undefined()) return m;
    if (obj.is_dict()) {
      if (const Value* v = obj.find(attr)) return *v;
    }
    return Value::undefined(fmt::format("'{}' has no attribute '{}'", obj.type_name(), attr));
  }

  Value getitem(const Value& obj, const Value& key) {
    ANVIL_CHECK(!obj.is_undefined(), "{} (reading its item {})", obj.name(), key.repr());
    if (obj.is_dict() && !obj.is_namespace() && key.is_string()) {
      if (const Value* v = obj.find(key.str())) return *v;
    }
    if (((obj.is_list() && !obj.is_lazy()) || obj.is_string()) &&
        (key.kind() == Value::Kind::kInt || key.kind() == Value::Kind::kBool))
      return item_at(obj, key.as_int());
    if (key.is_string()) return getattr(obj, key.str());
    return Value::undefined(fmt::format("'{}' has no item {}", obj.type_name(), key.repr()));
  }

  // Python's methods of str, dict and list that templates call (the sandbox forbids mutation).
  Value method(const Value& obj, const std::string& m) {
    const std::string callee = "method '" + m + "' of " + obj.type_name();
    auto bind = [&](std::function<Value(Args&)> f) {
      return Value::function(callee, [f = std::move(f), callee](Args& a) {
        a.callee = callee;
        Value r = f(a);
        a.done();
        return r;
      });
    };
    if (obj.is_string()) {
      const std::string s = obj.str();
      if (m == "startswith" || m == "endswith") {
        const bool start = m == "startswith";
        return bind([s, start](Args& a) {
          const Value p = a.take(0, "prefix", Value::none(), true);
          List options = p.is_list() ? p.list() : List{p};
          for (const Value& o : options) {
            const std::string x = require_string(o, start ? "startswith" : "endswith").str();
            if (start ? s.rfind(x, 0) == 0 : (s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0))
              return Value(true);
          }
          return Value(false);
        });
      }
      if (m == "strip" || m == "lstrip" || m == "rstrip") {
        return bind([s, m](Args& a) {
          return Value(strip(s, a.take(0, "chars"), m != "rstrip", m != "lstrip"));
        });
      }
      if (m == "split" || m == "rsplit") {
        return bind([s, m](Args& a) {
          const Value sep = a.take(0, "sep");
          const Value maxsplit = a.take(1, "maxsplit", Value(int64_t{-1}));
          return split(s, sep, maxsplit.as_int(), m == "rsplit");
        });
      }
      if (m == "splitlines") {
        return bind([s](Args& a) {
          const bool keepends = a.take(0, "keepends", Value(false)).truthy();
          List lines;
          size_t b = 0;
          for (size_t k = 0; k < s.size(); k++) {
            if (s[k] == '\n' || s[k] == '\r') {
              size_t e = k + (s[k] == '\r' && k + 1 < s.size() && s[k + 1] == '\n' ? 1 : 0);
              lines.emplace_back(s.substr(b, (keepends ? e + 1 : k) - b));
              k = e;
              b = e + 1;
            }
          }
          if (b < s.size()) lines.emplace_back(s.substr(b));
          return Value(std::move(lines));
        });
      }
      if (m == "upper" || m == "lower") return bind([s, m](Args&) { return Value(case_map(s, m == "upper")); });
      if (m == "title" || m == "capitalize")
        return bind([s, m](Args&) { return Value(m == "title" ? title_case(s, false) : title_case(case_map(s, false), true)); });
      if (m == "replace") {
        return bind([s](Args& a) {
          const std::string from = require_string(a.take(0, "old", Value::none(), true), "replace").str();
          const std::string to = require_string(a.take(1, "new", Value::none(), true), "replace").str();
          return Value(replace_all(s, from, to, a.take(2, "count", Value(int64_t{-1})).as_int()));
        });
      }
      if (m == "find" || m == "rfind" || m == "count") {
        return bind([s, m](Args& a) {
          const std::string x = require_string(a.take(0, "sub", Value::none(), true), m).str();
          if (m == "count") {
            if (x.empty()) return Value(static_cast<int64_t>(code_points(s).size()) + 1);
            int64_t c = 0;
            for (size_t p = s.find(x); p != std::string::npos; p = s.find(x, p + x.size())) c++;
            return Value(c);
          }
          const size_t p = m == "find" ? s.find(x) : s.rfind(x);
          return Value(p == std::string::npos ? int64_t{-1} : static_cast<int64_t>(code_points(s.substr(0, p)).size()));
        });
      }
      if (m == "join") {
        return bind([s](Args& a) {
          std::string out;
          const List items = iterate(a.take(0, "iterable", Value::none(), true));
          for (size_t k = 0; k < items.size(); k++) {
            ANVIL_CHECK(items[k].is_string(), "join: item {} is a {}, not a string", k, items[k].type_name());
            out += (k ? s : "") + items[k].str();
          }
          return Value(out);
        });
      }
      if (m == "isdigit" || m == "isalpha" || m == "isalnum" || m == "isspace" || m == "islower" || m == "isupper") {
        return bind([s, m](Args&) {
          const std::u32string cp = code_points(s);
          if (cp.empty()) return Value(false);
          bool cased = false;
          for (char32_t c : cp) {
            bool ok;
            if (m == "isdigit") ok = u_isdigit(c);
            else if (m == "isalpha") ok = u_isalpha(c);
            else if (m == "isalnum") ok = u_isalnum(c);
            else if (m == "isspace") ok = python_isspace(c);
            else {
              const bool lower = u_islower(c), upper = u_isupper(c);
              cased |= lower || upper;
              ok = m == "islower" ? !upper : !lower;
            }
            if (!ok) return Value(false);
          }
          return Value(m == "islower" || m == "isupper" ? cased : true);
        });
      }
      return Value();
    }
    if (obj.is_dict() && !obj.is_namespace()) {
      if (m == "items" || m == "keys" || m == "values") {
        return bind([obj, m](Args&) {
          List l;
          for (const auto& [k, v] : obj.dict()) {
            if (m == "items") l.emplace_back(List{Value(k), v}, true);
            else if (m == "keys") l.emplace_back(k);
            else l.push_back(v);
          }
          return Value(std::move(l));
        });
      }
      if (m == "get") {
        return bind([obj](Args& a) {
          const Value key = a.take(0, "key", Value::none(), true);
          const Value fallback = a.take(1, "default");
          const Value* v = key.is_string() ? obj.find(key.str()) : nullptr;
          return v ? *v : fallback;
        });
      }
      if (m == "pop" || m == "update" || m == "setdefault" || m == "clear" || m == "popitem")
        ANVIL_FAIL("the dict method '{}' modifies the dict, which the chat template sandbox forbids", m);
      return Value();
    }
    if (obj.is_list()) {
      if (m == "index" || m == "count") {
        return bind([obj, m](Args& a) {
          const Value x = a.take(0, "value", Value::none(), true);
          int64_t c = 0;
          for (size_t k = 0; k < obj.list().size(); k++) {
            if (!equals(obj.list()[k], x)) continue;
            if (m == "index") return Value(static_cast<int64_t>(k));
            c++;
          }
          ANVIL_CHECK(m == "count", "list.index: {} is not in the list", x.repr());
          return Value(c);
        });
      }
      if (m == "append" || m == "extend" || m == "insert" || m == "pop" || m == "remove" || m == "sort" ||
          m == "reverse" || m == "clear")
        ANVIL_FAIL("the list method '{}' modifies the list, which the chat template sandbox forbids", m);
    }
    return Value();
  }

  // An attribute path ("a.b.0") of selectattr, map and sort.
  Value attribute_path(const Value& obj, const std::string& path) {
    Value v = obj;
    size_t b = 0;
    while (true) {
      const size_t e = path.find('.', b);
      const std::string part = path.substr(b, e == std::string::npos ? std::string::npos : e - b);
      const bool digits = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
      v = digits ? getitem(v, Value(static_cast<int64_t>(std::stoll(part)))) : getitem(v, Value(part));
      if (e == std::string::npos) return v;
      b = e + 1;
    }
  }

  bool test(const std::string& t, const Value& v, Args& a) {
    auto arg = [&](const char* key) { return a.take(0, key, Value::none(), true); };
    bool r;
    if (t == "defined") r = !v.is_undefined();
    else if (t == "undefined") r = v.is_undefined();
    else if (t == "none") r = v.is_none();
    else if (t == "boolean") r = v.kind() == Value::Kind::kBool;
    else if (t == "true") r = v.kind() == Value::Kind::kBool && v.as_bool();
    else if (t == "false") r = v.kind() == Value::Kind::kBool && !v.as_bool();
    else if (t == "integer") r = v.kind() == Value::Kind::kInt;
    else if (t == "float") r = v.kind() == Value::Kind::kFloat;
    else if (t == "number") r = v.is_number();
    else if (t == "string") r = v.is_string();
    else if (t == "mapping") r = v.is_dict() && !v.is_namespace();
    else if (t == "iterable") r = v.is_string() || v.is_list() || (v.is_dict() && !v.is_namespace()) || v.is_undefined();
    else if (t == "sequence") r = v.is_string() || (v.is_list() && !v.is_lazy()) || (v.is_dict() && !v.is_namespace()) || v.is_undefined();
    else if (t == "callable") r = v.is_function();
    else if (t == "odd" || t == "even") {
      ANVIL_CHECK(v.is_number(), "test '{}' needs a number, not a {}", t, v.type_name());
      const Value rest = arithmetic("%", v, Value(int64_t{2}));
      r = (rest.as_double() != 0) == (t == "odd");
    } else if (t == "divisibleby") {
      const Value d = arg("num");
      ANVIL_CHECK(d.as_int() != 0, "test 'divisibleby' by zero");
      r = v.as_int() % d.as_int() == 0;
    } else if (t == "lower" || t == "upper") {
      // Python's str.islower()/isupper(): some cased character, none of the other case.
      bool cased = false, other = false;
      for (char32_t c : code_points(v.to_string())) {
        const bool lower = u_islower(static_cast<UChar32>(c)), upper = u_isupper(static_cast<UChar32>(c));
        cased |= lower || upper;
        other |= t == "lower" ? upper : lower;
      }
      r = cased && !other;
    } else if (t == "eq" || t == "equalto" || t == "==") r = equals(v, arg("other"));
    else if (t == "ne" || t == "!=") r = !equals(v, arg("other"));
    else if (t == "lt" || t == "lessthan" || t == "<") r = compare_values(v, arg("other"), "<") < 0;
    else if (t == "le" || t == "<=") r = compare_values(v, arg("other"), "<=") <= 0;
    else if (t == "gt" || t == "greaterthan" || t == ">") r = compare_values(v, arg("other"), ">") > 0;
    else if (t == "ge" || t == ">=") r = compare_values(v, arg("other"), ">=") >= 0;
    else if (t == "in") r = contains(arg("seq"), v);
    else if (t == "sameas") {
      const Value o = arg("other");
      // Python's `is`: containers by identity; None, booleans, (small) numbers and strings by value.
      if (v.kind() != o.kind()) r = false;
      else if (v.is_dict()) r = &v.dict() == &o.dict();
      else if (v.is_list()) r = &v.list() == &o.list();
      else r = equals(v, o);
    } else if (t == "escaped") r = false;
    else ANVIL_FAIL("the test '{}' is not supported (anvil's Jinja has Jinja's standard tests)", t);
    a.done();
    return r;
  }

  Value filter(const std::string& f, const Value& v, Args& a) {
    Value r = filter_inner(f, v, a);
    a.done();
    return r;
  }

  // `select`/`reject` and their attribute forms: which items pass the named test (or are truthy).
  List select(const Value& v, Args& a, bool by_attribute, bool keep) {
    std::string attr;
    size_t first = 0;
    if (by_attribute) {
      attr = require_string(a.take(0, "attribute", Value::none(), true), "selectattr's attribute").str();
      first = 1;
    }
    const Value test_name = a.take(first, "test");
    Args test_args;
    test_args.callee = "test";
    for (size_t k = first + 1; k < a.positional.size(); k++) {
      test_args.positional.push_back(a.positional[k]);
      a.used_positional.resize(a.positional.size());
      a.used_positional[k] = true;
    }
    List out;
    for (const Value& item : iterate(v)) {
      const Value x = by_attribute ? attribute_path(item, attr) : item;
      bool pass;
      if (test_name.is_none()) {
        pass = x.truthy();
      } else {
        Args t = test_args;
        pass = test(require_string(test_name, "the test's name").str(), x, t);
      }
      if (pass == keep) out.push_back(item);
    }
    return out;
  }

  Value filter_inner(const std::string& f, const Value& v, Args& a) {
    if (f == "safe") return v;
    if (f == "default" || f == "d") {
      const Value fallback = a.take(0, "default_value", Value(""));
      const bool boolean = a.take(1, "boolean", Value(false)).truthy();
      return (v.is_undefined() || (boolean && !v.truthy())) ? fallback : v;
    }
    if (f == "tojson") {
      // transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False),
      // which is json.dumps with these.
      JsonStyle style;
      style.ensure_ascii = a.take(0, "ensure_ascii", Value(false)).truthy();
      const Value indent = a.take(1, "indent");
      if (indent.is_string()) style.indent = indent.str();
      else if (!indent.is_none()) style.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, indent.as_int())), ' ');
      if (style.indent) style.item_separator = ",";
      const Value separators = a.take(2, "separators");
      if (!separators.is_none()) {
        ANVIL_CHECK(separators.is_list() && separators.list().size() == 2 && separators.list()[0].is_string() &&
                    separators.list()[1].is_string(), "tojson: separators must be (item_separator, key_separator)");
        style.item_separator = separators.list()[0].str();
        style.key_separator = separators.list()[1].str();
      }
      style.sort_keys = a.take(3, "sort_keys", Value(false)).truthy();
      return Value(to_json(v, style));
    }
    if (f == "length" || f == "count") return Value(length(v));
    if (f == "list") return Value(iterate(v));
    if (f == "string") return Value(v.to_string());
    if (f == "escape" || f == "e") return Value(html_escape(v.to_string()));
    if (f == "trim") return Value(strip(v.to_string(), a.take(0, "chars"), true, true));
    if (f == "upper" || f == "lower") return Value(case_map(v.to_string(), f == "upper"));
    if (f == "capitalize") return Value(title_case(case_map(v.to_string(), false), true));
    if (f == "title") {
      // Jinja's: words begin after runs of - ( { [ < and whitespace; each word's first character
      // upper-cased, the rest lower-cased.
      const std::u32string cp = code_points(v.to_string());
      std::string out;
      bool word_start = true;
      for (char32_t c : cp) {
        const bool separator = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || python_isspace(c);
        const std::string one = utf8(std::u32string(1, c));
        out += separator ? one : case_map(one, word_start);
        word_start = separator;
      }
      return Value(out);
    }
    if (f == "replace") {
      const std::string from = a.take(0, "old", Value::none(), true).to_string();
      const std::string to = a.take(1, "new", Value::none(), true).to_string();
      const Value count = a.take(2, "count");
      return Value(replace_all(v.to_string(), from, to, count.is_none() ? -1 : count.as_int()));
    }
    if (f == "join") {
      const std::string sep = a.take(0, "d", Value("")).to_string();
      const Value attr = a.take(1, "attribute");
      std::string out;
      const List items = iterate(v);
      for (size_t k = 0; k < items.size(); k++)
        out += (k ? sep : "") + (attr.is_none() ? items[k] : attribute_path(items[k], attr.to_string())).to_string();
      return Value(out);
    }
    if (f == "items") {
      if (v.is_undefined()) return Value::lazy(List{});
      ANVIL_CHECK(v.is_dict() && !v.is_namespace(), "filter 'items' needs a mapping, not a {}", v.type_name());
      List l;
      for (const auto& [k, x] : v.dict()) l.emplace_back(List{Value(k), x}, true);
      return Value::lazy(std::move(l));
    }
    if (f == "first") {
      const List items = iterate(v);
      return items.empty() ? Value::undefined("'first' of an empty sequence") : items.front();
    }
    if (f == "last") {
      ANVIL_CHECK(!v.is_lazy(), "filter 'last': a generator cannot be reversed (make it a list first: |list|last)");
      const List items = iterate(v);
      return items.empty() ? Value::undefined("'last' of an empty sequence") : items.back();
    }
    if (f == "reverse") {
      if (v.is_string()) {
        std::u32string cp = code_points(v.str());
        std::reverse(cp.begin(), cp.end());
        return Value(utf8(cp));
      }
      List items = iterate(v);
      std::reverse(items.begin(), items.end());
      return Value::lazy(std::move(items));
    }
    if (f == "select" || f == "reject") return Value::lazy(select(v, a, false, f == "select"));
    if (f == "selectattr" || f == "rejectattr") return Value::lazy(select(v, a, true, f == "selectattr"));
    if (f == "map") {
      List out;
      const Value attr = a.take(99, "attribute");
      if (!attr.is_none()) {
        const Value fallback = a.take(99, "default");
        for (const Value& item : iterate(v)) {
          Value x = attribute_path(item, attr.to_string());
          out.push_back(x.is_undefined() && !fallback.is_none() ? fallback : x);
        }
        return Value::lazy(std::move(out));
      }
      const std::string name = require_string(a.take(0, "filter", Value::none(), true), "map's filter").str();
      Args inner;
      inner.callee = "filter '" + name + "'";
      for (size_t k = 1; k < a.positional.size(); k++) inner.positional.push_back(a.positional[k]);
      a.used_positional.assign(a.positional.size(), true);
      for (const Value& item : iterate(v)) {
        Args each = inner;
        out.push_back(filter(name, item, each));
      }
      return Value::lazy(std::move(out));
    }
    if (f == "unique") {
      const bool case_sensitive = a.take(0, "case_sensitive", Value(false)).truthy();
      auto folded = [&](const Value& x) { return !case_sensitive && x.is_string() ? Value(case_map(x.str(), false)) : x; };
      List out;
      for (const Value& item : iterate(v)) {
        bool seen = false;
        for (const Value& o : out) seen |= equals(folded(o), folded(item));
        if (!seen) out.push_back(item);
      }
      return Value(std::move(out));
    }
    if (f == "sort") {
      const bool reverse = a.take(0, "reverse", Value(false)).truthy();
      const bool case_sensitive = a.take(1, "case_sensitive", Value(false)).truthy();
      const Value attr = a.take(2, "attribute");
      List items = iterate(v);
      auto key = [&](const Value& x) {
        Value k = attr.is_none() ? x : attribute_path(x, attr.to_string());
        return (!case_sensitive && k.is_string()) ? Value(case_map(k.str(), false)) : k;
      };
      std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
        const int c = compare_values(key(x), key(y), "<");
        return reverse ? c > 0 : c < 0;
      });
      return Value(std::move(items));
    }
    if (f == "dictsort") {
      ANVIL_CHECK(v.is_dict() && !v.is_namespace(), "filter 'dictsort' needs a mapping, not a {}", v.type_name());
      const bool case_sensitive = a.take(0, "case_sensitive", Value(false)).truthy();
      const std::string by = a.take(1, "by", Value("key")).to_string();
      const bool reverse = a.take(2, "reverse", Value(false)).truthy();
      List items;
      for (const auto& [k, x] : v.dict()) items.emplace_back(List{Value(k), x}, true);
      std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
        Value kx = x.list()[by == "value" ? 1 : 0], ky = y.list()[by == "value" ? 1 : 0];
        if (!case_sensitive && kx.is_string() && ky.is_string()) {
          kx = Value(case_map(kx.str(), false));
          ky = Value(case_map(ky.str(), false));
        }
        const int c = compare_values(kx, ky, "<");
        return reverse ? c > 0 : c < 0;
      });
      return Value(std::move(items));
    }
    if (f == "sum") {
      const Value attr = a.take(0, "attribute");
      Value total = a.take(1, "start", Value(int64_t{0}));
      for (const Value& item : iterate(v))
        total = arithmetic("+", total, attr.is_none() ? item : attribute_path(item, attr.to_string()));
      return total;
    }
    if (f == "min" || f == "max") {
      const bool case_sensitive = a.take(0, "case_sensitive", Value(false)).truthy();
      auto folded = [&](const Value& x) { return !case_sensitive && x.is_string() ? Value(case_map(x.str(), false)) : x; };
      const List items = iterate(v);
      if (items.empty()) return Value::undefined("'" + f + "' of an empty sequence");
      Value best = items[0];
      for (const Value& x : items) {
        const int c = compare_values(folded(x), folded(best), "<");
        if (f == "min" ? c < 0 : c > 0) best = x;
      }
      return best;
    }
    if (f == "int") {
      const Value fallback = a.take(0, "default", Value(int64_t{0}));
      if (v.is_number()) return Value(v.as_int());
      if (v.is_string()) {
        const std::string s = strip(v.str(), Value::none(), true, true);
        int64_t i = 0;
        const auto r = std::from_chars(s.data(), s.data() + s.size(), i);
        if (r.ec == std::errc() && r.ptr == s.data() + s.size()) return Value(i);
        try {
          size_t used = 0;
          const double d = std::stod(s, &used);
          if (used == s.size()) return Value(static_cast<int64_t>(d));
        } catch (const std::exception&) {
        }
      }
      return fallback;
    }
    if (f == "float") {
      const Value fallback = a.take(0, "default", Value(0.0));
      if (v.is_number()) return Value(v.as_double());
      if (v.is_string()) {
        try {
          size_t used = 0;
          const std::string s = strip(v.str(), Value::none(), true, true);
          const double d = std::stod(s, &used);
          if (used == s.size()) return Value(d);
        } catch (const std::exception&) {
        }
      }
      return fallback;
    }
    if (f == "abs") {
      ANVIL_CHECK(v.is_number(), "filter 'abs' needs a number, not a {}", v.type_name());
      return v.kind() == Value::Kind::kFloat ? Value(std::fabs(v.as_double())) : Value(static_cast<int64_t>(std::llabs(v.as_int())));
    }
    if (f == "round") {
      const int64_t precision = a.take(0, "precision", Value(int64_t{0})).as_int();
      const std::string how = a.take(1, "method", Value("common")).to_string();
      ANVIL_CHECK(v.is_number(), "filter 'round' needs a number, not a {}", v.type_name());
      if (how == "common" && v.kind() != Value::Kind::kFloat) return Value(v.as_int());  // Python's round(int)
      const double scale = std::pow(10.0, static_cast<double>(precision));
      const double x = v.as_double() * scale;
      double r;
      if (how == "common") r = std::nearbyint(x);
      else if (how == "ceil") r = std::ceil(x);
      else if (how == "floor") r = std::floor(x);
      else ANVIL_FAIL("filter 'round': method must be common, ceil or floor, not '{}'", how);
      return Value(r / scale);
    }
    if (f == "indent") {
      // Jinja 3.1's: the lines (split as str.splitlines splits them, after a newline is added)
      // after the first get the indent, blank ones only with `blank`; `first` indents the first.
      const Value width_v = a.take(0, "width", Value(int64_t{4}));
      const bool first = a.take(1, "first", Value(false)).truthy();
      const bool blank = a.take(2, "blank", Value(false)).truthy();
      ANVIL_CHECK(!v.is_undefined(), "{} (given to filter 'indent')", v.name());
      const std::string pad = width_v.is_string() ? width_v.str() : std::string(static_cast<size_t>(std::max<int64_t>(0, width_v.as_int())), ' ');
      const std::string text = v.to_string() + "\n";
      std::vector<std::string> lines;
      size_t b = 0;
      for (size_t k = 0; k < text.size(); k++) {
        if (text[k] != '\n' && text[k] != '\r') continue;
        lines.push_back(text.substr(b, k - b));
        if (text[k] == '\r' && k + 1 < text.size() && text[k + 1] == '\n') k++;
        b = k + 1;
      }
      if (b < text.size()) lines.push_back(text.substr(b));
      std::string out = lines.empty() ? "" : lines[0];
      for (size_t k = 1; k < lines.size(); k++) out += "\n" + ((blank || !lines[k].empty()) ? pad : "") + lines[k];
      return Value(first ? pad + out : out);
    }
    if (f == "attr") return getattr(v, a.take(0, "name", Value::none(), true).to_string());
    if (f == "wordcount") {  // runs of \w (letters, digits, underscore)
      int64_t words = 0;
      bool in_word = false;
      for (char32_t c : code_points(v.to_string())) {
        const bool w = c == '_' || u_isalnum(static_cast<UChar32>(c));
        words += w && !in_word;
        in_word = w;
      }
      return Value(words);
    }
    ANVIL_FAIL("the filter '{}' is not supported (anvil's Jinja has the filters chat templates use: default, tojson, "
               "length, list, string, trim, upper, lower, capitalize, title, replace, join, items, first, last, reverse, "
               "select, reject, selectattr, rejectattr, map, unique, sort, dictsort, sum, min, max, int, float, abs, round, "
               "indent, attr, escape, safe, wordcount)", f);
  }

  void add_builtins(Frame& g) {
    g.vars["range"] = Value::function("range", [](Args& a) {
      a.used_positional.assign(a.positional.size(), true);
      ANVIL_CHECK(!a.positional.empty() && a.positional.size() <= 3 && a.keyword.empty(), "range takes 1 to 3 integers");
      for (const Value& x : a.positional)
        ANVIL_CHECK(x.kind() == Value::Kind::kInt || x.kind() == Value::Kind::kBool, "range takes integers, not a {}", x.type_name());
      int64_t start = 0, stop, step = 1;
      if (a.positional.size() == 1) {
        stop = a.positional[0].as_int();
      } else {
        start = a.positional[0].as_int();
        stop = a.positional[1].as_int();
        if (a.positional.size() == 3) step = a.positional[2].as_int();
      }
      ANVIL_CHECK(step != 0, "range's step cannot be zero");
      List l;
      for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
        l.emplace_back(k);
        ANVIL_CHECK(static_cast<int64_t>(l.size()) <= kMaxItems, "range of more than {} items", kMaxItems);
      }
      return Value(std::move(l));
    });
    g.vars["namespace"] = Value::function("namespace", [this](Args& a) {
      Dict d;
      for (const Value& x : a.positional) {
        ANVIL_CHECK(x.is_dict(), "namespace() takes a mapping and keyword arguments, not a {}", x.type_name());
        for (const auto& kv : x.dict()) d.push_back(kv);
      }
      for (const auto& kv : a.keyword) {
        bool replaced = false;
        for (auto& o : d) if (o.first == kv.first) { o.second = kv.second; replaced = true; }
        if (!replaced) d.push_back(kv);
      }
      namespaces_.push_back(Value(std::move(d), true));
      return namespaces_.back();
    });
    g.vars["dict"] = Value::function("dict", [](Args& a) {
      Dict d;
      for (const Value& x : a.positional) {
        ANVIL_CHECK(x.is_dict(), "dict() takes a mapping and keyword arguments, not a {}", x.type_name());
        for (const auto& kv : x.dict()) d.push_back(kv);
      }
      for (const auto& kv : a.keyword) d.push_back(kv);
      return Value(std::move(d));
    });
  }
};

}  // namespace

struct Template::Program {
  std::string name;
  Body body;
};

Template::Template(const std::string& source, std::string name) : program_(std::make_unique<Program>()) {
  program_->name = std::move(name);
  Lexer lexer(source, program_->name);
  Parser parser{program_->name, lexer.tokens};
  program_->body = parser.parse_body({});
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const nlohmann::ordered_json& variables, const Dict& globals) const {
  Renderer r(program_->name, globals, variables);
  return r.run(program_->body);
}

}  // namespace anvil::jinja
