// tokenizer.json, step by step as the `tokenizers` library runs it (tokenizer/mod.rs,
// added_vocabulary.rs, models/bpe, normalizers/, pre_tokenizers/, decoders/): added tokens split
// out of the raw text, then the normalizer on each remaining piece, then the tokens marked
// `normalized` split out of that, the pre-tokenizer, and the BPE model on each pre-token.
#include "data/hf_tokenizer.h"

// Oniguruma's UChar macro would rename ICU's UChar.
#define ONIG_ESCAPE_UCHAR_COLLISION
#include <oniguruma.h>
#include <unicode/bytestream.h>
#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
// XXH3 compiled into the tables' lookups (one per word) rather than called in the library.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <mutex>
#include <optional>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>

#include "core/error.h"
#include "core/fs.h"
#include "core/memory.h"
#include "data/byte_level.h"
#include "data/per_thread.h"

namespace anvil {
namespace {

using json = nlohmann::json;
using Ranges = std::vector<std::pair<size_t, size_t>>;  // byte ranges [begin, end)
// The bytes of a large table's strings (core/memory.h).
using TableString = std::basic_string<char, std::char_traits<char>, TableAllocator<char>>;
constexpr std::string_view kSpaceMark = "\u2581";  // SentencePiece's "▁", which stands for a space

// The length of the UTF-8 sequence starting with lead byte c (1 for a stray byte).
size_t utf8_length(unsigned char c) { return c < 0x80 ? 1 : c >> 5 == 6 ? 2 : c >> 4 == 14 ? 3 : c >> 3 == 30 ? 4 : 1; }

// The code point at s[i] (valid UTF-8: the input is made valid first).
uint32_t code_point_at(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(s[i + k])); };
  switch (utf8_length(static_cast<unsigned char>(s[i]))) {
    case 2: return (b(0) & 0x1F) << 6 | (b(1) & 0x3F);
    case 3: return (b(0) & 0x0F) << 12 | (b(1) & 0x3F) << 6 | (b(2) & 0x3F);
    case 4: return (b(0) & 0x07) << 18 | (b(1) & 0x3F) << 12 | (b(2) & 0x3F) << 6 | (b(3) & 0x3F);
    default: return b(0);
  }
}

// The length of the well-formed UTF-8 sequence at s[i], or 0 with `bad` set to the length of
// its maximal ill-formed subpart (Unicode's "maximal subpart": the longest prefix of a valid
// sequence that is there, at least one byte), which becomes one U+FFFD.
size_t utf8_sequence(std::string_view s, size_t i, size_t* bad) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range (Unicode's table 3-7)
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c >= 0xE0 && c <= 0xEF) n = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
  else if (c >= 0xF0 && c <= 0xF4) n = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
  size_t k = 1;
  for (; n && k < n && i + k < s.size(); k++) {
    const unsigned char b = static_cast<unsigned char>(s[i + k]);
    if (k == 1 ? (b < lo || b > hi) : (b & 0xC0) != 0x80) break;
  }
  if (n && k == n) return n;
  *bad = n ? k : 1;
  return 0;
}

// The library takes text (Python's str, Rust's String): bytes that are not UTF-8 become U+FFFD,
// one for each maximal ill-formed subpart, as Python's decode(errors="replace") and Rust's
// String::from_utf8_lossy make them.
std::string valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t run = 0;  // the start of the valid bytes not yet copied
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      i++;
      continue;
    }
    size_t bad = 0;
    if (const size_t n = utf8_sequence(s, i, &bad)) {
      i += n;
      continue;
    }
    out.append(s.substr(run, i - run));
    out += "\xEF\xBF\xBD";
    i += bad;
    run = i;
  }
  out.append(s.substr(run));
  return out;
}

// Rust regex's \\w, which the library's single_word test uses: Alphabetic, marks, decimal
// digits, connector punctuation and Join_Control.
bool is_word_char(uint32_t cp) {
  const UChar32 c = static_cast<UChar32>(cp);
  const int8_t type = u_charType(c);
  return u_hasBinaryProperty(c, UCHAR_ALPHABETIC) || type == U_NON_SPACING_MARK || type == U_ENCLOSING_MARK ||
         type == U_COMBINING_SPACING_MARK || type == U_DECIMAL_DIGIT_NUMBER || type == U_CONNECTOR_PUNCTUATION ||
         u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL);
}

bool is_whitespace(uint32_t cp) { return u_isUWhiteSpace(static_cast<UChar32>(cp)); }  // Rust's char::is_whitespace

// A Split pattern or Replace pattern: {"String": s} (literal) or {"Regex": r} (Oniguruma, Ruby
// syntax, as the library compiles it).
class Pattern {
 public:
  Pattern(const json& spec, const std::string& where) : where_(where) {
    ANVIL_CHECK(spec.is_object() && spec.size() == 1, "{}: pattern must be {{\"String\": ...}} or {{\"Regex\": ...}}", where);
    if (spec.contains("String")) {
      literal_ = spec["String"].get<std::string>();
      ANVIL_CHECK(!literal_.empty(), "{}: an empty String pattern matches nothing", where);
      return;
    }
    ANVIL_CHECK(spec.contains("Regex"), "{}: pattern must be {{\"String\": ...}} or {{\"Regex\": ...}}", where);
    const std::string re = spec["Regex"].get<std::string>();
    static std::once_flag once;
    std::call_once(once, [] {
      OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
      onig_initialize(encodings, 1);
    });
    regex_ = compile(re, re);
    // Up to 64 matches in one call: the pattern repeated, each repetition atomic (the match a
    // call at that position finds) and reported by a callout. Oniguruma sets up and copies its
    // backtracking stack once per call, which cost as much as the matching for a pre-tokenizer's
    // short matches. Not where a repetition could read differently from a call of its own: \G
    // (the call's start), back-references and conditionals (an earlier repetition's groups), \K
    // (a match starting after where it began), callouts, and comments (# would swallow the
    // wrapping); nor where the wrapped pattern does not compile.
    bool reads_across = false;
    for (const char* s : {"\\G", "\\k", "\\g", "\\K", "(?(", "(?{", "(*", "#"})
      reads_across = reads_across || re.find(s) != std::string::npos;
    for (size_t k = 0; k + 1 < re.size(); k++)
      reads_across = reads_across || (re[k] == '\\' && re[k + 1] >= '1' && re[k + 1] <= '9');
    if (!reads_across) {
      try {
        run_ = compile("(?:(?>" + re + ")(?{+})){0," + std::to_string(kRun) + "}", re);
      } catch (const Error&) {
        run_.reset();
      }
    }
  }

  // The matches in s, left to right, not overlapping (a regex's may be empty).
  Ranges find_all(std::string_view s) const {
    struct Run {
      const char* str;
      size_t ends[kRun];
      int n = 0;
    };
    thread_local std::unique_ptr<OnigMatchParam, void (*)(OnigMatchParam*)> param(
        [] {
          OnigMatchParam* mp = onig_new_match_param();
          onig_initialize_match_param(mp);
          onig_set_progress_callout_of_match_param(mp, [](OnigCalloutArgs* args, void* data) {
            Run& run = *static_cast<Run*>(data);
            if (run.n < kRun)
              run.ends[run.n++] = reinterpret_cast<const char*>(onig_get_current_by_callout_args(args)) - run.str;
            return static_cast<int>(ONIG_CALLOUT_SUCCESS);
          });
          return mp;
        }(),
        onig_free_match_param);
    Ranges out;
    if (!regex_) {
      for (size_t at = s.find(literal_); at != std::string_view::npos; at = s.find(literal_, at + literal_.size()))
        out.emplace_back(at, at + literal_.size());
      return out;
    }
    std::unique_ptr<OnigRegion, void (*)(OnigRegion*)> region(onig_region_new(),
                                                             [](OnigRegion* r) { onig_region_free(r, 1); });
    const auto* str = reinterpret_cast<const OnigUChar*>(s.data());
    const OnigUChar* end = str + s.size();
    // As the onig crate's find_iter (the library's) iterates: empty matches count, except one
    // ending where the previous match ended, after which the search moves on a character.
    size_t at = 0;
    std::optional<size_t> last_end;
    while (at <= s.size()) {
      if (run_ && at < s.size()) {
        Run run{s.data(), {}, 0};
        onig_set_callout_user_data_of_match_param(param.get(), &run);
        // An error (a retry limit reached over 64 matches) leaves the matches to one call each.
        const int rc = onig_match_with_param(run_.get(), str, end, str + at, region.get(), ONIG_OPTION_NONE, param.get());
        const size_t first = at;
        for (int k = 0; rc >= 0 && k < run.n && run.ends[k] > at; k++) {  // an empty match ends the run
          out.emplace_back(at, run.ends[k]);
          at = run.ends[k];
        }
        if (at > first) {
          last_end = at;
          continue;
        }
      }
      // The leftmost match is the one at `at` where there is one: anchored matching finds it
      // without the search's set-up, which the pre-tokenizers' patterns (matching at every
      // position) would pay once per pre-token.
      int rc = onig_match(regex_.get(), str, end, str + at, region.get(), ONIG_OPTION_NONE);
      if (rc == ONIG_MISMATCH) rc = onig_search(regex_.get(), str, end, str + at, end, region.get(), ONIG_OPTION_NONE);
      if (rc == ONIG_MISMATCH) break;
      ANVIL_CHECK(rc >= 0, "{}: the regex search failed (Oniguruma error {}; a pattern that backtracks without "
                  "end on this text?)", where_, rc);
      const size_t b = static_cast<size_t>(region->beg[0]), e = static_cast<size_t>(region->end[0]);
      if (b == e && last_end == e) {
        at += at < s.size() ? utf8_length(static_cast<unsigned char>(s[at])) : 1;
        continue;
      }
      out.emplace_back(b, e);
      at = e;
      last_end = e;
    }
    return out;
  }

