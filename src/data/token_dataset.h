// A tokenized dataset as `anvil data prepare` writes it: a directory with index.json and token
// shards per split. Each input file is one document; documents are tokenized, followed by
// <|endoftext|>, and assigned to train or val. (The MDS format of the data work replaces this.)
//
// Shard file: "ANVTOK01" (8 bytes), u32 version = 1, u32 bytes per token (2 or 4), u64 token
// count, then the tokens, little-endian. index.json lists shards with their xxh3-64 checksums.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace anvil {

struct PrepareOptions {
  std::vector<std::string> inputs;  // files and directories (read recursively, in name order)
  std::string out_dir;
  std::string tokenizer_dir;
  double val_fraction = 0.05;
  int64_t shard_tokens = int64_t{1} << 27;
};

struct PrepareSummary {
  int64_t documents = 0, train_tokens = 0, val_tokens = 0, bytes = 0;
};

// Writes the dataset into a temporary directory and renames it into place: a failure leaves
// nothing under out_dir. Refuses to replace an existing out_dir.
PrepareSummary prepare_token_dataset(const PrepareOptions& opt);

class TokenDataset {
 public:
  // Loads every shard of a split, verifying magic, version, sizes and checksums.
  TokenDataset(const std::string& dir, const std::string& split);

  int64_t num_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  int vocab_size() const { return vocab_size_; }
  // Non-overlapping windows of seq_len + 1 tokens (inputs and their next-token targets).
  int64_t num_samples(int seq_len) const;
  // input (seq_len) = tokens [i·seq_len, (i+1)·seq_len), target = the same shifted by one.
  void sample(int64_t i, int seq_len, int32_t* input, int32_t* target) const;

 private:
  std::vector<int32_t> tokens_;
  int vocab_size_ = 0;
};

}  // namespace anvil
