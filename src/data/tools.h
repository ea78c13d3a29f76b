// `anvil data inspect` and `anvil bench data`.
#pragma once
#include <cstdint>
#include <string>

namespace anvil {

// A report on an MDS dataset directory: shards, samples, tokens, compression, hashes (all
// verified), the tokenizer that made it, and the first sample decoded with `tokenizer` ("": the
// recorded one, else gpt2).
std::string inspect_dataset(const std::string& dir, const std::string& tokenizer);

struct BenchDataOptions {
  std::string location;  // a dataset directory, or a remote (s3://, http(s)://)
  std::string cache;     // cache directory for a remote ("" = a fresh temporary one)
  int seq_len = 256;
  int64_t global_batch = 8;
  int num_workers = 1;
  int64_t steps = 0;     // 0: one epoch
};

struct BenchDataPass {
  int64_t steps = 0, tokens = 0, bytes_downloaded = 0;
  double seconds = 0, tokens_per_s = 0;
};

struct BenchDataResult {
  BenchDataPass cold, warm;  // the first pass (downloads), and a second one over the same cache
};

BenchDataResult bench_data(const BenchDataOptions& opt);

}  // namespace anvil
