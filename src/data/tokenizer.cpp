#include "data/tokenizer.h"

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "core/sha256.h"
#include "data/gpt2_tokenizer.h"
#include "data/hf_tokenizer.h"
#ifdef ANVIL_HAVE_SENTENCEPIECE
#include "data/sentencepiece_tokenizer.h"
#endif

#ifndef ANVIL_DEFAULT_TOKENIZER_DIR
#define ANVIL_DEFAULT_TOKENIZER_DIR ""
#endif

namespace anvil {
namespace fs = std::filesystem;
namespace {

constexpr const char* kGpt2EndOfText = "<|endoftext|>";

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

// tokenizer_config.json's eos_token: a string, or transformers' AddedToken {"content": ...}.
std::string eos_token_of(const fs::path& dir) {
  const fs::path path = dir / "tokenizer_config.json";
  if (!is_file(path)) return kGpt2EndOfText;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path.string(), "tokenizer config"));
  } catch (const nlohmann::json::exception& e) {
    ANVIL_FAIL("'{}' is not valid JSON: {}", path.string(), e.what());
  }
  if (!j.is_object() || !j.contains("eos_token") || j["eos_token"].is_null()) return kGpt2EndOfText;
  const nlohmann::json& eos = j["eos_token"];
  if (eos.is_string()) return eos.get<std::string>();
  ANVIL_CHECK(eos.is_object() && eos.contains("content") && eos["content"].is_string(),
              "'{}': eos_token must be a string or an object with a \"content\" string", path.string());
  return eos["content"].get<std::string>();
}

void hash_bytes(Sha256& h, const std::string& bytes) {
  const uint64_t n = bytes.size();
  h.update(&n, sizeof n);
  h.update(bytes.data(), bytes.size());
}

// A GPT-2-style vocabulary's identity is what the tokenizer reads, not the files' bytes: the
// token -> id map (however the JSON is laid out) and the merges it uses (the lines between the
// version line and the last, as both GPT-2 readers take them).
void hash_gpt2_bpe(Sha256& h, const TokenizerFiles& f) {
  try {
    hash_bytes(h, nlohmann::json::parse(read_file(f.model, "GPT-2 vocabulary")).dump());
  } catch (const nlohmann::json::exception& e) {
    ANVIL_FAIL("GPT-2 vocabulary '{}' is not valid JSON: {}", f.model, e.what());
  }
  const std::string merges = read_file(f.merges, "GPT-2 merges file");
  const size_t first = merges.find('\n'), last = merges.rfind('\n');
  hash_bytes(h, first == std::string::npos || last <= first ? "" : merges.substr(first + 1, last - first - 1));
  hash_bytes(h, f.eos_token);
}

// A tokenizer.json's identity: the file's bytes (transformers writes it the same way each time;
// parsing 10 MB of JSON only to hash it would double a tokenizer's load time), and the tokenizer
// config's keys that choose the special tokens.
void hash_tokenizer_json(Sha256& h, const TokenizerFiles& f) {
  hash_bytes(h, read_file(f.model, "tokenizer.json"));
  nlohmann::json special = nlohmann::json::object();
  if (!f.config.empty()) {
    nlohmann::json config;
    try {
      config = nlohmann::json::parse(read_file(f.config, "tokenizer config"));
    } catch (const nlohmann::json::exception& e) {
      ANVIL_FAIL("'{}' is not valid JSON: {}", f.config, e.what());
    }
    for (const char* key : {"bos_token", "eos_token", "add_bos_token"})
      if (config.is_object() && config.contains(key)) special[key] = config[key];
  }
  hash_bytes(h, special.dump());
}

// OpenAI's GPT-2 sizes share one published vocabulary: their hub names are GPT-2's tokenizer.
bool names_gpt2_vocabulary(std::string name) {
  if (name.rfind("openai-community/", 0) == 0) name = name.substr(17);
  return name == "gpt2" || name == "gpt2-medium" || name == "gpt2-large" || name == "gpt2-xl";
}

}  // namespace

const char* tokenizer_kind_name(TokenizerKind kind) {
  switch (kind) {
    case TokenizerKind::kGpt2Bpe: return "gpt2_bpe";
    case TokenizerKind::kSentencePiece: return "sentencepiece";
    case TokenizerKind::kTokenizerJson: return "tokenizer_json";
  }
  return "?";
}

std::string default_gpt2_vocabulary_dir() {
  const char* env = std::getenv("ANVIL_TOKENIZER_DIR");
  return env && *env ? env : ANVIL_DEFAULT_TOKENIZER_DIR;
}

bool sentencepiece_available() {
#ifdef ANVIL_HAVE_SENTENCEPIECE
  return true;
#else
  return false;
#endif
}