 private:
  struct Free {
    void operator()(regex_t* r) const { onig_free(r); }
  };
  static constexpr int kRun = 64;
  std::unique_ptr<regex_t, Free> compile(const std::string& re, const std::string& as_written) const {
    OnigErrorInfo info;
    regex_t* compiled = nullptr;
    const auto* p = reinterpret_cast<const OnigUChar*>(re.data());
    const int rc = onig_new(&compiled, p, p + re.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8, ONIG_SYNTAX_DEFAULT, &info);
    if (rc != ONIG_NORMAL) {
      OnigUChar message[ONIG_MAX_ERROR_MESSAGE_LEN];
      onig_error_code_to_str(message, rc, &info);
      ANVIL_FAIL("{}: regex '{}' does not compile: {}", where_, as_written, reinterpret_cast<const char*>(message));
    }
    return std::unique_ptr<regex_t, Free>(compiled);
  }
  std::string where_;
  std::string literal_;
  std::unique_ptr<regex_t, Free> regex_, run_;
};

std::string type_of(const json& spec, const std::string& where) {
  ANVIL_CHECK(spec.is_object() && spec.contains("type") && spec["type"].is_string(), "{}: expected an object with a "
              "\"type\"", where);
  return spec["type"].get<std::string>();
}
template <class T>
T value_or(const json& spec, const char* key, T fallback) {
  return spec.contains(key) && !spec[key].is_null() ? spec[key].get<T>() : fallback;
}

// ---- normalizers ----------------------------------------------------------------------------

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void apply(std::string& s) const = 0;
};

class UnicodeForm final : public Normalizer {
 public:
  UnicodeForm(const std::string& form) {
    UErrorCode status = U_ZERO_ERROR;
    n_ = form == "NFC"    ? icu::Normalizer2::getNFCInstance(status)
         : form == "NFD"  ? icu::Normalizer2::getNFDInstance(status)
         : form == "NFKC" ? icu::Normalizer2::getNFKCInstance(status)
                          : icu::Normalizer2::getNFKDInstance(status);
    ANVIL_CHECK(U_SUCCESS(status), "ICU's {} normalizer is not available: {}", form, u_errorName(status));
  }
  void apply(std::string& s) const override {
    // ASCII is in each of the four forms (no ASCII character decomposes or composes): most of a
    // corpus skips ICU. The rest is checked and normalized as UTF-8, without a UTF-16 copy.
    if (std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; })) return;
    UErrorCode status = U_ZERO_ERROR;
    if (n_->isNormalizedUTF8(s, status) && U_SUCCESS(status)) return;
    status = U_ZERO_ERROR;
    std::string out;
    icu::StringByteSink<std::string> sink(&out, static_cast<int32_t>(s.size()));
    n_->normalizeUTF8(0, s, sink, nullptr, status);
    ANVIL_CHECK(U_SUCCESS(status), "Unicode normalization failed: {}", u_errorName(status));
    s = std::move(out);
  }

 private:
  const icu::Normalizer2* n_;
};

// Each character lowercased on its own (Rust's char::to_lowercase: full mappings, no context,
// so no final sigma).
class Lowercase final : public Normalizer {
 public:
  void apply(std::string& s) const override {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size(); i += utf8_length(static_cast<unsigned char>(s[i]))) {
      icu::UnicodeString ch(static_cast<UChar32>(code_point_at(s, i)));
      ch.toLower(icu::Locale::getRoot());
      ch.toUTF8String(out);
    }
    s = std::move(out);
  }
};

class Strip final : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void apply(std::string& s) const override {
    size_t b = 0, e = s.size();
    while (left_ && b < e && is_whitespace(code_point_at(s, b))) b += utf8_length(static_cast<unsigned char>(s[b]));
    while (right_ && e > b) {
      size_t k = e - 1;
      while (k > b && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) k--;
      if (!is_whitespace(code_point_at(s, k))) break;
      e = k;
    }
    s = s.substr(b, e - b);
  }

 private:
  bool left_, right_;
};

class Prepend final : public Normalizer {
 public:
  explicit Prepend(std::string text) : text_(std::move(text)) {}
  void apply(std::string& s) const override {
    if (!s.empty()) s.insert(0, text_);
  }

 private:
  std::string text_;
};

