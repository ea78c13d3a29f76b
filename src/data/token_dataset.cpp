// Token shards: prepared into a temporary directory that is renamed at the end; every shard read
// back is checked against the index (magic, version, size, checksum).
#include "data/token_dataset.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "core/progress.h"
#include "data/gpt2_tokenizer.h"

namespace anvil {
namespace fs = std::filesystem;
namespace {

constexpr char kMagic[8] = {'A', 'N', 'V', 'T', 'O', 'K', '0', '1'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 24;

std::vector<std::string> list_inputs(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const std::string& in : inputs) {
    std::error_code ec;
    if (fs::is_directory(in, ec)) {
      std::vector<std::string> found;
      for (auto& e : fs::recursive_directory_iterator(in, ec))
        if (e.is_regular_file()) found.push_back(e.path().string());
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::is_regular_file(in, ec)) {
      files.push_back(in);
    } else {
      ANVIL_FAIL("input '{}' does not exist (expected a text file or a directory of them)", in);
    }
  }
  return files;
}

// Collects one split's tokens into shards inside dir.
class ShardWriter {
 public:
  ShardWriter(std::string dir, std::string split, int64_t shard_tokens)
      : dir_(std::move(dir)), split_(std::move(split)), shard_tokens_(shard_tokens) {}
  void add(const std::vector<int32_t>& ids) {
    for (int32_t id : ids) {
      buf_.push_back(static_cast<uint16_t>(id));
      if (static_cast<int64_t>(buf_.size()) == shard_tokens_) flush();
    }
    total_ += static_cast<int64_t>(ids.size());
  }
  void flush() {
    if (buf_.empty()) return;
    const std::string name = fmt::format("{}-{:05d}.tok", split_, shards_.size());
    AtomicFile f(dir_ + "/" + name);
    uint32_t version = kVersion, width = 2;
    uint64_t count = buf_.size();
    f.write(kMagic, 8);
    f.write(&version, 4);
    f.write(&width, 4);
    f.write(&count, 8);
    f.write(buf_.data(), buf_.size() * 2);
    f.commit();
    shards_.push_back({{"file", name}, {"tokens", count}, {"xxh3", hex64(hash64(buf_.data(), buf_.size() * 2))}});
    buf_.clear();
  }
  nlohmann::json index(int64_t documents) const {
    return {{"tokens", total_}, {"documents", documents}, {"shards", shards_}};
  }
  int64_t total() const { return total_; }

