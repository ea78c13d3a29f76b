#include "train/data_pipeline.h"

#include <filesystem>
#include <optional>

#include <fmt/ranges.h>

#include "core/error.h"
#include "core/fs.h"
#include "core/sha256.h"
#include "data/finetuning.h"
#include "parallel/collectives.h"

namespace anvil {

namespace {
namespace fs = std::filesystem;

// What the prepared dataset is made of: the records' bytes and every setting that shapes it.
std::string preparation_key(const std::vector<std::string>& files, const Tokenizer& tokenizer,
                            const FinetuningConfig& ft, int max_seq_len) {
  Sha256 h;
  for (const std::string& f : files) {
    const std::string bytes = read_file(f, "fine-tuning records");
    h.update(f.data(), f.size() + 1);
    h.update(bytes.data(), bytes.size());
  }
  const std::string settings =
      fmt::format("{}\n{}\n{}\n{}\n{}\n{}\n{}", tokenizer.files().sha256, chat_template_json(ft.chat_template),
                  target_prompts_name(ft.targets), target_responses_name(ft.targets), choice_name(ft.too_long),
                  ft.skip_malformed, max_seq_len);
  h.update(settings.data(), settings.size());
  return h.hex();
}

}  // namespace

DataPipeline open_data(const LoaderConfig& loader, int max_seq_len, const std::string& tokenizer_name,
                       const std::string& prepared_dir, Communicator& comm, std::vector<std::string>& notes) {
  DatasetConfig ds = loader.dataset;
  std::optional<FinetuningExamples> finetuning;
  if (loader.name == LoaderKind::kFinetuning) {
    const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(tokenizer_name);
    finetuning = FinetuningExamples{ds.finetuning.targets, tokenizer->eos_id()};
    if (!ds.finetuning.hf_name.empty()) {
      const FinetuningConfig& ft = ds.finetuning;
      const std::string source = ft.hf_name != "json"  ? ft.hf_name
                                 : ft.data_dir.empty() ? fmt::format("{}", fmt::join(ft.data_files, ", "))
                                                       : ft.data_dir;
      const std::string where = fmt::format("{} split '{}'", source, ds.split);
      // Rank 0 prepares; a failure there is every rank's, so that none waits for data that will
      // not come.
      std::string failure;
      if (comm.rank() == 0) {
        try {
          const std::vector<std::string> files = finetuning_files(ds.finetuning, ds.split, where);
          // Settled first, so that the key holds the template's text: an edited template prepares anew.
          ds.finetuning.chat_template = resolve_chat_template(ds.finetuning.chat_template, tokenizer->files());
          const std::string key = preparation_key(files, *tokenizer, ds.finetuning, max_seq_len);
          const std::string key_file = prepared_dir + "/prepared_from.sha256";
          std::error_code ec;
          if (fs::exists(key_file) && read_file(key_file, "preparation key") == key + "\n") {
            notes.push_back(fmt::format("fine-tuning records of {}: reusing {} (prepared from the same records and "
                                        "settings)", where, prepared_dir));
          } else {
            fs::remove_all(prepared_dir, ec);
            FinetuningPrepareOptions opt;
            opt.max_seq_len = max_seq_len;
            opt.finetuning = ds.finetuning;
            const FinetuningReport report = prepare_finetuning(files, prepared_dir, *tokenizer, opt);
            write_file_atomic(prepared_dir + "/chat_template.json", chat_template_json(ds.finetuning.chat_template));
            write_file_atomic(key_file, key + "\n");
            notes.push_back(fmt::format("fine-tuning records of {} ({} file(s)) prepared into {}: {}", where,
                                        files.size(), prepared_dir, report.summary()));
            const ChatTemplate& chat = ds.finetuning.chat_template;
            notes.push_back(chat.is_jinja() ? fmt::format("  chat records rendered with the chat template of {}", chat.origin)
                                            : fmt::format("  chat records rendered with the {} message template", chat.name));
            for (const std::string& p : report.problems) notes.push_back("  skipped: " + p);
          }
        } catch (const std::exception& e) {
          failure = e.what();
        }
      }
      if (max_exact(comm, failure.empty() ? 0 : 1) > 0) {
        if (!failure.empty()) ANVIL_FAIL("{}", failure);
        ANVIL_FAIL("rank 0 could not prepare the fine-tuning records of {} (its log says why)", where);
      }
      ds.local = prepared_dir;
      ds.remote.clear();
      ds.split.clear();
    }
  }
  std::vector<StreamSource> sources;
  if (ds.streams.empty()) {
    sources.push_back({"default", ds.remote, ds.local, ds.split, 1.0});
  } else {
    for (const StreamConfig& s : ds.streams) sources.push_back({s.name, s.remote, s.local, s.split, s.proportion});
  }
  StreamingOptions opt;
  opt.cache_limit = ds.cache_limit;
  opt.remote.retries = ds.download_retry;
  opt.remote.timeout_s = ds.download_timeout;
  opt.validate_hash = ds.validate_hash;
  DataPipeline p;
  p.data = std::make_unique<StreamingDataset>(sources, opt);
  p.order.shuffle = ds.shuffle;
  p.order.algo = ds.shuffle_algo;
  p.order.seed = ds.shuffle_seed;
  p.order.block_size = ds.shuffle_block_size;
  p.order.canonical_nodes = ds.num_canonical_nodes;
  p.order.epoch_size = ds.epoch_size;
  for (int s = 0; s < p.data->num_streams(); s++)
    p.order.streams.push_back({p.data->shard_samples(s), sources[static_cast<size_t>(s)].proportion});
  p.finetuning = finetuning;
  ANVIL_CHECK((p.data->kind() == MdsSampleKind::kTurns) == finetuning.has_value(),
              "{}: the loader is named {} but the dataset holds {}: {}", ds.local.empty() ? ds.remote : ds.local,
              choice_name(loader.name), p.data->kind() == MdsSampleKind::kTurns ? "fine-tuning examples" : "token "
              "sequences", finetuning ? "prepare the records with `anvil data prepare --format finetuning`, or name "
              "the JSON records with hf_name" : "read it with train_loader.name: finetuning");
  return p;
}

void check_data_tokenizer(const StreamingDataset& data, const TokenizerFiles& tokenizer, int vocab_size) {
  for (int s = 0; s < data.num_streams(); s++) {
    const std::optional<TokenizerRecord>& rec = data.tokenizer_record(s);
    if (!rec) continue;
    const StreamSource& src = data.source(s);
    const std::string where = src.remote.empty() ? src.local : src.remote;
    ANVIL_CHECK(rec->sha256 == tokenizer.sha256, "the data in '{}' was prepared with tokenizer {} ({}), not with "
                "tokenizer.name {} ({}): prepare it again with --tokenizer {}, or name its tokenizer in the config",
                where, rec->name, rec->kind, tokenizer.name, tokenizer_kind_name(tokenizer.kind), tokenizer.name);
    ANVIL_CHECK(rec->vocab_size <= vocab_size, "the data in '{}' holds ids of a {}-token vocabulary ({}), more than "
                "the model's vocab_size {}", where, rec->vocab_size, rec->name, vocab_size);
  }
}

}  // namespace anvil
