// Tokenizers as a choice, named as LLM Foundry's `tokenizer.name` names them: "gpt2" (GPT-2's own
// vocabulary, the files the setup script fetches; gpt2-medium, gpt2-large and gpt2-xl share it),
// or a local path: a directory holding GPT-2-style
// byte-level BPE files (transformers' vocab.json + merges.txt, or OpenAI's encoder.json +
// vocab.bpe), a directory holding a SentencePiece tokenizer.model, a directory holding only
// transformers' fast tokenizer (tokenizer.json, with tokenizer_config.json beside it), or a
// SentencePiece .model file. Where a directory holds several, the first of that list is read.
// Hub names other than gpt2 are an error: nothing is downloaded.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace anvil {

// GPT-2's BPE files, a SentencePiece model, or transformers' tokenizer.json (data/hf_tokenizer.h).
enum class TokenizerKind { kGpt2Bpe, kSentencePiece, kTokenizerJson };
const char* tokenizer_kind_name(TokenizerKind kind);  // "gpt2_bpe", "sentencepiece", "tokenizer_json"

// What a tokenizer name resolves to, found without building the tokenizer.
struct TokenizerFiles {
  std::string name;  // "gpt2", or the absolute path named
  TokenizerKind kind = TokenizerKind::kGpt2Bpe;
  // gpt2_bpe: the vocabulary and merges files; sentencepiece: model only; tokenizer_json: the
  // tokenizer.json as model, and config, tokenizer_config.json beside it ("" when there is none).
  std::string model, merges, config;
  std::string eos_token;      // gpt2_bpe: the end-of-text token (tokenizer_config.json's eos_token, if any)
  std::string sha256;         // the tokenizer's identity: of what it reads from its files
};
TokenizerFiles resolve_tokenizer(const std::string& name);

// Which tokenizer made a dataset: written beside each split's index.json by `anvil data prepare`
// (MosaicML streaming ignores the file) and compared with the training config's tokenizer.
struct TokenizerRecord {
  std::string name, kind, sha256;
  int vocab_size = 0;
  int32_t bos_id = -1, eos_id = -1;
};
inline constexpr const char* kTokenizerRecordFile = "tokenizer_record.json";
std::string tokenizer_record_json(const TokenizerRecord& r);
TokenizerRecord parse_tokenizer_record(std::string_view text, const std::string& where);
// The record in a dataset split directory, if it has one.
std::optional<TokenizerRecord> read_tokenizer_record(const std::string& split_dir);

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // The text's tokens alone, no special tokens. Any bytes: invalid UTF-8 is handled as the
  // tokenizer's reference library handles it. Threads may encode at once (OpenMP threads: a
  // tokenizer's caches are per thread, data/per_thread.h).
  virtual std::vector<int32_t> encode(std::string_view text) = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;  // -1 where documents do not start with one (GPT-2)
  virtual int32_t eos_id() const = 0;
  // The files transformers reads the tokenizer from (an export), into dir.
  virtual void write_hf_files(const std::string& dir, int model_max_length) const = 0;

  // A training document: BOS where the tokenizer has one (as Llama's adds it), the text, EOS
  // (documents are packed back to back, separated by it); nothing for a text without tokens.
  std::vector<int32_t> encode_document(std::string_view text);
  // A prompt to continue: BOS where the tokenizer has one, then the text; an empty GPT-2 prompt
  // is its end-of-text token, which starts a new document.
  std::vector<int32_t> encode_prompt(std::string_view text);

  const TokenizerFiles& files() const { return files_; }
  TokenizerRecord record() const;

 protected:
  explicit Tokenizer(TokenizerFiles files) : files_(std::move(files)) {}
  TokenizerFiles files_;
};

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& name);
std::unique_ptr<Tokenizer> load_tokenizer(const TokenizerFiles& files);

// Where GPT-2's own vocabulary lives: $ANVIL_TOKENIZER_DIR, else the directory the setup script
// fills (fixed at build time).
std::string default_gpt2_vocabulary_dir();

// Whether this build can read SentencePiece models (libsentencepiece was found when it was built).
bool sentencepiece_available();

}  // namespace anvil