class Replace final : public Normalizer {
 public:
  Replace(const json& spec, const std::string& where)
      : pattern_(spec.at("pattern"), where), content_(spec.at("content").get<std::string>()) {}
  void apply(std::string& s) const override { s = replaced(s); }
  std::string replaced(std::string_view s) const {
    std::string out;
    size_t at = 0;
    for (const auto& [b, e] : pattern_.find_all(s)) {
      out.append(s.substr(at, b - at));
      out += content_;
      at = e;
    }
    out.append(s.substr(at));
    return out;
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class NormalizerSequence final : public Normalizer {
 public:
  explicit NormalizerSequence(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  void apply(std::string& s) const override {
    for (const auto& p : parts_) p->apply(s);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

std::unique_ptr<Normalizer> make_normalizer(const json& spec, const std::string& where) {
  if (spec.is_null()) return nullptr;
  const std::string type = type_of(spec, where);
  const std::string at = where + " (" + type + ")";
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") return std::make_unique<UnicodeForm>(type);
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "Strip") return std::make_unique<Strip>(value_or(spec, "strip_left", true), value_or(spec, "strip_right", true));
  if (type == "Prepend") return std::make_unique<Prepend>(spec.at("prepend").get<std::string>());
  if (type == "Replace") return std::make_unique<Replace>(spec, at);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (const json& p : spec.at("normalizers")) parts.push_back(make_normalizer(p, where));
    return std::make_unique<NormalizerSequence>(std::move(parts));
  }
  ANVIL_FAIL("{}: normalizer type '{}' is not supported (anvil reads NFC, NFD, NFKC, NFKD, Lowercase, Strip, Prepend, "
             "Replace and Sequence)", where, type);
}

// ---- pre-tokenizers -------------------------------------------------------------------------

// A piece of text on its way through the pre-tokenizers: a view into the text of the stage that
// made it (stages run depth first, so that text outlives the piece).
struct Piece {
  std::string_view text;
  bool at_start;  // it begins where the input began (Metaspace's prepend_scheme "first")
};

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Behavior behavior_named(const std::string& name, const std::string& where) {
  if (name == "Removed") return Behavior::kRemoved;
  if (name == "Isolated") return Behavior::kIsolated;
  if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (name == "Contiguous") return Behavior::kContiguous;
  ANVIL_FAIL("{}: split behavior '{}' is not known (expected Removed, Isolated, MergedWithPrevious, MergedWithNext or "
             "Contiguous)", where, name);
}

// Where a pre-tokenizer hands each piece it makes: the next pre-tokenizer, or the model. Pieces
// go through the stages one at a time (depth first), so that no stage holds a document's pieces.
// A reference to a callable, not a std::function: it is called once per piece and made once per
// piece and stage, where std::function's allocation was a tenth of the encoding time.
class Emit {
 public:
  template <class F>
    requires std::is_invocable_v<const F&, Piece> && (!std::is_same_v<std::remove_cvref_t<F>, Emit>)
  Emit(const F& f)  // NOLINT: made implicitly from the lambda at each call
      : object_(&f), call_([](const void* o, Piece p) { (*static_cast<const F*>(o))(p); }) {}
  void operator()(Piece p) const { call_(object_, p); }

 private:
  const void* object_;
  void (*call_)(const void*, Piece);
};

// Splits a piece at the delimiters `matches` (byte ranges, ascending) as the library's
// NormalizedString::split does for `behavior`; invert: the matches are what is kept between
// delimiters. Empty parts are dropped.
void split_piece(Piece piece, const Ranges& matches, Behavior behavior, bool invert, Emit emit) {
  const std::string_view s = piece.text;
  const auto emit_part = [&](size_t b, size_t e) {
    if (e > b) emit({s.substr(b, e - b), piece.at_start && b == 0});
  };
  // The behaviours that keep or drop parts as they are (the published pre-tokenizers' Split is
  // Isolated) emit them as they come: a document's worth of parts is never stored.
  if (behavior == Behavior::kIsolated || behavior == Behavior::kRemoved) {
    const bool keep_matches = behavior == Behavior::kIsolated || invert;
    const bool keep_gaps = behavior == Behavior::kIsolated || !invert;
    size_t prev = 0;
    for (const auto& [b, e] : matches) {
      if (keep_gaps) emit_part(prev, b);
      if (keep_matches) emit_part(b, e);
      prev = e;
    }
    if (keep_gaps) emit_part(prev, s.size());
    return;
  }
  struct Part {
    size_t b, e;
    bool is_match;
  };
  std::vector<Part> parts;
  parts.reserve(2 * matches.size() + 1);
  size_t prev = 0;
  for (const auto& [b, e] : matches) {
    if (prev != b) parts.push_back({prev, b, false});
    parts.push_back({b, e, true});
    prev = e;
  }
  if (prev != s.size() || parts.empty()) parts.push_back({prev, s.size(), false});
  if (invert)
    for (Part& p : parts) p.is_match = !p.is_match;
  Ranges kept;
  kept.reserve(parts.size());
  bool previous_match = false;
  switch (behavior) {
    case Behavior::kRemoved:
    case Behavior::kIsolated:
      break;  // above
    case Behavior::kMergedWithPrevious:
      for (const Part& p : parts) {
        if (p.is_match && !previous_match && !kept.empty()) kept.back().second = p.e;
        else kept.emplace_back(p.b, p.e);
        previous_match = p.is_match;
      }
      break;
    case Behavior::kMergedWithNext:
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->is_match && !previous_match && !kept.empty()) kept.back().first = it->b;
        else kept.emplace_back(it->b, it->e);
        previous_match = it->is_match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    case Behavior::kContiguous:
      for (size_t i = 0; i < parts.size(); i++) {
        if (i > 0 && parts[i].is_match == previous_match) kept.back().second = parts[i].e;
        else kept.emplace_back(parts[i].b, parts[i].e);
        previous_match = parts[i].is_match;
      }
      break;
  }
  for (const auto& [b, e] : kept) emit_part(b, e);
}

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Hands the pieces `piece` splits into to emit, in order.
  virtual void split(Piece piece, Emit emit) const = 0;
};

class Split final : public PreTokenizer {
 public:
  Split(const json& spec, const std::string& where)
      : pattern_(spec.at("pattern"), where),
        behavior_(behavior_named(spec.at("behavior").get<std::string>(), where)),
        invert_(value_or(spec, "invert", false)) {}
  void split(Piece p, Emit emit) const override {
    split_piece(p, pattern_.find_all(p.text), behavior_, invert_, emit);
  }

 private:
  Pattern pattern_;
  Behavior behavior_;
  bool invert_;
};

class ByteLevel final : public PreTokenizer {
 public:
  explicit ByteLevel(const json& spec, const std::string& where)
      : add_prefix_space_(value_or(spec, "add_prefix_space", true)) {
    if (value_or(spec, "use_regex", true))
      gpt2_split_ = std::make_unique<Pattern>(
          json{{"Regex", "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"}}, where);
  }
  void split(Piece p, Emit emit) const override {
    std::string prefixed;
    if (add_prefix_space_ && (p.text.empty() || p.text[0] != ' ')) {
      prefixed = ' ' + std::string(p.text);
      p.text = prefixed;
    }
    const ByteChars& chars = byte_chars();
    auto mapped = [&](Piece q) {
      // A byte's character is one or two bytes of UTF-8; most pieces fit the buffer on the stack.
      char small[256];
      std::string large;
      char* m = small;
      if (2 * q.text.size() > sizeof small) {
        large.resize(2 * q.text.size());
        m = large.data();
      }
      size_t n = 0;
      for (unsigned char c : q.text) {
        const std::string& ch = chars.of_byte[c];
        m[n++] = ch[0];
        if (ch.size() == 2) m[n++] = ch[1];
      }
      emit({std::string_view(m, n), q.at_start});
    };
    if (gpt2_split_) split_piece(p, gpt2_split_->find_all(p.text), Behavior::kIsolated, false, mapped);
    else mapped(p);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Pattern> gpt2_split_;
};

// A key whose value the library holds as one char.
std::string one_character(const json& spec, const char* key, const std::string& where) {
  const std::string c = spec.at(key).get<std::string>();
  ANVIL_CHECK(!c.empty() && utf8_length(static_cast<unsigned char>(c[0])) == c.size(), "{}: {} must be one character, "
              "got '{}'", where, key, c);
  return c;
}

enum class PrependScheme { kAlways, kFirst, kNever };

PrependScheme prepend_scheme_of(const json& spec, const std::string& where) {
  if (spec.contains("prepend_scheme")) {
    const std::string s = spec["prepend_scheme"].get<std::string>();
    if (s == "always") return PrependScheme::kAlways;
    if (s == "first") return PrependScheme::kFirst;
    if (s == "never") return PrependScheme::kNever;
    ANVIL_FAIL("{}: prepend_scheme '{}' is not known (expected always, first or never)", where, s);
  }
  return value_or(spec, "add_prefix_space", true) ? PrependScheme::kAlways : PrependScheme::kNever;
}

class Metaspace final : public PreTokenizer {
 public:
  Metaspace(const json& spec, const std::string& where)
      : replacement_(one_character(spec, "replacement", where)),
        scheme_(prepend_scheme_of(spec, where)),
        split_(value_or(spec, "split", true)) {}
  void split(Piece p, Emit emit) const override {
    std::string replaced;
    for (char c : p.text) {
      if (c == ' ') replaced += replacement_;
      else replaced += c;
    }
    const bool starts = replaced.starts_with(replacement_);
    if (!starts && (scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && p.at_start)))
      replaced.insert(0, replacement_);
    p.text = replaced;
    if (!split_) {
      emit(p);
      return;
    }
    Ranges at;
    for (size_t k = p.text.find(replacement_); k != std::string::npos; k = p.text.find(replacement_, k + 1))
      at.emplace_back(k, k + replacement_.size());
    split_piece(p, at, Behavior::kMergedWithNext, false, emit);
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

// Rust's char::is_numeric: Unicode's Nd, Nl and No.
bool is_numeric(uint32_t cp) {
  const int8_t type = u_charType(static_cast<UChar32>(cp));
  return type == U_DECIMAL_DIGIT_NUMBER || type == U_LETTER_NUMBER || type == U_OTHER_NUMBER;
}

class Digits final : public PreTokenizer {
 public:
  explicit Digits(bool individual) : individual_(individual) {}
  void split(Piece p, Emit emit) const override {
    Ranges digits;
    for (size_t i = 0; i < p.text.size();) {
      const size_t n = utf8_length(static_cast<unsigned char>(p.text[i]));
      if (is_numeric(code_point_at(p.text, i))) digits.emplace_back(i, i + n);
      i += n;
    }
    split_piece(p, digits, individual_ ? Behavior::kIsolated : Behavior::kContiguous, false, emit);
  }

