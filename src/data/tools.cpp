#include "data/tools.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fmt/ranges.h>

#include "core/error.h"
#include "core/fs.h"
#include "data/finetuning.h"
#include "data/loader.h"
#include "data/remote.h"
#include "data/streaming.h"

namespace anvil {
namespace fs = std::filesystem;

std::string inspect_dataset(const std::string& dir, const std::string& tokenizer) {
  StreamingOptions opt;
  opt.download_threads = 1;
  StreamingDataset data({{"inspect", "", dir, "", 1.0}}, opt);
  const MdsIndex& index = data.index(0);
  std::string out = fmt::format("dataset:     {}\n", dir);
  int64_t stored = 0, raw = 0, tokens = 0, min_len = INT64_MAX, max_len = 0, response_tokens = 0, turns = 0;
  const bool finetuning = data.kind() == MdsSampleKind::kTurns;
  std::vector<int32_t> buf(1 << 20);
  std::vector<int32_t> ids;  // sample 0's tokens
  std::string sample0_layout;
  for (int64_t id = 0; id < data.num_samples(); id++) {
    int64_t n = 0;
    if (finetuning) {
      const std::vector<Turn> t = parse_turns_json(data.sample_json(id), fmt::format("{} sample {}", dir, id));
      for (const Turn& turn : t) {
        n += static_cast<int64_t>(turn.prompt.size() + turn.response.size());
        response_tokens += static_cast<int64_t>(turn.response.size());
        if (id == 0) {
          ids.insert(ids.end(), turn.prompt.begin(), turn.prompt.end());
          ids.insert(ids.end(), turn.response.begin(), turn.response.end());
          sample0_layout += fmt::format("{}{} prompt + {} response", sample0_layout.empty() ? "" : ", ",
                                        turn.prompt.size(), turn.response.size());
        }
      }
      turns += static_cast<int64_t>(t.size());
    } else {
      n = data.tokens(id, buf.data(), 0);  // reads and verifies the shard, decodes the length
    }
    tokens += n;
    min_len = std::min(min_len, n);
    max_len = std::max(max_len, n);
  }
  for (const auto& sh : index.shards) stored += sh.stored().bytes, raw += sh.raw.bytes;
  const auto& first = index.shards.front();
  out += fmt::format("format:      MDS v2, columns {} as {}\n", fmt::join(first.column_names, ", "),
                     fmt::join(first.column_encodings, ", "));
  out += fmt::format("shards:      {} ({:.1f} MiB stored, {:.1f} MiB raw; compression {}; hashes {}, verified)\n",
                     index.shards.size(), stored / 1048576.0, raw / 1048576.0,
                     first.compression.empty() ? "none" : first.compression,
                     first.hashes.empty() ? "none" : fmt::format("{}", fmt::join(first.hashes, ", ")));
  out += fmt::format("samples:     {}{}\n", data.num_samples(),
                     finetuning ? fmt::format(" fine-tuning examples ({} turns)", turns) : "");
  out += fmt::format("tokens:      {} ({} to {} per sample{})\n", tokens, min_len, max_len,
                     finetuning ? fmt::format("; {} in responses", response_tokens) : "");
  if (!finetuning) {
    const int64_t n = data.tokens(0, buf.data(), static_cast<int64_t>(buf.size()));
    ids.assign(buf.begin(), buf.begin() + std::min<int64_t>(n, static_cast<int64_t>(buf.size())));
  }
  const std::optional<TokenizerRecord>& record = data.tokenizer_record(0);
  if (record)
    out += fmt::format("tokenizer:   {} ({}, vocabulary {}, sha256 {})\n", record->name, record->kind, record->vocab_size,
                       record->sha256.substr(0, 16));
  else
    out += "tokenizer:   not recorded (the dataset was not written by anvil data prepare)\n";
  // The shards' report stands without the tokenizer: one that is gone only leaves the text undecoded.
  std::string text;
  try {
    text = load_tokenizer(!tokenizer.empty() ? tokenizer : record ? record->name : "gpt2")->decode(ids);
  } catch (const Error& e) {
    text = fmt::format("(not decoded: {}; name a tokenizer with --tokenizer)", e.what());
  }
  if (text.size() > 400) text = text.substr(0, 400) + " [...]";
  out += fmt::format("sample 0:    {} tokens{}: {}\n", ids.size(),
                     sample0_layout.empty() ? "" : " (" + sample0_layout + ")", fmt::join(std::vector<int32_t>(ids.begin(), ids.begin() + std::min<size_t>(ids.size(), 12)), " "));
  out += "decoded:\n" + text + "\n";
  return out;
}

BenchDataResult bench_data(const BenchDataOptions& opt) {
  ANVIL_CHECK(opt.seq_len > 0 && opt.global_batch > 0, "--seq-len and --batch must be positive");
  std::string cache = opt.cache;
  const bool remote = is_remote_url(opt.location);
  bool own_cache = false;
  if (remote && cache.empty()) {
    cache = (fs::temp_directory_path() / fmt::format("anvil-bench-data.{}", ::getpid())).string();
    own_cache = true;
  }
  auto pass = [&] {
    StreamingDataset data({{"bench", remote ? opt.location : "", remote ? cache : opt.location, "", 1.0}},
                          StreamingOptions{});
    OrderSpec spec;
    spec.streams.push_back({data.shard_samples(0), 1.0});
    LoaderOptions lo;
    lo.global_batch = opt.global_batch;
    lo.seq_len = opt.seq_len;
    lo.num_workers = opt.num_workers;
    TokenLoader loader(data, spec, lo);
    const int64_t steps = opt.steps > 0 ? opt.steps : loader.steps_per_epoch();
    std::vector<int32_t> in(static_cast<size_t>(opt.global_batch * opt.seq_len)), tgt(in.size());
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t s = 0; s < steps; s++) loader.next(in.data(), tgt.data());
    BenchDataPass p;
    p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    p.steps = steps;
    p.tokens = steps * opt.global_batch * opt.seq_len;
    p.tokens_per_s = static_cast<double>(p.tokens) / p.seconds;
    p.bytes_downloaded = data.bytes_downloaded();
    return p;
  };
  BenchDataResult r;
  try {
    r.cold = pass();
    r.warm = pass();
  } catch (...) {
    if (own_cache) fs::remove_all(cache);
    throw;
  }
  if (own_cache) fs::remove_all(cache);
  return r;
}

}  // namespace anvil
