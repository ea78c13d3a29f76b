// Data preparation: documents are read in a fixed order (inputs as given, directories sorted by
// name, JSON lines in file order) and assigned to splits by position, so the output depends only
// on the inputs and the options.
#include "data/prepare.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
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
  void add(const std::vector<int32_t>& ids) {
    for (int32_t id : ids) {
      buf_.push_back(id);
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

}  // namespace

PrepareSummary prepare_dataset(const PrepareOptions& opt) {
  ANVIL_CHECK(!opt.inputs.empty(), "no inputs given: name text or JSONL files, or directories of them");
  ANVIL_CHECK(!opt.out_dir.empty(), "no output directory given (--out DIR)");
  ANVIL_CHECK(opt.val_fraction >= 0 && opt.val_fraction < 1, "--val-fraction must be in [0, 1), got {}", opt.val_fraction);
  ANVIL_CHECK(opt.max_seq_len >= 2, "--max-seq-len must be at least 2, got {}", opt.max_seq_len);
  ANVIL_CHECK(!fs::exists(opt.out_dir), "output directory '{}' already exists; remove it or choose another --out",
              opt.out_dir);
  const std::unique_ptr<Tokenizer> tok = load_tokenizer(opt.tokenizer);
  const std::string record = tokenizer_record_json(tok->record());
  const std::vector<std::string> files = list_inputs(opt.inputs);
  ANVIL_CHECK(!files.empty(), "no input files found in {}", fmt::join(opt.inputs, ", "));
  int64_t total_bytes = 0;
  for (const auto& f : files) total_bytes += static_cast<int64_t>(fs::file_size(f));
  ANVIL_CHECK(total_bytes > 0, "the input is empty: {} file(s) with no text in {}", files.size(),
              fmt::join(opt.inputs, ", "));

  const fs::path out(opt.out_dir);
  const std::string tmp = (out.parent_path() / fmt::format(".{}.tmp.{}", out.filename().string(), ::getpid())).string();
  fs::remove_all(tmp);
  make_dirs(tmp);
  PrepareSummary sum;
  try {
    SplitPacker train(tmp + "/train", opt.max_seq_len, opt.mds, record);
    SplitPacker val(tmp + "/val", opt.max_seq_len, opt.mds, record);
    Progress bar("prepare", total_bytes, "B");
    int64_t done_bytes = 0;
    auto add_document = [&](std::string_view text) {
      const std::vector<int32_t> ids = tok->encode_document(text);
      if (ids.empty()) return;
      // Document d goes to val when the running count of val documents, d·f rounded down, steps
      // up: val documents are spread evenly through the corpus.
      const int64_t d = sum.documents++;
      const bool to_val = opt.val_fraction > 0 && static_cast<int64_t>((d + 1) * opt.val_fraction) >
                                                      static_cast<int64_t>(d * opt.val_fraction);
      (to_val ? val : train).add(ids);
    };
    const auto start = std::chrono::steady_clock::now();
    auto status = [&] {
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      return fmt::format("{} docs, {} samples | {:.2f} MB/s", sum.documents, train.samples() + val.samples(),
                         secs > 0 ? static_cast<double>(done_bytes) / secs / 1e6 : 0.0);
    };
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
          add_document(j[opt.text_field].get_ref<const std::string&>());
          if (ln % 256 == 0) bar.update(done_bytes, status());
        }
      } else {
        const std::string text = read_file(file, "input file");
        done_bytes += static_cast<int64_t>(text.size());
        add_document(text);
      }
      bar.update(done_bytes, status());
    }
    bar.finish(status());
    sum.input_bytes = total_bytes;
    sum.train_samples = train.samples();
    sum.val_samples = val.samples();
    sum.dropped_tokens = train.leftover() + val.leftover();
    ANVIL_CHECK(sum.documents > 0, "the input is empty: no text in {}", fmt::join(opt.inputs, ", "));
    ANVIL_CHECK(sum.train_samples > 0, "the train split has no full sample: its {} tokens are fewer than "
                "max_seq_len {}; give more text or a smaller --max-seq-len", train.leftover(), opt.max_seq_len);
    ANVIL_CHECK(opt.val_fraction == 0 || sum.val_samples > 0, "the val split has no full sample ({} tokens, max_seq_len "
                "{}); give more text, a larger --val-fraction, or --val-fraction 0", val.leftover(), opt.max_seq_len);
    sum.bytes_written = train.finish() + val.finish();
    fs::rename(tmp, out);
    fsync_dir(out.parent_path().empty() ? "." : out.parent_path().string());
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  return sum;
}

}  // namespace anvil