 private:
  bool individual_;
};

// The pre-tokenizer's stages in order, a Sequence's parts (nested ones too) flattened: each
// stage splits the pieces of the one before.
void add_pre_tokenizers(const json& spec, const std::string& where, std::vector<std::unique_ptr<PreTokenizer>>& stages) {
  if (spec.is_null()) return;
  const std::string type = type_of(spec, where);
  const std::string at = where + " (" + type + ")";
  if (type == "Split") stages.push_back(std::make_unique<Split>(spec, at));
  else if (type == "ByteLevel") stages.push_back(std::make_unique<ByteLevel>(spec, at));
  else if (type == "Metaspace") stages.push_back(std::make_unique<Metaspace>(spec, at));
  else if (type == "Digits") stages.push_back(std::make_unique<Digits>(value_or(spec, "individual_digits", false)));
  else if (type == "Sequence")
    for (const json& p : spec.at("pretokenizers")) add_pre_tokenizers(p, where, stages);
  else
    ANVIL_FAIL("{}: pre-tokenizer type '{}' is not supported (anvil reads Split, ByteLevel, Metaspace, Digits and "
               "Sequence)", where, type);
}

// ---- decoders -------------------------------------------------------------------------------

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void apply(std::vector<std::string>& tokens) const = 0;
};

class ByteLevelDecoder final : public Decoder {
 public:
  void apply(std::vector<std::string>& tokens) const override {
    const ByteChars& chars = byte_chars();
    std::string bytes;
    for (const std::string& t : tokens) {
      std::string mapped;
      bool all = true;
      for (size_t i = 0; i < t.size() && all; i += utf8_length(static_cast<unsigned char>(t[i]))) {
        const auto it = chars.byte_of.find(code_point_at(t, i));
        if (it == chars.byte_of.end()) all = false;
        else mapped += static_cast<char>(it->second);
      }
      bytes += all ? mapped : t;  // a token with a character outside the map stays as it is
    }
    tokens.assign(1, valid_utf8(bytes));
  }
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(const json& spec, const std::string& where) : replace_(spec, where) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) replace_.apply(t);
  }

 private:
  Replace replace_;
};

// <0xHH> tokens, runs of them joined into their bytes: valid UTF-8 stays, otherwise each byte
// becomes U+FFFD.
class ByteFallbackDecoder final : public Decoder {
 public:
  void apply(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string run;
    size_t run_tokens = 0;
    auto flush = [&] {
      if (run_tokens == 0) return;
      if (valid_utf8(run) == run) {
        out.push_back(run);
      } else {
        for (size_t i = 0; i < run_tokens; i++) out.push_back("\xEF\xBF\xBD");
      }
      run.clear();
      run_tokens = 0;
    };
    for (const std::string& t : tokens) {
      unsigned value = 0;
      if (t.size() == 6 && t.rfind("<0x", 0) == 0 && t[5] == '>' && std::sscanf(t.c_str() + 3, "%2X", &value) == 1 &&
          std::isxdigit(static_cast<unsigned char>(t[3])) && std::isxdigit(static_cast<unsigned char>(t[4]))) {
        run += static_cast<char>(value);
        run_tokens++;
      } else {
        flush();
        out.push_back(t);
      }
    }
    flush();
    tokens = std::move(out);
  }
};

class FuseDecoder final : public Decoder {
 public:
  void apply(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const std::string& t : tokens) all += t;
    tokens.assign(1, all);
  }
};

class StripDecoder final : public Decoder {
 public:
  StripDecoder(const json& spec, const std::string& where)
      : content_(one_character(spec, "content", where)), start_(spec.at("start").get<int>()),
        stop_(spec.at("stop").get<int>()) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      for (int i = 0; i < start_ && t.rfind(content_, 0) == 0; i++) t.erase(0, content_.size());
      for (int i = 0; i < stop_ && t.size() >= content_.size() &&
                      t.compare(t.size() - content_.size(), content_.size(), content_) == 0;
           i++)
        t.erase(t.size() - content_.size());
    }
  }

 private:
  std::string content_;
  int start_, stop_;
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(const json& spec, const std::string& where)
      : replacement_(one_character(spec, "replacement", where)), scheme_(prepend_scheme_of(spec, where)) {}
  // The replacement becomes a space, except in the first token when a prefix was prepended:
  // there every replacement is dropped.
  void apply(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); i++) {
      const bool drop = i == 0 && scheme_ != PrependScheme::kNever;
      std::string t;
      const std::string& s = tokens[i];
      for (size_t k = 0; k < s.size();) {
        if (s.compare(k, replacement_.size(), replacement_) == 0) {
          if (!drop) t += ' ';
          k += replacement_.size();
        } else {
          t += s[k++];
        }
      }
      tokens[i] = std::move(t);
    }
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
};

class DecoderSequence final : public Decoder {
 public:
  explicit DecoderSequence(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts_) p->apply(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

std::unique_ptr<Decoder> make_decoder(const json& spec, const std::string& where) {
  if (spec.is_null()) return nullptr;
  const std::string type = type_of(spec, where);
  const std::string at = where + " (" + type + ")";
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Replace") return std::make_unique<ReplaceDecoder>(spec, at);
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") return std::make_unique<StripDecoder>(spec, at);
  if (type == "Metaspace") return std::make_unique<MetaspaceDecoder>(spec, at);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> parts;
    for (const json& p : spec.at("decoders")) parts.push_back(make_decoder(p, where));
    return std::make_unique<DecoderSequence>(std::move(parts));
  }
  ANVIL_FAIL("{}: decoder type '{}' is not supported (anvil reads ByteLevel, Replace, ByteFallback, Fuse, Strip, "
             "Metaspace and Sequence)", where, type);
}

// ---- added tokens ---------------------------------------------------------------------------

struct AddedToken {
  std::string content;
  int32_t id;
  bool single_word, lstrip, rstrip, normalized, special;
};

// The added tokens matched on one side of the normalizer, leftmost-longest as the library's
// Aho-Corasick automaton matches them.
class TokenTrie {
 public:
  void add(const std::string& content, int index) {
    int node = 0;
    for (unsigned char c : content) {
      auto [it, fresh] = nodes_[node].next.try_emplace(c, static_cast<int>(nodes_.size()));
      if (fresh) nodes_.emplace_back();
      node = it->second;
    }
    nodes_[node].token = index;
    first_[static_cast<unsigned char>(content[0])] = true;
  }
  bool empty() const { return nodes_.size() == 1; }
  // The longest token starting at s[at]: (its index, its length), or index -1.
  std::pair<int, size_t> longest_at(std::string_view s, size_t at) const {
    if (!first_[static_cast<unsigned char>(s[at])]) return {-1, 0};
    int node = 0, best = -1;
    size_t best_len = 0;
    for (size_t k = at; k < s.size(); k++) {
      const auto it = nodes_[node].next.find(static_cast<unsigned char>(s[k]));
      if (it == nodes_[node].next.end()) break;
      node = it->second;
      if (nodes_[node].token >= 0) {
        best = nodes_[node].token;
        best_len = k + 1 - at;
      }
    }
    return {best, best_len};
  }

 private:
  struct Node {
    std::unordered_map<unsigned char, int> next;
    int token = -1;
  };
  std::vector<Node> nodes_{1};
  bool first_[256] = {};
};

// Strings -> values in one flat, open-addressed table over one buffer of the strings' bytes: a
// lookup, made once per word, touches one slot and the string's bytes (a node-based map's chain
// of pointers cost a third of the encoding time). The vocabulary (token -> id) and each thread's
// cache of encoded words are such tables.
template <class V>
class StringTable {
 public:
  void reserve(size_t n) {
    size_t slots = 16;
    while (slots < 2 * n) slots *= 2;
    slots_.assign(slots, Slot{});
  }
  // False when s is there already.
  bool insert(std::string_view s, V value) {
    if (2 * (count_ + 1) > slots_.size()) grow();
    const uint64_t h = XXH3_64bits(s.data(), s.size());
    size_t k = h & (slots_.size() - 1);
    for (; slots_[k].length; k = (k + 1) & (slots_.size() - 1))
      if (slots_[k].hash == static_cast<uint32_t>(h >> 32) && text(slots_[k]) == s) return false;
    ANVIL_CHECK(!s.empty() && s.size() < (1u << 31) && bytes_.size() + s.size() < (1ull << 32),
                "a string of {} bytes cannot be held in a tokenizer's table", s.size());
    slots_[k] = {static_cast<uint32_t>(h >> 32), static_cast<uint32_t>(bytes_.size()), static_cast<uint32_t>(s.size()), value};
    bytes_.append(s);
    count_++;
    return true;
  }
  // Starts loading the slot where a lookup of s begins.
  void prefetch(std::string_view s) const {
    if (!slots_.empty()) __builtin_prefetch(&slots_[XXH3_64bits(s.data(), s.size()) & (slots_.size() - 1)]);
  }
  const V* find(std::string_view s) const {
    if (slots_.empty() || s.empty()) return nullptr;
    const uint64_t h = XXH3_64bits(s.data(), s.size());
    for (size_t k = h & (slots_.size() - 1); slots_[k].length; k = (k + 1) & (slots_.size() - 1))
      if (slots_[k].hash == static_cast<uint32_t>(h >> 32) && text(slots_[k]) == s) return &slots_[k].value;
    return nullptr;
  }
  template <class F>
  void for_each(F f) const {
    for (const Slot& s : slots_)
      if (s.length) f(text(s), s.value);
  }
  size_t size() const { return count_; }
  void clear() {
    slots_.clear();
    bytes_.clear();
    count_ = 0;
  }

