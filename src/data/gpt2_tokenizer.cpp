// GPT-2 BPE: strict UTF-8 decoding with ICU's categories for \p{L} and \p{N}, the pattern
// matched by hand, and merges applied as gpt-3-encoder applies them. Results are cached per piece.
#include "data/gpt2_tokenizer.h"

#include <unicode/uchar.h>

#include <climits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "data/byte_level.h"

namespace anvil {
namespace {

enum class CharClass { kLetter, kNumber, kSpace, kOther };

struct Unit {  // one code point (or one byte of invalid UTF-8) of the input
  uint32_t cp;
  CharClass cls;
  size_t begin, end;  // byte range
};

// JavaScript's \s: WhiteSpace and LineTerminator code points.
bool js_space(uint32_t c) {
  return c == 0x09 || c == 0x0a || c == 0x0b || c == 0x0c || c == 0x0d || c == 0x20 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
         c == 0x205f || c == 0x3000 || c == 0xfeff;
}

CharClass classify(uint32_t c) {
  if (c < 0x80) {  // fast path for ASCII
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return CharClass::kLetter;
    if (c >= '0' && c <= '9') return CharClass::kNumber;
    return js_space(c) ? CharClass::kSpace : CharClass::kOther;
  }
  if (js_space(c)) return CharClass::kSpace;
  const uint32_t mask = U_GET_GC_MASK(static_cast<UChar32>(c));
  if (mask & U_GC_L_MASK) return CharClass::kLetter;
  if (mask & U_GC_N_MASK) return CharClass::kNumber;
  return CharClass::kOther;
}

// Decodes UTF-8 strictly (no overlongs, surrogates or values past U+10FFFF); each byte that does
// not start a valid sequence becomes a unit of its own with class kOther.
std::vector<Unit> decode_units(std::string_view s) {
  std::vector<Unit> units;
  units.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0, n = s.size();
  while (i < n) {
    unsigned char b = p[i];
    uint32_t cp = 0;
    size_t len = 0;
    if (b < 0x80) cp = b, len = 1;
    else if (b >= 0xc2 && b <= 0xdf) cp = b & 0x1f, len = 2;
    else if (b >= 0xe0 && b <= 0xef) cp = b & 0x0f, len = 3;
    else if (b >= 0xf0 && b <= 0xf4) cp = b & 0x07, len = 4;
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; k++) {
      if ((p[i + k] & 0xc0) != 0x80) ok = false;
      else cp = (cp << 6) | (p[i + k] & 0x3f);
    }
    if (ok && len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ok = false;
    if (ok && len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ok = false;
    if (!ok) {
      units.push_back({0xfffd, CharClass::kOther, i, i + 1});
      i += 1;
      continue;
    }
    units.push_back({cp, classify(cp), i, i + len});
    i += len;
  }
  return units;
}

}  // namespace

std::vector<std::string_view> gpt2_pretokenize(std::string_view text) {
  const std::vector<Unit> u = decode_units(text);
  const size_t n = u.size();
  std::vector<std::string_view> pieces;
  auto emit = [&](size_t from, size_t to) {  // units [from, to)
    pieces.push_back(text.substr(u[from].begin, u[to - 1].end - u[from].begin));
  };
  auto run_of = [&](size_t from, CharClass cls) {
    size_t j = from;
    while (j < n && u[j].cls == cls) j++;
    return j;
  };
  auto run_of_other = [&](size_t from) {  // [^\s\p{L}\p{N}]+
    size_t j = from;
    while (j < n && u[j].cls == CharClass::kOther) j++;
    return j;
  };
  size_t i = 0;
  while (i < n) {
    // 's|'t|'re|'ve|'m|'ll|'d
    if (u[i].cp == '\'' && i + 1 < n) {
      uint32_t c1 = u[i + 1].cp, c2 = i + 2 < n ? u[i + 2].cp : 0;
      size_t len = 0;
      if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') len = 2;
      else if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) len = 3;
      if (len) {
        emit(i, i + len);
        i += len;
        continue;
      }
    }
    // ' ?' followed by a run of letters, numbers or other symbols.
    const size_t start = (u[i].cp == ' ' && i + 1 < n) ? i + 1 : i;
    bool matched = false;
    for (int attempt = 0; attempt < 2 && !matched; attempt++) {
      const size_t s = attempt == 0 ? start : i;
      if (attempt == 1 && s == start) break;
      if (s >= n) continue;
      size_t j = s;
      if (u[s].cls == CharClass::kLetter) j = run_of(s, CharClass::kLetter);
      else if (u[s].cls == CharClass::kNumber) j = run_of(s, CharClass::kNumber);
      else if (u[s].cls == CharClass::kOther) j = run_of_other(s);
      if (j > s) {
        emit(i, j);
        i = j;
        matched = true;
      }
    }
    if (matched) continue;
    // \s+(?!\S): the longest whitespace run not followed by a non-space; else \s+.
    size_t j = run_of(i, CharClass::kSpace);
    if (j < n && j - i > 1) j--;  // give the last space to the following word
    emit(i, j);
    i = j;
  }
  return pieces;
}

Gpt2Tokenizer::Gpt2Tokenizer(TokenizerFiles files) : Tokenizer(std::move(files)) {
  const std::string& enc_path = files_.model;
  const std::string& bpe_path = files_.merges;
  nlohmann::json enc;
  try {
    enc = nlohmann::json::parse(read_file(enc_path, "GPT-2 vocabulary"));
  } catch (const nlohmann::json::exception& e) {
    ANVIL_FAIL("GPT-2 vocabulary '{}' is not valid JSON: {}", enc_path, e.what());
  }
  ANVIL_CHECK(enc.is_object() && !enc.empty(), "GPT-2 vocabulary '{}' must be a JSON object of token -> id", enc_path);

  const std::unordered_map<uint32_t, uint8_t>& byte_of_cp = byte_chars().byte_of;

  decoder_.resize(enc.size());
  for (auto& [token, id_json] : enc.items()) {
    ANVIL_CHECK(id_json.is_number_integer(), "GPT-2 vocabulary '{}': id of '{}' is not an integer", enc_path, token);
    const int64_t id = id_json.get<int64_t>();
    ANVIL_CHECK(id >= 0 && id < static_cast<int64_t>(enc.size()), "GPT-2 vocabulary '{}': id {} out of range", enc_path, id);
    encoder_[token] = static_cast<int32_t>(id);
    // Map the printable stand-ins back to raw bytes for decoding.
    std::string raw;
    for (const Unit& unit : decode_units(token)) {
      auto it = byte_of_cp.find(unit.cp);
      if (it != byte_of_cp.end()) raw += static_cast<char>(it->second);
      else raw.append(token, unit.begin, unit.end - unit.begin);  // special tokens
    }
    decoder_[id] = raw;
  }
  auto eos = encoder_.find(files_.eos_token);
  ANVIL_CHECK(eos != encoder_.end(), "GPT-2 vocabulary '{}' has no end-of-text token {}", enc_path, files_.eos_token);
  eos_id_ = eos->second;

  // vocab.bpe: a version line, one merge per line, and a trailing newline. Like the reference,
  // drop the first and the last line, and key ranks by "first,second" (later merges win).
  const std::string bpe = read_file(bpe_path, "GPT-2 merges file");
  std::vector<std::string_view> lines;
  size_t pos = 0;
  while (true) {
    size_t nl = bpe.find('\n', pos);
    lines.emplace_back(std::string_view(bpe).substr(pos, nl == std::string::npos ? std::string::npos : nl - pos));
    if (nl == std::string::npos) break;
    pos = nl + 1;
  }
  ANVIL_CHECK(lines.size() > 2, "GPT-2 merges file '{}' has no merges", bpe_path);
  for (size_t k = 1; k + 1 < lines.size(); k++) {
    std::string_view line = lines[k];
    std::vector<std::string_view> parts;
    size_t a = 0;
    while (a < line.size()) {
      while (a < line.size() && (line[a] == ' ' || line[a] == '\t' || line[a] == '\r')) a++;
      size_t b = a;
      while (b < line.size() && line[b] != ' ' && line[b] != '\t' && line[b] != '\r') b++;
      if (b > a) parts.push_back(line.substr(a, b - a));
      a = b;
    }
    ANVIL_CHECK(parts.size() == 2, "GPT-2 merges file '{}' line {}: expected two symbols, found '{}'",
                bpe_path, k + 1, line);
    ranks_[std::string(parts[0]) + "," + std::string(parts[1])] = static_cast<int>(k - 1);
  }
}

void Gpt2Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) {
  std::string key(piece);
  auto& cache = cache_.local();
  auto hit = cache.find(key);
  if (hit != cache.end()) {
    out.insert(out.end(), hit->second.begin(), hit->second.end());
    return;
  }
  std::vector<std::string> word;
  for (unsigned char b : piece) word.push_back(byte_chars().of_byte[b]);
  std::string pair_key;
  while (word.size() > 1) {
    // The lowest-ranked adjacent pair; on equal ranks the reference keeps the later pair.
    int best_rank = INT_MAX;
    size_t best = 0;
    for (size_t k = 0; k + 1 < word.size(); k++) {
      pair_key.assign(word[k]).append(",").append(word[k + 1]);
      auto it = ranks_.find(pair_key);
      if (it != ranks_.end() && it->second <= best_rank) best_rank = it->second, best = k;
    }
    if (best_rank == INT_MAX) break;
    const std::string first = word[best], second = word[best + 1];
    std::vector<std::string> merged;
    merged.reserve(word.size());
    for (size_t k = 0; k < word.size();) {
      if (k + 1 < word.size() && word[k] == first && word[k + 1] == second) {
        merged.push_back(first + second);
        k += 2;
      } else {
        merged.push_back(std::move(word[k]));
        k += 1;
      }
    }
    word = std::move(merged);
  }
  std::vector<int32_t> ids;
  for (const std::string& sym : word) {
    auto it = encoder_.find(sym);
    ANVIL_CHECK(it != encoder_.end(), "GPT-2 vocabulary has no entry for BPE symbol '{}'", sym);
    ids.push_back(it->second);
  }
  out.insert(out.end(), ids.begin(), ids.end());
  if (cache.size() > (1u << 20)) cache.clear();  // bound memory on large corpora
  cache.emplace(std::move(key), std::move(ids));
}

