// Data preparation: documents are read in a fixed order (inputs as given, directories sorted by
// name, JSON lines in file order) and assigned to splits by position, so the output depends only
// on the inputs and the options.
#include "data/prepare.h"

#include <algorithm>
#include <filesystem>
#include <fmt/ranges.h>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "core/progress.h"
#include "data/tokenizer.h"

namespace anvil {
namespace fs = std::filesystem;
namespace {

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
      ANVIL_FAIL("input '{}' does not exist (expected a text or JSONL file, or a directory of them)", in);
    }
  }
  return files;
}

bool is_jsonl(const std::string& path) {
  const std::string ext = fs::path(path).extension().string();
  return ext == ".jsonl" || ext == ".json" || ext == ".ndjson";
}

// One split's token stream, cut into samples of exactly seq_len tokens.
class SplitPacker {
 public:
  SplitPacker(std::string dir, int seq_len, const MdsWriterOptions& opt, std::string tokenizer_record)
      : dir_(std::move(dir)), seq_len_(seq_len), opt_(opt), tokenizer_record_(std::move(tokenizer_record)) {}
  template <typename It>
  void add(It first, It last) {
    for (; first != last; ++first) {
      buf_.push_back(*first);
      if (static_cast<int>(buf_.size()) == seq_len_) {
        if (!writer_) {
          make_dirs(dir_);
          writer_.emplace(dir_, opt_);
        }
        writer_->write_tokens(buf_.data(), seq_len_);
        buf_.clear();
        samples_++;
      }
    }
  }
  int64_t finish() {
    if (!writer_) return 0;
    write_file_atomic(dir_ + "/" + kTokenizerRecordFile, tokenizer_record_);
    return writer_->finish() + static_cast<int64_t>(tokenizer_record_.size());
  }
  int64_t samples() const { return samples_; }
  int64_t leftover() const { return static_cast<int64_t>(buf_.size()); }

 private:
  std::string dir_;
  int seq_len_;
  MdsWriterOptions opt_;
  std::string tokenizer_record_;
  std::optional<MdsWriter> writer_;
  std::vector<int32_t> buf_;
  int64_t samples_ = 0;
};

// One reading of the corpus into tmp/train and tmp/val. With train_tokens < 0, documents are
// assigned to the splits by position (document d goes to val when d·f rounded down steps up at
// d + 1, so val documents are spread evenly); otherwise the first train_tokens tokens of the
// stream are train and the rest val.
PrepareSummary prepare_pass(const PrepareOptions& opt, Tokenizer& tok, const std::vector<std::string>& files,
                            int64_t total_bytes, const std::string& record, int64_t train_tokens, const std::string& tmp) {
  std::error_code ec;
  fs::remove_all(tmp, ec);
  make_dirs(tmp);
  PrepareSummary sum;
  SplitPacker train(tmp + "/train", opt.max_seq_len, opt.mds, record);
  SplitPacker val(tmp + "/val", opt.max_seq_len, opt.mds, record);
  Progress bar(train_tokens < 0 ? "prepare" : "prepare (val by tokens)", total_bytes, "B");
  int64_t done_bytes = 0;
  // Documents are tokenized a batch at a time on every thread, then packed in their order: the
  // dataset is the same for any number of threads.
  std::vector<std::string> batch;
  size_t batch_bytes = 0;
  std::vector<std::vector<int32_t>> batch_ids;
  auto pack = [&](const std::vector<int32_t>& ids) {
    if (ids.empty()) return;
    const int64_t d = sum.documents++;
    if (train_tokens >= 0) {
      const size_t to_train = static_cast<size_t>(std::clamp<int64_t>(train_tokens - sum.tokens, 0, ids.size()));
      train.add(ids.begin(), ids.begin() + to_train);
      val.add(ids.begin() + to_train, ids.end());
    } else {
      const bool to_val = opt.val_fraction > 0 && static_cast<int64_t>((d + 1) * opt.val_fraction) >
                                                      static_cast<int64_t>(d * opt.val_fraction);
      (to_val ? val : train).add(ids.begin(), ids.end());
    }
    sum.tokens += static_cast<int64_t>(ids.size());
  };
  auto flush = [&] {
    batch_ids.assign(batch.size(), {});
    std::string failure;
#pragma omp parallel for schedule(dynamic)
    for (size_t d = 0; d < batch.size(); d++) {
      try {
        batch_ids[d] = tok.encode_document(batch[d]);
      } catch (const std::exception& e) {
#pragma omp critical
        if (failure.empty()) failure = e.what();
      }
    }
    ANVIL_CHECK(failure.empty(), "{}", failure);
    for (const auto& ids : batch_ids) pack(ids);
    batch.clear();
    batch_bytes = 0;
  };
  auto add_document = [&](std::string text) {
    batch_bytes += text.size();
    batch.push_back(std::move(text));
    if (batch_bytes >= (size_t{8} << 20)) flush();
  };
  auto status = [&] { return fmt::format("{} docs, {} samples", sum.documents, train.samples() + val.samples()); };
  for (const std::string& file : files) {
    if (is_jsonl(file)) {
      std::ifstream in(file, std::ios::binary);
      ANVIL_CHECK(in.good(), "cannot read '{}'", file);
      std::string line;
      for (int64_t ln = 1; std::getline(in, line); ln++) {
        done_bytes += static_cast<int64_t>(line.size()) + 1;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        nlohmann::json j;
        try {
          j = nlohmann::json::parse(line);
        } catch (const std::exception&) {
          ANVIL_FAIL("{}:{}: not a JSON object (each line of a JSONL file must be one)", file, ln);
        }
        ANVIL_CHECK(j.is_object() && j.contains(opt.text_field) && j[opt.text_field].is_string(),
                    "{}:{}: no string field '{}' (choose the field with --text-field)", file, ln, opt.text_field);
        add_document(std::move(j[opt.text_field].get_ref<std::string&>()));
        if (ln % 256 == 0) bar.update(done_bytes, status());
      }
    } else {
      std::string text = read_file(file, "input file");
      done_bytes += static_cast<int64_t>(text.size());
      add_document(std::move(text));
    }
    bar.update(done_bytes, status());
  }
  flush();
  sum.input_bytes = total_bytes;
  sum.train_samples = train.samples();
  sum.val_samples = val.samples();
  sum.dropped_tokens = train.leftover() + val.leftover();
  sum.val_by_tokens = train_tokens >= 0;
  ANVIL_CHECK(sum.documents > 0, "the input is empty: no text in {}", fmt::join(opt.inputs, ", "));
  ANVIL_CHECK(sum.train_samples > 0, "the train split has no full sample: its {} tokens are fewer than "
              "max_seq_len {}; give more text or a smaller --max-seq-len", train.leftover(), opt.max_seq_len);
  bar.finish(status());
  if (sum.val_samples > 0 || opt.val_fraction == 0) sum.bytes_written = train.finish() + val.finish();
  return sum;
}

}  // namespace