 private:
  // A string's slot holds all a lookup needs but its bytes: the hash's upper half (the lower
  // half chose the slot), where its bytes are, and its value.
  struct Slot {
    uint32_t hash = 0, offset = 0, length = 0;  // length 0: empty
    V value{};
  };
  std::string_view text(const Slot& s) const { return std::string_view(bytes_).substr(s.offset, s.length); }
  void grow() {
    std::vector<Slot, TableAllocator<Slot>> old = std::move(slots_);
    slots_.assign(std::max<size_t>(16, 2 * old.size()), Slot{});
    for (const Slot& s : old) {
      if (!s.length) continue;
      size_t k = XXH3_64bits(bytes_.data() + s.offset, s.length) & (slots_.size() - 1);
      while (slots_[k].length) k = (k + 1) & (slots_.size() - 1);
      slots_[k] = s;
    }
  }
  std::vector<Slot, TableAllocator<Slot>> slots_;
  TableString bytes_;
  size_t count_ = 0;
};

// ---- the tokenizer --------------------------------------------------------------------------

// The merges: (left id, right id) -> (rank, merged id), in one flat open-addressed table, since a
// BPE word is merged with a lookup per adjacent pair (a document without pre-tokenizer is one
// word of many thousand symbols: a node-based map's two cache misses a lookup dominated).
class MergeTable {
 public:
  struct Entry {
    int32_t rank = -1, id = 0;  // rank -1: an empty slot
  };
  void reserve(size_t n) {
    size_t slots = 16;
    while (3 * slots < 5 * n) slots *= 2;  // at most 60% full: a smaller table, fewer cache misses
    slots_.assign(slots, Slot{});
    shift_ = 64 - __builtin_ctzll(slots);
  }
  // A repeated pair keeps its last rank, as the library's map does.
  void insert_or_assign(int32_t a, int32_t b, int32_t rank, int32_t id) {
    if (5 * (count_ + 1) > 3 * slots_.size()) grow();
    const uint64_t key = key_of(a, b);
    size_t k = slot_of(key);
    for (; slots_[k].entry.rank >= 0; k = (k + 1) & (slots_.size() - 1))
      if (slots_[k].key == key) break;
    if (slots_[k].entry.rank < 0) count_++;
    slots_[k] = {key, {rank, id}};
  }
  // Starts loading the slot where the pair's insert or lookup begins.
  void prefetch(int32_t a, int32_t b) const {
    if (!slots_.empty()) __builtin_prefetch(&slots_[slot_of(key_of(a, b))]);
  }
  // The pair's rank and merged id, or nullptr where a and b do not merge.
  const Entry* find(int32_t a, int32_t b) const {
    if (slots_.empty()) return nullptr;
    const uint64_t key = key_of(a, b);
    for (size_t k = slot_of(key); slots_[k].entry.rank >= 0; k = (k + 1) & (slots_.size() - 1))
      if (slots_[k].key == key) return &slots_[k].entry;
    return nullptr;
  }

 private:
  struct Slot {
    uint64_t key = 0;
    Entry entry;
  };
  static uint64_t key_of(int32_t a, int32_t b) {
    return static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32 | static_cast<uint32_t>(b);
  }
  size_t slot_of(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_); }
  void grow() {
    std::vector<Slot, TableAllocator<Slot>> old = std::move(slots_);
    reserve(std::max<size_t>(16, old.size()));
    count_ = 0;
    for (const Slot& s : old)
      if (s.entry.rank >= 0)
        insert_or_assign(static_cast<int32_t>(s.key >> 32), static_cast<int32_t>(s.key & 0xFFFFFFFFu), s.entry.rank,
                         s.entry.id);
  }
  std::vector<Slot, TableAllocator<Slot>> slots_;
  size_t count_ = 0;
  int shift_ = 60;
};

class HfTokenizer final : public Tokenizer {
 public:
  explicit HfTokenizer(const TokenizerFiles& files);
  std::vector<int32_t> encode(std::string_view text) override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int vocab_size() const override { return static_cast<int>(id_to_token_.size()); }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  void write_hf_files(const std::string& dir, int model_max_length) const override;

 private:
  // A piece of the input: text to tokenize, or an added token already found (token >= 0).
  struct Segment {
    std::string text;
    int token;
    bool at_start;
  };
  void split_added(const TokenTrie& trie, Segment&& in, std::vector<Segment>& out) const;
  // A piece of the first pre-tokenizer stage (a word, mostly) through the later stages and the
  // model, cached; pre_tokenize: stages [stage, end) and the model; model: BPE on one pre-token.
  struct WordCache;
  void encode_word(WordCache& cache, Piece word, std::vector<int32_t>& out);
  void pre_tokenize(size_t stage, Piece piece, std::vector<int32_t>& out) const;
  void model(std::string_view piece, std::vector<int32_t>& out) const;
  void cut_before_spaces(WordCache& cache, const Segment& s, std::vector<int32_t>& out);
  std::vector<int32_t> merge_word(std::string_view word) const;
  // A special token's id (an added token's, else the model's); a model token's id.
  int32_t id_of(const std::string& token, const std::string& what) const;
  // Reads files_ (nlohmann's exceptions become the constructor's error, naming the file).
  void load();
  int32_t vocab_id(std::string_view token, const std::string& what) const;

  std::unique_ptr<Normalizer> normalizer_;
  std::vector<std::unique_ptr<PreTokenizer>> pre_tokenizers_;
  std::unique_ptr<Decoder> decoder_;
  StringTable<int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  // (left id, right id) -> (rank, merged id)
  MergeTable merges_;
  std::vector<AddedToken> added_;
  TokenTrie raw_tokens_, normalized_tokens_;
  std::string continuing_prefix_, end_suffix_;
  // model.unk_token and its id (-1 when it is not in model.vocab: an error once a character needs
  // it, as in the library); without an unk_token a character outside the vocabulary is dropped.
  std::string unk_token_;
  int32_t unk_id_ = -1;
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;
  // Each thread's encoded words: a word's ids are ids[value.first, value.first + value.second).
  struct WordCache {
    StringTable<std::pair<uint32_t, uint32_t>> words;
    std::vector<int32_t> ids;
  };
  PerThread<WordCache> cache_;
  // The text is cut before each "▁" that follows another character (see load()).
  bool cut_before_spaces_ = false;
  // A stage after the first treats a piece at the text's start apart (Metaspace).
  bool start_matters_ = false;
  int32_t bos_id_ = -1, eos_id_ = -1;
};

json read_json(const std::string& path, const char* what) {
  try {
    return json::parse(read_file(path, what));
  } catch (const json::exception& e) {
    ANVIL_FAIL("'{}' is not valid JSON: {}", path, e.what());
  }
}

// Reads tokenizer.json into nlohmann's tree except model.vocab and model.merges, most of the
// file's bytes: those are read straight into flat lists, since building them as a tree of maps
// and strings took most of the load (0.7 s of Llama 3's 9 MB).
class TokenizerJsonReader final : public nlohmann::json_sax<json> {
 public:
  explicit TokenizerJsonReader(const std::string& where) : where_(where) {}

  // Strings laid end to end in one buffer (no allocation per token: the lists are long).
  struct Strings {
    TableString bytes;
    std::vector<uint32_t, TableAllocator<uint32_t>> ends;
    void add(std::string_view s) {
      ANVIL_CHECK(bytes.size() + s.size() < (uint64_t{1} << 32), "a tokenizer.json's tokens beyond 4 GB");
      bytes.append(s);
      ends.push_back(static_cast<uint32_t>(bytes.size()));
    }
    size_t size() const { return ends.size(); }
    std::string_view operator[](size_t i) const {
      const uint32_t b = i ? ends[i - 1] : 0;
      return std::string_view(bytes).substr(b, ends[i] - b);
    }
  };