TokenizerFiles resolve_tokenizer(const std::string& given) {
  ANVIL_CHECK(!given.empty(), "no tokenizer named (expected gpt2, a tokenizer directory, or a SentencePiece .model file)");
  std::error_code ec;
  // "gpt2" is always GPT-2's own; its siblings' hub names are, unless a local path has that name.
  const std::string name = given == "gpt2" || (names_gpt2_vocabulary(given) && !fs::exists(given, ec)) ? "gpt2" : given;
  TokenizerFiles f;
  f.name = name == "gpt2" ? name : fs::absolute(name, ec).lexically_normal().string();
  const fs::path dir = name == "gpt2" ? fs::path(default_gpt2_vocabulary_dir()) : fs::path(name);
  if (name == "gpt2" || fs::is_directory(dir, ec)) {
    if (name != "gpt2" && is_file(dir / "tokenizer.model")) {
      f.kind = TokenizerKind::kSentencePiece;
      f.model = (dir / "tokenizer.model").string();
    } else if (name != "gpt2" && is_file(dir / "vocab.json") && is_file(dir / "merges.txt")) {
      f.model = (dir / "vocab.json").string();
      f.merges = (dir / "merges.txt").string();
      f.eos_token = eos_token_of(dir);
    } else if (is_file(dir / "encoder.json") && is_file(dir / "vocab.bpe")) {
      f.model = (dir / "encoder.json").string();
      f.merges = (dir / "vocab.bpe").string();
      f.eos_token = kGpt2EndOfText;
    } else if (name != "gpt2" && is_file(dir / "tokenizer.json")) {
      f.kind = TokenizerKind::kTokenizerJson;
      f.model = (dir / "tokenizer.json").string();
      if (is_file(dir / "tokenizer_config.json")) f.config = (dir / "tokenizer_config.json").string();
    } else if (name == "gpt2") {
      ANVIL_FAIL("GPT-2's vocabulary is not in '{}' (expected encoder.json and vocab.bpe): run scripts/setup.sh, or "
                 "point ANVIL_TOKENIZER_DIR at a directory holding them", dir.string());
    } else {
      ANVIL_FAIL("tokenizer directory '{}' holds no tokenizer anvil reads: expected tokenizer.model (SentencePiece), "
                 "vocab.json + merges.txt or encoder.json + vocab.bpe (GPT-2 byte-level BPE), or tokenizer.json "
                 "(transformers' fast format)", name);
    }
  } else if (is_file(dir)) {
    f.kind = TokenizerKind::kSentencePiece;
    f.model = name;
  } else {
    ANVIL_FAIL("tokenizer '{}' is neither gpt2 nor a local tokenizer directory or SentencePiece .model file (anvil "
               "does not download from the Hugging Face hub: fetch the tokenizer's files and name their directory)",
               given);
  }
  Sha256 h;
  const std::string kind = tokenizer_kind_name(f.kind);
  h.update(kind.data(), kind.size() + 1);
  if (f.kind == TokenizerKind::kGpt2Bpe) {
    hash_gpt2_bpe(h, f);
  } else if (f.kind == TokenizerKind::kTokenizerJson) {
    hash_tokenizer_json(h, f);
  } else {
    hash_bytes(h, read_file(f.model, "SentencePiece model"));
  }
  f.sha256 = h.hex();
  return f;
}

std::unique_ptr<Tokenizer> load_tokenizer(const TokenizerFiles& files) {
  if (files.kind == TokenizerKind::kGpt2Bpe) return std::make_unique<Gpt2Tokenizer>(files);
  if (files.kind == TokenizerKind::kTokenizerJson) return make_hf_tokenizer(files);
#ifdef ANVIL_HAVE_SENTENCEPIECE
  return make_sentencepiece_tokenizer(files);
#else
  ANVIL_FAIL("'{}' is a SentencePiece model, and this anvil was built without libsentencepiece: install "
             "libsentencepiece-dev (scripts/setup.sh does) and rebuild", files.name);
#endif
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& name) { return load_tokenizer(resolve_tokenizer(name)); }

std::vector<int32_t> Tokenizer::encode_document(std::string_view text) {
  const std::vector<int32_t> body = encode(text);
  if (body.empty()) return {};
  std::vector<int32_t> ids;
  if (bos_id() >= 0) ids.push_back(bos_id());
  ids.insert(ids.end(), body.begin(), body.end());
  ids.push_back(eos_id());
  return ids;
}

std::vector<int32_t> Tokenizer::encode_prompt(std::string_view text) {
  std::vector<int32_t> ids;
  if (bos_id() >= 0) ids.push_back(bos_id());
  const std::vector<int32_t> body = encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  if (ids.empty()) ids.push_back(eos_id());
  return ids;
}

TokenizerRecord Tokenizer::record() const {
  return {files_.name, tokenizer_kind_name(files_.kind), files_.sha256, vocab_size(), bos_id(), eos_id()};
}

std::string tokenizer_record_json(const TokenizerRecord& r) {
  const nlohmann::ordered_json j = {{"name", r.name}, {"kind", r.kind}, {"sha256", r.sha256},
                                    {"vocab_size", r.vocab_size}, {"bos_id", r.bos_id}, {"eos_id", r.eos_id}};
  return j.dump(2) + "\n";
}

TokenizerRecord parse_tokenizer_record(std::string_view text, const std::string& where) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    TokenizerRecord r;
    r.name = j.at("name").get<std::string>();
    r.kind = j.at("kind").get<std::string>();
    r.sha256 = j.at("sha256").get<std::string>();
    r.vocab_size = j.at("vocab_size").get<int>();
    r.bos_id = j.at("bos_id").get<int32_t>();
    r.eos_id = j.at("eos_id").get<int32_t>();
    ANVIL_CHECK(r.vocab_size > 0, "{}: vocab_size must be positive", where);
    return r;
  } catch (const nlohmann::json::exception& e) {
    ANVIL_FAIL("{}: not a tokenizer record (expected name, kind, sha256, vocab_size, bos_id, eos_id): {}", where,
               e.what());
  }
}

std::optional<TokenizerRecord> read_tokenizer_record(const std::string& split_dir) {
  const std::string path = split_dir + "/" + kTokenizerRecordFile;
  if (!is_file(path)) return std::nullopt;
  return parse_tokenizer_record(read_file(path, "tokenizer record"), path);
}

}  // namespace anvil
