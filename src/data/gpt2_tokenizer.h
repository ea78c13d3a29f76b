// GPT-2's byte-level BPE tokenizer, reproducing the npm package gpt-3-encoder (the reference)
// id for id: the same pre-tokenising pattern with JavaScript's Unicode classes, and the same
// merge choice, including its lookup of merge ranks by the pair joined with a comma. It reads any
// vocabulary and merges in GPT-2's file format (transformers' vocab.json + merges.txt, OpenAI's
// encoder.json + vocab.bpe). Input is arbitrary bytes: invalid UTF-8 is split byte by byte and
// still round-trips.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/per_thread.h"
#include "data/tokenizer.h"

namespace anvil {

class Gpt2Tokenizer : public Tokenizer {
 public:
  explicit Gpt2Tokenizer(TokenizerFiles files);

  std::vector<int32_t> encode(std::string_view text) override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int vocab_size() const override { return static_cast<int>(decoder_.size()); }
  int32_t bos_id() const override { return -1; }
  int32_t eos_id() const override { return eos_id_; }
  void write_hf_files(const std::string& dir, int model_max_length) const override;

 private:
  void encode_piece(std::string_view piece, std::vector<int32_t>& out);

  std::unordered_map<std::string, int32_t> encoder_;  // byte-mapped token text -> id
  std::vector<std::string> decoder_;                   // id -> raw bytes
  std::unordered_map<std::string, int> ranks_;         // "first,second" -> merge rank
  PerThread<std::unordered_map<std::string, std::vector<int32_t>>> cache_;
  int32_t eos_id_ = -1;
};

// Splits text into the pieces GPT-2's pattern matches, as byte ranges (exposed for tests):
// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
std::vector<std::string_view> gpt2_pretokenize(std::string_view text);

}  // namespace anvil