  json document;
  bool vocab_read = false;
  Strings vocab_tokens;  // model.vocab in the file's order: token k has id vocab_ids[k]
  std::vector<int64_t> vocab_ids;
  Strings merge_tokens;  // model.merges in rank order: merge k is tokens 2k and 2k + 1
  size_t merges() const { return merge_tokens.size() / 2; }

  bool null() override { return scalar(json()); }
  bool boolean(bool v) override { return scalar(json(v)); }
  bool number_float(double v, const std::string&) override { return scalar(json(v)); }
  bool number_integer(int64_t v) override { return integer(v, json(v)); }
  bool number_unsigned(uint64_t v) override {
    return integer(v > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(v), json(v));
  }
  bool binary(json::binary_t& v) override { return scalar(json(json::binary_t(v))); }
  bool string(std::string& v) override {
    switch (region()) {
      case Region::kMerges: {
        const size_t space = v.find(' ');
        ANVIL_CHECK(space != std::string::npos && space > 0 && space + 1 < v.size() &&
                        v.find(' ', space + 1) == std::string::npos,
                    "{}: merge {} ('{}') is not two tokens separated by a space", where_, merges(), v);
        merge_tokens.add(std::string_view(v).substr(0, space));
        merge_tokens.add(std::string_view(v).substr(space + 1));
        return true;
      }
      case Region::kMergePair: {
        Frame& f = stack_.back();
        ANVIL_CHECK(f.items < 2, "{}: merge {} is not two tokens", where_, merge_read());
        f.items++;
        merge_tokens.add(v);
        return true;
      }
      default:
        return scalar(json(std::move(v)));
    }
  }
  bool key(std::string& k) override {
    key_ = std::move(k);
    return true;
  }
  bool start_object(size_t) override {
    if (region() == Region::kTree && in_model() && key_ == "vocab") {
      vocab_read = true;
      vocab_tokens = {};
      vocab_ids.clear();
      stack_.push_back({nullptr, Region::kVocab, ""});
      return true;
    }
    expect_tree("an object");
    return open_tree(json::object());
  }
  bool start_array(size_t) override {
    if (region() == Region::kTree && in_model() && key_ == "merges") {
      merge_tokens = {};
      stack_.push_back({nullptr, Region::kMerges, ""});
      return true;
    }
    if (region() == Region::kMerges) {
      stack_.push_back({nullptr, Region::kMergePair, ""});
      return true;
    }
    expect_tree("an array");
    return open_tree(json::array());
  }
  bool end_object() override {
    stack_.pop_back();
    return true;
  }
  bool end_array() override {
    if (region() == Region::kMergePair)
      ANVIL_CHECK(stack_.back().items == 2, "{}: merge {} is not two tokens", where_, merge_read());
    stack_.pop_back();
    return true;
  }
  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception& e) override {
    ANVIL_FAIL("'{}' is not valid JSON: {}", where_, e.what());
  }

 private:
  enum class Region { kTree, kVocab, kMerges, kMergePair };
  struct Frame {
    json* value;  // the tree's object or array (kTree)
    Region region;
    std::string name;  // its key in the object holding it
    int items = 0;     // a merge pair's tokens so far
  };
  Region region() const { return stack_.empty() ? Region::kTree : stack_.back().region; }
  // The rank of the merge being read (for errors).
  size_t merge_read() const {
    return region() == Region::kMergePair ? (merge_tokens.size() - stack_.back().items) / 2 : merges();
  }
  // Directly inside the top level's "model" object.
  bool in_model() const { return stack_.size() == 2 && stack_[1].name == "model"; }
  void expect_tree(const char* what) const {
    ANVIL_CHECK(region() == Region::kTree, "{}: {}", where_,
                region() == Region::kVocab ? fmt::format("model.vocab's '{}' must be an integer id, not {}", key_, what)
                                           : fmt::format("merge {} is not two tokens", merge_read()));
  }
  bool scalar(json&& v) {
    expect_tree(v.is_string() ? "a string" : "a number");
    put(std::move(v));
    return true;
  }
  bool integer(int64_t i, json&& v) {
    if (region() != Region::kVocab) return scalar(std::move(v));
    vocab_tokens.add(key_);
    vocab_ids.push_back(i);
    return true;
  }
  // An object or array of the tree begins: put in its parent, it takes the values that follow.
  bool open_tree(json&& container) {
    std::string name = stack_.empty() || !stack_.back().value->is_object() ? "" : key_;
    json* v = put(std::move(container));
    stack_.push_back({v, Region::kTree, std::move(name)});
    return true;
  }
  json* put(json&& v) {
    if (stack_.empty()) {
      document = std::move(v);
      return &document;
    }
    json& parent = *stack_.back().value;
    if (parent.is_object()) return &(parent[key_] = std::move(v));
    parent.push_back(std::move(v));
    return &parent.back();
  }

  std::string where_;
  std::vector<Frame> stack_;
  std::string key_;
};

// tokenizer_config.json's bos_token / eos_token: a string, or transformers' AddedToken object.
std::string config_token(const json& config, const char* key, const std::string& where) {
  if (!config.contains(key) || config[key].is_null()) return "";
  const json& t = config[key];
  if (t.is_string()) return t.get<std::string>();
  ANVIL_CHECK(t.is_object() && t.contains("content") && t["content"].is_string(), "{}: {} must be a string or an "
              "object with a \"content\" string", where, key);
  return t["content"].get<std::string>();
}

// The special token a TemplateProcessing post-processor puts first in a single sequence, if any
// (looked for inside a Sequence of processors too).
std::string template_bos(const json& post) {
  if (post.is_null() || !post.is_object()) return "";
  const std::string type = value_or<std::string>(post, "type", "");
  if (type == "Sequence") {
    for (const json& p : post.value("processors", json::array()))
      if (const std::string t = template_bos(p); !t.empty()) return t;
    return "";
  }
  if (type != "TemplateProcessing" || !post.contains("single") || post["single"].empty()) return "";
  const json& first = post["single"][0];
  if (!first.contains("SpecialToken")) return "";
  const std::string name = first["SpecialToken"].at("id").get<std::string>();
  const json& specials = post.value("special_tokens", json::object());
  if (specials.contains(name) && specials[name].contains("tokens") && specials[name]["tokens"].size() == 1)
    return specials[name]["tokens"][0].get<std::string>();
  return name;
}

HfTokenizer::HfTokenizer(const TokenizerFiles& files) : Tokenizer(files) {
  try {
    load();
  } catch (const json::exception& e) {
    ANVIL_FAIL("'{}' is not a tokenizer.json anvil can read: {}", files.model, e.what());
  }
}