 private:
  std::string dir_, split_;
  int64_t shard_tokens_, total_ = 0;
  std::vector<uint16_t> buf_;
  nlohmann::json shards_ = nlohmann::json::array();
};

}  // namespace

PrepareSummary prepare_token_dataset(const PrepareOptions& opt) {
  ANVIL_CHECK(!opt.inputs.empty(), "no inputs given: name text files or directories to prepare");
  ANVIL_CHECK(!opt.out_dir.empty(), "no output directory given (--out DIR)");
  ANVIL_CHECK(opt.val_fraction >= 0 && opt.val_fraction < 1, "--val-fraction must be in [0, 1), got {}", opt.val_fraction);
  ANVIL_CHECK(opt.shard_tokens > 0, "--shard-tokens must be positive");
  ANVIL_CHECK(!fs::exists(opt.out_dir), "output directory '{}' already exists; remove it or choose another --out",
              opt.out_dir);
  Gpt2Tokenizer tok(opt.tokenizer_dir);
  ANVIL_CHECK(tok.vocab_size() <= 65536, "vocabulary of {} tokens does not fit the 16-bit shards", tok.vocab_size());
  const std::vector<std::string> files = list_inputs(opt.inputs);
  ANVIL_CHECK(!files.empty(), "no input files found in {}", fmt::join(opt.inputs, ", "));

  int64_t total_bytes = 0;
  for (const auto& f : files) total_bytes += static_cast<int64_t>(fs::file_size(f));
  ANVIL_CHECK(total_bytes > 0, "the corpus is empty: {} file(s) with no text in {}", files.size(),
              fmt::join(opt.inputs, ", "));

  const fs::path out(opt.out_dir);
  const std::string tmp = (out.parent_path() / fmt::format(".{}.tmp.{}", out.filename().string(), ::getpid())).string();
  fs::remove_all(tmp);
  make_dirs(tmp);
  PrepareSummary sum;
  try {
    ShardWriter train(tmp, "train", opt.shard_tokens), val(tmp, "val", opt.shard_tokens);
    int64_t train_docs = 0, val_docs = 0;
    Progress bar("prepare", total_bytes, "bytes");
    for (size_t d = 0; d < files.size(); d++) {
      const std::string text = read_file(files[d], "input file");
      std::vector<int32_t> ids = tok.encode(text);
      if (ids.empty()) continue;
      ids.push_back(tok.eot_id());
      // Document d goes to val when the running count of val documents, d·f rounded down,
      // steps up: val documents are spread evenly through the corpus.
      const bool to_val = opt.val_fraction > 0 &&
                          static_cast<int64_t>((d + 1) * opt.val_fraction) > static_cast<int64_t>(d * opt.val_fraction);
      (to_val ? val : train).add(ids);
      (to_val ? val_docs : train_docs)++;
      sum.bytes += static_cast<int64_t>(text.size());
      bar.update(sum.bytes, fmt::format("{} docs, {} tokens", train_docs + val_docs, train.total() + val.total()));
    }
    bar.finish(fmt::format("{} docs, {} tokens", train_docs + val_docs, train.total() + val.total()));
    ANVIL_CHECK(train.total() + val.total() > 0, "the corpus is empty: no tokens in {}", fmt::join(opt.inputs, ", "));
    ANVIL_CHECK(train.total() > 0, "no document went to the train split: lower --val-fraction ({})", opt.val_fraction);
    ANVIL_CHECK(opt.val_fraction == 0 || val.total() > 0,
                "no document went to the val split: {} document(s) are too few for --val-fraction {}; give more "
                "files or --val-fraction 0", files.size(), opt.val_fraction);
    train.flush();
    val.flush();
    nlohmann::json index = {{"format", "anvil-tokens"}, {"version", kVersion}, {"tokenizer", "gpt2"},
                            {"vocab_size", tok.vocab_size()}, {"eot_id", tok.eot_id()}, {"token_bytes", 2},
                            {"splits", {{"train", train.index(train_docs)}, {"val", val.index(val_docs)}}}};
    write_file_atomic(tmp + "/index.json", index.dump(2) + "\n");
    sum.documents = train_docs + val_docs;
    sum.train_tokens = train.total();
    sum.val_tokens = val.total();
    fs::rename(tmp, out);
    fsync_dir(out.parent_path().string());
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  return sum;
}

TokenDataset::TokenDataset(const std::string& dir, const std::string& split) {
  const std::string index_path = dir + "/index.json";
  ANVIL_CHECK(fs::is_regular_file(index_path), "dataset '{}' has no index.json (prepare it with `anvil data prepare`)", dir);
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(read_file(index_path, "dataset index"));
    ANVIL_CHECK(index.at("format") == "anvil-tokens", "'{}' is not an anvil token dataset index", index_path);
    ANVIL_CHECK(index.at("version").get<int>() <= static_cast<int>(kVersion),
                "'{}' has format version {}, newer than this anvil reads ({})", index_path, index.at("version").get<int>(), kVersion);
    vocab_size_ = index.at("vocab_size").get<int>();
    ANVIL_CHECK(index.at("splits").contains(split), "dataset '{}' has no split '{}'", dir, split);
    for (auto& shard : index.at("splits").at(split).at("shards")) {
      const std::string path = dir + "/" + shard.at("file").get<std::string>();
      const std::string bytes = read_file(path, "token shard");
      ANVIL_CHECK(bytes.size() >= kHeaderBytes && std::memcmp(bytes.data(), kMagic, 8) == 0,
                  "token shard '{}' is not an anvil shard (bad magic)", path);
      uint32_t version, width;
      uint64_t count;
      std::memcpy(&version, bytes.data() + 8, 4);
      std::memcpy(&width, bytes.data() + 12, 4);
      std::memcpy(&count, bytes.data() + 16, 8);
      ANVIL_CHECK(version == kVersion && width == 2, "token shard '{}' has version {} / width {}, expected {} / 2",
                  path, version, width, kVersion);
      ANVIL_CHECK(bytes.size() == kHeaderBytes + count * 2 && count == shard.at("tokens").get<uint64_t>(),
                  "token shard '{}' is truncated or does not match index.json ({} bytes for {} tokens)", path,
                  bytes.size(), count);
      const char* data = bytes.data() + kHeaderBytes;
      ANVIL_CHECK(hex64(hash64(data, count * 2)) == shard.at("xxh3").get<std::string>(),
                  "token shard '{}' is corrupt: its checksum does not match index.json", path);
      const size_t base = tokens_.size();
      tokens_.resize(base + count);
      for (uint64_t i = 0; i < count; i++) {
        uint16_t t;
        std::memcpy(&t, data + 2 * i, 2);
        tokens_[base + i] = t;
      }
    }
  } catch (const nlohmann::json::exception& e) {
    ANVIL_FAIL("dataset index '{}' is malformed: {}", index_path, e.what());
  }
}

int64_t TokenDataset::num_samples(int seq_len) const {
  return tokens_.size() > 1 ? (static_cast<int64_t>(tokens_.size()) - 1) / seq_len : 0;
}

void TokenDataset::sample(int64_t i, int seq_len, int32_t* input, int32_t* target) const {
  const int32_t* p = tokens_.data() + i * seq_len;
  std::copy_n(p, seq_len, input);
  std::copy_n(p + 1, seq_len, target);
}

}  // namespace anvil