std::vector<int32_t> Gpt2Tokenizer::encode(std::string_view text) {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3);
  for (std::string_view piece : gpt2_pretokenize(text)) encode_piece(piece, ids);
  return ids;
}

std::string Gpt2Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    ANVIL_CHECK(id >= 0 && id < static_cast<int32_t>(decoder_.size()), "token id {} is outside the "
                "vocabulary (0..{})", id, decoder_.size() - 1);
    out += decoder_[id];
  }
  return out;
}

// As transformers' GPT2Tokenizer reads it: vocab.json and merges.txt are the same files as
// OpenAI's encoder.json and vocab.bpe (merges.txt keeps its "#version" first line, which the
// reader skips); the end-of-text token is GPT-2's bos, eos and unk alike.
void Gpt2Tokenizer::write_hf_files(const std::string& dir, int model_max_length) const {
  write_file_atomic(dir + "/vocab.json", read_file(files_.model, "GPT-2 vocabulary"));
  write_file_atomic(dir + "/merges.txt", read_file(files_.merges, "GPT-2 merges file"));
  const std::string& eos = files_.eos_token;
  const nlohmann::ordered_json config = {{"tokenizer_class", "GPT2Tokenizer"},
                                         {"model_max_length", model_max_length},
                                         {"bos_token", eos},
                                         {"eos_token", eos},
                                         {"unk_token", eos},
                                         {"add_prefix_space", false},
                                         {"add_bos_token", false},
                                         {"clean_up_tokenization_spaces", false}};
  write_file_atomic(dir + "/tokenizer_config.json", config.dump(2) + "\n");
  const nlohmann::ordered_json special = {{"bos_token", eos}, {"eos_token", eos}, {"unk_token", eos}};
  write_file_atomic(dir + "/special_tokens_map.json", special.dump(2) + "\n");
}

}  // namespace anvil