void HfTokenizer::load() {
  const TokenizerFiles& files = files_;
  const std::string where = files.model;
  TokenizerJsonReader reader(where);
  {
    const MappedFile file(files.model, "tokenizer.json");
    const std::string_view text = file.bytes();
    json::sax_parse(text.begin(), text.end(), &reader);
  }
  const json& j = reader.document;
  ANVIL_CHECK(j.is_object() && j.contains("model"), "'{}' is not a tokenizer.json (no \"model\")", where);
  const json& m = j["model"];
  const std::string type = value_or<std::string>(m, "type", "BPE");
  ANVIL_CHECK(type == "BPE", "{}: model type '{}' is not supported (anvil reads BPE models)", where, type);
  ANVIL_CHECK(!m.contains("dropout") || m["dropout"].is_null() || m["dropout"].get<double>() == 0.0,
              "{}: BPE dropout is not supported (it makes tokenization random; set it to null)", where);
  continuing_prefix_ = value_or<std::string>(m, "continuing_subword_prefix", "");
  end_suffix_ = value_or<std::string>(m, "end_of_word_suffix", "");
  byte_fallback_ = value_or(m, "byte_fallback", false);
  fuse_unk_ = value_or(m, "fuse_unk", false);
  ignore_merges_ = value_or(m, "ignore_merges", false);
  ANVIL_CHECK(reader.vocab_read, "{}: model.vocab must map tokens to ids", where);
  int32_t largest = -1;
  vocab_.reserve(reader.vocab_ids.size());
  // Ids index a table: a negative one or one beyond 2^24 (16.7 million) is an error, not an
  // allocation of its size.
  auto check_id = [&](int64_t id, std::string_view token) {
    ANVIL_CHECK(id >= 0 && id < (int64_t{1} << 24), "{}: token '{}' has id {} (expected 0 to 16777215)", where, token,
                id);
    return static_cast<int32_t>(id);
  };
  for (size_t k = 0; k < reader.vocab_ids.size(); k++) {
    const std::string_view token = reader.vocab_tokens[k];
    const int32_t i = check_id(reader.vocab_ids[k], token);
    ANVIL_CHECK(vocab_.insert(token, i), "{}: token '{}' is in model.vocab twice", where, token);
    largest = std::max(largest, i);
  }
  added_.reserve(j.value("added_tokens", json::array()).size());
  for (const json& t : j.value("added_tokens", json::array())) {
    AddedToken a{t.at("content").get<std::string>(), check_id(t.at("id").get<int64_t>(), t.at("content").get<std::string>()),
                 value_or(t, "single_word", false),
                 value_or(t, "lstrip", false), value_or(t, "rstrip", false), value_or(t, "normalized", false),
                 value_or(t, "special", false)};
    ANVIL_CHECK(!a.content.empty(), "{}: an added token (id {}) has no content", where, a.id);
    largest = std::max(largest, a.id);
    added_.push_back(a);
  }
  id_to_token_.assign(static_cast<size_t>(largest) + 1, "");
  vocab_.for_each([&](std::string_view token, int32_t id) { id_to_token_[id] = token; });
  for (size_t k = 0; k < added_.size(); k++) id_to_token_[added_[k].id] = added_[k].content;
  // Merges ("a b" strings before tokenizers 0.20, [a, b] pairs after): the merged token is a then
  // b without its continuing-subword prefix.
  // A merge is three lookups and an insert at random places in tables of megabytes; those of the
  // merges a few ranks ahead are prefetched, so that their cache misses overlap.
  constexpr size_t kAhead = 8;
  const size_t n_merges = reader.merges();
  const auto merged_of = [&](size_t rank, std::string& merged) {
    const std::string_view a = reader.merge_tokens[2 * rank], b = reader.merge_tokens[2 * rank + 1];
    merged.assign(a);
    merged.append(!continuing_prefix_.empty() && b.starts_with(continuing_prefix_) ? b.substr(continuing_prefix_.size()) : b);
  };
  struct MergeIds {
    int32_t a, b, merged;
  };
  std::vector<MergeIds> ids(n_merges);
  std::string merged, ahead;
  for (size_t rank = 0; rank < n_merges; rank++) {
    if (rank + kAhead < n_merges) {
      merged_of(rank + kAhead, ahead);
      vocab_.prefetch(reader.merge_tokens[2 * (rank + kAhead)]);
      vocab_.prefetch(reader.merge_tokens[2 * (rank + kAhead) + 1]);
      vocab_.prefetch(ahead);
    }
    merged_of(rank, merged);
    ids[rank] = {vocab_id(reader.merge_tokens[2 * rank], "merge's token"),
                 vocab_id(reader.merge_tokens[2 * rank + 1], "merge's token"), vocab_id(merged, "merged token")};
  }
  merges_.reserve(n_merges);
  for (size_t rank = 0; rank < n_merges; rank++) {
    if (rank + kAhead < n_merges) merges_.prefetch(ids[rank + kAhead].a, ids[rank + kAhead].b);
    merges_.insert_or_assign(ids[rank].a, ids[rank].b, static_cast<int32_t>(rank), ids[rank].merged);
  }
  unk_token_ = value_or<std::string>(m, "unk_token", "");
  if (const int32_t* unk = vocab_.find(unk_token_)) unk_id_ = *unk;
  normalizer_ = make_normalizer(j.value("normalizer", json()), where + ": normalizer");
  // A token marked `normalized` is found in the normalized text, as the normalizer writes it.
  for (size_t k = 0; k < added_.size(); k++) {
    if (!added_[k].normalized) {
      raw_tokens_.add(added_[k].content, static_cast<int>(k));
      continue;
    }
    std::string content = added_[k].content;
    if (normalizer_) normalizer_->apply(content);
    if (!content.empty()) normalized_tokens_.add(content, static_cast<int>(k));
  }
  add_pre_tokenizers(j.value("pre_tokenizer", json()), where + ": pre_tokenizer", pre_tokenizers_);
  for (size_t k = 1; k < pre_tokenizers_.size(); k++)
    start_matters_ = start_matters_ || dynamic_cast<const Metaspace*>(pre_tokenizers_[k].get());
  // Without a pre-tokenizer the model's word is the whole text (Mistral's, Llama 2's: thousands of
  // symbols). Where no merge can join a character to a following SentencePiece space "▁" (no
  // vocabulary token holds one after anything but another "▁", and each merge makes a vocabulary
  // token), BPE on the text is BPE on its parts cut before each such "▁", which are then cached
  // as words; the ids are the same.
  if (pre_tokenizers_.empty() && continuing_prefix_.empty() && end_suffix_.empty() && !ignore_merges_ &&
      vocab_.find(kSpaceMark)) {
    bool joined = false;
    vocab_.for_each([&](std::string_view token, int32_t) {
      for (size_t at = token.find(kSpaceMark, 1); !joined && at != std::string_view::npos;
           at = token.find(kSpaceMark, at + 1))
        joined = !token.substr(0, at).ends_with(kSpaceMark);
    });  // (a pass over the vocabulary at load: stopping early would save little)
    cut_before_spaces_ = !joined;
  }
  decoder_ = make_decoder(j.value("decoder", json()), where + ": decoder");

  // BOS and EOS: tokenizer_config.json's, else the post-processor's template for the BOS.
  json config = json::object();
  if (!files.config.empty()) config = read_json(files.config, "tokenizer config");
  const std::string config_where = files.config.empty() ? where : files.config;
  std::string bos;
  if (config.contains("add_bos_token") && !config["add_bos_token"].is_null()) {
    if (config["add_bos_token"].get<bool>()) {
      bos = config_token(config, "bos_token", config_where);
      ANVIL_CHECK(!bos.empty(), "{}: add_bos_token is true but there is no bos_token", config_where);
    }
  } else {
    bos = template_bos(j.value("post_processor", json()));
  }
  if (!bos.empty()) bos_id_ = id_of(bos, "BOS token");
  const std::string eos = config_token(config, "eos_token", config_where);
  ANVIL_CHECK(!eos.empty(), "{}: no eos_token (anvil ends every document with it): give the tokenizer directory a "
              "tokenizer_config.json that names one", config_where);
  eos_id_ = id_of(eos, "EOS token");
}

int32_t HfTokenizer::vocab_id(std::string_view token, const std::string& what) const {
  const int32_t* id = vocab_.find(token);
  ANVIL_CHECK(id, "{}: {} '{}' is not in model.vocab", files_.model, what, token);
  return *id;
}

int32_t HfTokenizer::id_of(const std::string& token, const std::string& what) const {
  for (const AddedToken& a : added_)
    if (a.content == token) return a.id;
  const int32_t* id = vocab_.find(token);
  ANVIL_CHECK(id, "{}: {} '{}' is not in the vocabulary", files_.model, what, token);
  return *id;
}

void HfTokenizer::split_added(const TokenTrie& trie, Segment&& in, std::vector<Segment>& out) const {
  if (in.token >= 0 || trie.empty() || in.text.empty()) {
    out.push_back(std::move(in));
    return;
  }
  const std::string& s = in.text;
  size_t start_offset = 0;
  for (size_t at = 0; at < s.size();) {
    const auto [index, length] = trie.longest_at(s, at);
    if (index < 0) {
      at++;
      continue;
    }
    const AddedToken& t = added_[index];
    size_t start = at, stop = at + length;
    at = stop;
    if (t.single_word) {
      // Only where it is a word of its own: no letter or digit right before or after it.
      auto word_char = [&](size_t k) { return is_word_char(code_point_at(s, k)); };
      size_t before = start;
      if (before > 0) {
        before--;
        while (before > 0 && (static_cast<unsigned char>(s[before]) & 0xC0) == 0x80) before--;
      }
      if ((start > 0 && word_char(before)) || (stop < s.size() && word_char(stop))) continue;
    }
    if (t.lstrip) {
      size_t b = start;
      while (b > 0) {
        size_t k = b - 1;
        while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) k--;
        if (!is_whitespace(code_point_at(s, k))) break;
        b = k;
      }
      start = std::max(b, start_offset);
    }
    if (t.rstrip)
      while (stop < s.size() && is_whitespace(code_point_at(s, stop)))
        stop += utf8_length(static_cast<unsigned char>(s[stop]));
    if (start_offset < start) out.push_back({s.substr(start_offset, start - start_offset), -1, in.at_start && start_offset == 0});
    out.push_back({s.substr(start, stop - start), t.id, false});
    start_offset = stop;
  }
  if (start_offset < s.size()) out.push_back({s.substr(start_offset), -1, in.at_start && start_offset == 0});
}