PrepareSummary prepare_dataset(const PrepareOptions& opt) {
  ANVIL_CHECK(!opt.inputs.empty(), "no inputs given: name text or JSONL files, or directories of them");
  ANVIL_CHECK(!opt.out_dir.empty(), "no output directory given (--out DIR)");
  ANVIL_CHECK(opt.val_fraction >= 0 && opt.val_fraction < 1, "--val-fraction must be in [0, 1), got {}", opt.val_fraction);
  ANVIL_CHECK(opt.max_seq_len >= 2, "--max-seq-len must be at least 2, got {}", opt.max_seq_len);
  ANVIL_CHECK(!fs::exists(opt.out_dir), "output directory '{}' already exists; remove it or choose another --out",
              opt.out_dir);
  // Loaded once: a tokenizer.json of 10 MB takes most of a second to read.
  const std::unique_ptr<Tokenizer> tok = load_tokenizer(opt.tokenizer);
  const std::string record = tokenizer_record_json(tok->record());
  const std::vector<std::string> files = list_inputs(opt.inputs);
  ANVIL_CHECK(!files.empty(), "no input files found in {}", fmt::join(opt.inputs, ", "));
  int64_t total_bytes = 0;
  for (const auto& f : files) total_bytes += static_cast<int64_t>(fs::file_size(f));
  ANVIL_CHECK(total_bytes > 0, "the input is empty: {} file(s) with no text in {}", files.size(),
              fmt::join(opt.inputs, ", "));

  // Validation is held out by documents, spread evenly through the corpus. A corpus of too few
  // documents for that (one book in one file) is read again and split by tokens instead: its last
  // val_fraction of tokens, whole samples and at least one, are the val split.
  PrepareSummary sum;
  write_directory_atomic(opt.out_dir, [&](const std::string& tmp) {
    sum = prepare_pass(opt, *tok, files, total_bytes, record, -1, tmp);
    if (opt.val_fraction > 0 && sum.val_samples == 0) {
      const int64_t samples = sum.tokens / opt.max_seq_len;
      ANVIL_CHECK(samples >= 2, "{} tokens make {} sample(s) of max_seq_len {}: a train and a val split need 2; "
                  "give more text, a smaller --max-seq-len, or --val-fraction 0", sum.tokens, samples,
                  opt.max_seq_len);
      const int64_t val_samples = std::max<int64_t>(
          1, static_cast<int64_t>(static_cast<double>(sum.tokens) * opt.val_fraction) / opt.max_seq_len);
      sum = prepare_pass(opt, *tok, files, total_bytes, record, (samples - val_samples) * opt.max_seq_len, tmp);
    }
  });
  return sum;
}

}  // namespace anvil