std::vector<int32_t> HfTokenizer::merge_word(std::string_view w) const {
  struct Symbol {
    int32_t id;
    int prev, next;
    bool gone;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(w.size());
  const int32_t unk_id = unk_id_;
  bool pending_unk = false;
  auto add = [&](int32_t id) {
    const int n = static_cast<int>(symbols.size());
    symbols.push_back({id, n - 1, n + 1, false});
  };
  const bool affixes = !continuing_prefix_.empty() || !end_suffix_.empty();
  std::string with_affixes;
  for (size_t i = 0; i < w.size();) {
    const size_t len = utf8_length(static_cast<unsigned char>(w[i]));
    const bool first = i == 0, last = i + len >= w.size();
    std::string_view s = w.substr(i, len);
    if (affixes) {
      with_affixes.clear();
      if (!first) with_affixes += continuing_prefix_;
      with_affixes += s;
      if (last) with_affixes += end_suffix_;
      s = with_affixes;
    }
    i += len;
    if (const int32_t* id = vocab_.find(s)) {
      if (pending_unk) add(unk_id);
      pending_unk = false;
      add(*id);
      continue;
    }
    if (byte_fallback_) {
      std::vector<int32_t> bytes;
      for (unsigned char c : s) {
        const int32_t* id = vocab_.find(fmt::format("<0x{:02X}>", c));
        if (!id) break;
        bytes.push_back(*id);
      }
      if (bytes.size() == s.size()) {
        for (int32_t b : bytes) add(b);
        continue;
      }
    }
    if (!unk_token_.empty()) {
      ANVIL_CHECK(unk_id >= 0, "{}: model.unk_token '{}' is not in model.vocab, and the text needs it", files_.model,
                  unk_token_);
      if (pending_unk && !fuse_unk_) add(unk_id);
      pending_unk = true;
    }
  }
  if (pending_unk) add(unk_id);
  if (!symbols.empty()) symbols.back().next = -1;

  struct Merge {
    int32_t rank;
    int pos;
    int32_t id;
    bool operator>(const Merge& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Merge, std::vector<Merge>, std::greater<Merge>> queue;
  for (size_t k = 0; k + 1 < symbols.size(); k++)
    if (const auto* m = merges_.find(symbols[k].id, symbols[k + 1].id))
      queue.push({m->rank, static_cast<int>(k), m->id});
  while (!queue.empty()) {
    const Merge top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.gone || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    const auto* m = merges_.find(left.id, right.id);
    if (!m || m->id != top.id) continue;  // an entry made stale by an earlier merge
    left.id = top.id;
    right.gone = true;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    if (left.prev >= 0)
      if (const auto* p = merges_.find(symbols[left.prev].id, left.id)) queue.push({p->rank, left.prev, p->id});
    if (left.next >= 0)
      if (const auto* n = merges_.find(left.id, symbols[left.next].id)) queue.push({n->rank, top.pos, n->id});
  }
  std::vector<int32_t> ids;
  for (const Symbol& s : symbols)
    if (!s.gone) ids.push_back(s.id);
  return ids;
}

void HfTokenizer::model(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (ignore_merges_)
    if (const int32_t* id = vocab_.find(piece)) {
      out.push_back(*id);
      return;
    }
  const std::vector<int32_t> ids = merge_word(piece);
  out.insert(out.end(), ids.begin(), ids.end());
}

void HfTokenizer::pre_tokenize(size_t stage, Piece piece, std::vector<int32_t>& out) const {
  if (stage >= pre_tokenizers_.size()) return model(piece.text, out);
  pre_tokenizers_[stage]->split(piece, [&](Piece p) { pre_tokenize(stage + 1, p, out); });
}

void HfTokenizer::encode_word(WordCache& cache, Piece word, std::vector<int32_t>& out) {
  // Words are cached as the library caches its words, by what the first stage makes of the text
  // (the regex split: a hit skips the byte mapping and the vocabulary). Under 256 bytes only, and
  // bounded, since a corpus's distinct words are many; a piece at the text's start is not cached
  // where a later Metaspace stage may treat it apart.
  if ((word.at_start && start_matters_) || word.text.size() >= 256) return pre_tokenize(1, word, out);
  const std::pair<uint32_t, uint32_t>* hit = cache.words.find(word.text);
  if (!hit) {
    if (cache.words.size() >= 200000) {
      cache.words.clear();
      cache.ids.clear();
    }
    const size_t begin = cache.ids.size();
    pre_tokenize(1, word, cache.ids);
    cache.words.insert(word.text, {static_cast<uint32_t>(begin), static_cast<uint32_t>(cache.ids.size() - begin)});
    hit = cache.words.find(word.text);
  }
  // A word is a token or a few: appended one by one, not by a copy call sized for long runs.
  for (uint32_t k = 0; k < hit->second; k++) out.push_back(cache.ids[hit->first + k]);
}

void HfTokenizer::cut_before_spaces(WordCache& cache, const Segment& s, std::vector<int32_t>& out) {
  const std::string_view text = s.text;
  size_t begin = 0;
  for (size_t at = text.find(kSpaceMark, 1); at != std::string_view::npos; at = text.find(kSpaceMark, at + 1)) {
    if (text.substr(0, at).ends_with(kSpaceMark)) continue;
    encode_word(cache, {text.substr(begin, at - begin), s.at_start && begin == 0}, out);
    begin = at;
  }
  encode_word(cache, {text.substr(begin), s.at_start && begin == 0}, out);
}

std::vector<int32_t> HfTokenizer::encode(std::string_view raw) {
  std::vector<Segment> segments, normalized;
  split_added(raw_tokens_, {valid_utf8(raw), -1, true}, segments);
  for (Segment& s : segments) {
    if (s.token < 0 && normalizer_) normalizer_->apply(s.text);
    split_added(normalized_tokens_, std::move(s), normalized);
  }
  std::vector<int32_t> ids;
  WordCache& cache = cache_.local();
  for (const Segment& s : normalized) {
    if (s.token >= 0) ids.push_back(s.token);
    else if (s.text.empty()) continue;
    else if (cut_before_spaces_) cut_before_spaces(cache, s, ids);
    else if (pre_tokenizers_.empty()) encode_word(cache, {s.text, s.at_start}, ids);
    else pre_tokenizers_[0]->split({s.text, s.at_start}, [&](Piece word) { encode_word(cache, word, ids); });
  }
  return ids;
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    ANVIL_CHECK(id >= 0 && static_cast<size_t>(id) < id_to_token_.size() && !id_to_token_[id].empty(),
                "token id {} is not in the vocabulary of '{}'", id, files_.name);
    tokens.push_back(id_to_token_[id]);
  }
  if (!decoder_) {
    std::string joined;
    for (size_t i = 0; i < tokens.size(); i++) joined += (i ? " " : "") + tokens[i];
    return joined;
  }
  decoder_->apply(tokens);
  std::string text;
  for (const std::string& t : tokens) text += t;
  return text;
}

void HfTokenizer::write_hf_files(const std::string& dir, int model_max_length) const {
  write_file_atomic(dir + "/tokenizer.json", read_file(files_.model, "tokenizer.json"));
  json config = files_.config.empty() ? json::object() : read_json(files_.config, "tokenizer config");
  config["model_max_length"] = model_max_length;
  write_file_atomic(dir + "/tokenizer_config.json", config.dump(2) + "\n");
  json special = {{"eos_token", id_to_token_[eos_id_]}};
  if (bos_id_ >= 0) special["bos_token"] = id_to_token_[bos_id_];
  write_file_atomic(dir + "/special_tokens_map.json", special.dump(2) + "\n");
}

}  // namespace

std::unique_ptr<Tokenizer> make_hf_tokenizer(const TokenizerFiles& files) {
  return std::make_unique<HfTokenizer>(files);
}

}  // namespace anvil
