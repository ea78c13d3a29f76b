// The training config's field tables, section by section, in the order the keys are read and
// written back (a key read later may depend on one read earlier: max_seq_len and the tokenizer
// before the loaders, distributed before fsdp_config).
#include "config/train_schema.h"

#include <algorithm>
#include <filesystem>

#include "config/hf_model_config.h"
#include "config/model_section.h"
#include "core/error.h"

namespace anvil {
namespace {

// What a loader's keys are checked against: the loader (train or eval) and what the top level set.
struct LoaderContext {
  bool train;
  int max_seq_len;
  std::string tokenizer;
};
struct DatasetContext {
  LoaderContext loader;
  LoaderKind kind;
};
struct FinetuningContext {
  std::string split;
  bool train;
};
struct StreamContext {
  std::string split;
};
// What fsdp_config's keys must agree with: whether the config also set the keys they spell.
struct FsdpContext {
  bool zero_stage_given, activation_checkpointing_given, offload_given;
};

using Top = Fields<TrainConfig, TopContext>;
using Loader = Fields<LoaderConfig, LoaderContext>;
using Dataset = Fields<DatasetConfig, DatasetContext>;
using Finetuning = Fields<FinetuningConfig, FinetuningContext>;
using Stream = Fields<StreamConfig, StreamContext>;
using Fsdp = Fields<TrainConfig, FsdpContext>;

// A tokenizer name as the config keeps it: a path is made absolute, so that the checkpoint's
// config names the same files from anywhere.
std::string tokenizer_name_as_kept(const std::string& name) {
  std::error_code ec;
  if (name == "gpt2" || !std::filesystem::exists(name, ec)) return name;
  return std::filesystem::absolute(name, ec).lexically_normal().string();
}

// A reader's dotted section name ("train_loader.dataset"), for messages that name the key themselves.
std::string section_of(const MapReader& r) {
  std::string name = r.full("-");
  name.resize(name.size() - 2);
  return name;
}

// LLM Foundry repeats max_seq_len in places (a loader's dataset, the tokenizer's kwargs): given
// there, it must be the top-level value.
void check_repeated_max_seq_len(MapReader& r, const char* key, int max_seq_len) {
  int repeated = max_seq_len;
  r.get(key, repeated);
  ANVIL_CHECK(repeated == max_seq_len, "{}: {} is {}, but max_seq_len is {}: they must agree", r.source(key),
              r.full(key), repeated, max_seq_len);
}

// A setting LLM Foundry takes as a file's path or inline (icl_tasks: a list; eval_gauntlet: a
// section), kept as YAML text for the reader that knows its contents (train/icl_eval.h).
Field<TrainConfig, TopContext> yaml_setting(const std::string& key, std::string TrainConfig::*member,
                                            YAML::NodeType::value inline_type, std::string meaning) {
  const char* inline_kind = inline_type == YAML::NodeType::Sequence ? "list" : "section";
  return Top::custom(
      key, "none", std::move(meaning),
      [key, member, inline_type, inline_kind](MapReader& r, TrainConfig& c, const TopContext&) {
        if (!r.has(key)) return;
        const YAML::Node n = r.raw(key);
        if (n.IsNull()) return;
        ANVIL_CHECK((n.IsScalar() && !n.Scalar().empty()) || n.Type() == inline_type, "{}: {} must be a file's path "
                    "or the {} itself, as in LLM Foundry", r.source(key), r.full(key), inline_kind);
        c.*member = YAML::Dump(n);
      },
      [key, member](YAML::Emitter& e, const TrainConfig& c) {
        if (!(c.*member).empty()) e << YAML::Key << key << YAML::Value << YAML::Load(c.*member);
      });
}

template <class T>
Check<T> in_unit_interval() {
  return {[](const T& v) { return v >= 0 && v < 1; }, "be in [0, 1)"};
}

// A duration in the units a key allows, and positive unless zero is allowed.
Check<Duration> duration_in(std::vector<Duration::Unit> units, const char* must, bool zero_allowed = false) {
  return {[units, zero_allowed](const Duration& d) {
            return std::find(units.begin(), units.end(), d.unit) != units.end() && (zero_allowed || d.value > 0);
          },
          must};
}

const std::vector<Field<StreamConfig, StreamContext>>& stream_fields() {
  static const std::vector<Field<StreamConfig, StreamContext>> table = {
      // remote and local are written only when set, as a stream gives one or both.
      Stream::custom(
          "remote", "", "as the dataset's `remote`",
          [](MapReader& r, StreamConfig& s, const StreamContext&) { r.get("remote", s.remote); },
          [](YAML::Emitter& e, const StreamConfig& s) {
            if (!s.remote.empty()) Stream::emit(e, "remote", s.remote);
          }),
      Stream::custom(
          "local", "", "as the dataset's `local`; a stream needs one of the two",
          [](MapReader& r, StreamConfig& s, const StreamContext&) { r.get("local", s.local); },
          [](YAML::Emitter& e, const StreamConfig& s) {
            if (!s.local.empty()) Stream::emit(e, "local", s.local);
          }),
      Stream::custom(
          "split", "the dataset's", "",
          [](MapReader& r, StreamConfig& s, const StreamContext& c) {
            s.split = c.split;
            r.get("split", s.split);
          },
          [](YAML::Emitter& e, const StreamConfig& s) { Stream::emit(e, "split", s.split); }),
      Stream::value("proportion", &StreamConfig::proportion, "its share of each epoch's samples, relative to the "
                    "other streams'", positive<double>()),
  };
  return table;
}

const std::vector<Field<FinetuningConfig, FinetuningContext>>& finetuning_fields() {
  static const std::vector<Field<FinetuningConfig, FinetuningContext>> table = {
      Finetuning::custom(
          "hf_name", "",
          "a local `.jsonl`/`.json` file, a directory of them, or `json` with `hf_kwargs.data_dir` (a directory) "
          "or `hf_kwargs.data_files` (a path, a list, or a map of split to paths). In a directory a file belongs "
          "to a split when a part of its path names it, as Hugging Face's json loader finds splits "
          "(`train`/`training`; `validation`/`valid`/`val`/`dev`; `test`/`testing`/`eval`/`evaluation`); when no "
          "file names one, every file is `train`. Hub names are an error (nothing is downloaded). The records are "
          "tokenized at start into `RUN_DIR/finetuning_data/{train,eval}` (rank 0 writes, the others wait), "
          "reused by later runs while the records and settings are the same, and what became of them is logged",
          [](MapReader& d, FinetuningConfig& ft, const FinetuningContext&) { d.get("hf_name", ft.hf_name); },
          [](YAML::Emitter& e, const FinetuningConfig& ft) {
            if (!ft.hf_name.empty()) Finetuning::emit(e, "hf_name", ft.hf_name);
          }),
      Finetuning::custom(
          "hf_kwargs", "", "`data_dir` and `data_files`, as above",
          [](MapReader& d, FinetuningConfig& ft, const FinetuningContext& c) {
            MapReader kw = d.sub("hf_kwargs");
            kw.get("data_dir", ft.data_dir);
            if (kw.has("data_files")) {
              // One path, a list of them, or (as Hugging Face's loaders take it) a map of split to path(s).
              YAML::Node files = kw.raw("data_files");
              if (files.IsMap()) {
                ANVIL_CHECK(files[c.split], "{}: {} names no files for split '{}'", kw.source("data_files"),
                            kw.full("data_files"), c.split);
                files = files[c.split];
              }
              auto path = [&](const YAML::Node& n) {
                ANVIL_CHECK(n.IsScalar(), "{}: {} must be a path, a list of paths, or a map of split to paths",
                            kw.source("data_files"), kw.full("data_files"));
                ft.data_files.push_back(n.Scalar());
              };
              if (files.IsSequence()) {
                for (const YAML::Node& n : files) path(n);
              } else {
                path(files);
              }
            }
            kw.finish();
          },
          [](YAML::Emitter& e, const FinetuningConfig& ft) {
            if (ft.hf_name.empty()) return;
            e << YAML::Key << "hf_kwargs" << YAML::Value << YAML::BeginMap;
            if (!ft.data_dir.empty()) e << YAML::Key << "data_dir" << YAML::Value << ft.data_dir;
            if (!ft.data_files.empty()) e << YAML::Key << "data_files" << YAML::Value << ft.data_files;
            e << YAML::EndMap;
          }),
      Finetuning::custom(
          "preprocessing_fn", "", "an error: it names Python code, which anvil does not run; write the records in "
          "one of the shapes above",
          [](MapReader& d, FinetuningConfig&, const FinetuningContext&) {
            if (!d.has("preprocessing_fn")) return;
            std::string fn;
            d.get("preprocessing_fn", fn);
            ANVIL_FAIL("{}: {} '{}' names Python code, which anvil does not run: write the records as JSON lines "
                       "of {{\"prompt\", \"response\"}} or {{\"messages\": [...]}} and leave preprocessing_fn out",
                       d.source("preprocessing_fn"), d.full("preprocessing_fn"), fn);
          }),
      Finetuning::accepted("decoder_only_format", true, "false (encoder-decoder) is an error",
                           only(true, "false is for encoder-decoder models; anvil's models are decoders")),
      Finetuning::custom(
          "allow_pad_trimming", "false",
          "train loader only: each step's sequences are cut after the last position any sequence of the global "
          "batch trains on (rounded up to a multiple of 8, as Foundry's collator rounds), so that short examples "
          "do not pay for `max_seq_len`. Padding carries no loss and nothing attends to it, so the weights are "
          "the same (the tests check the digest); the cut is the same on every rank, a function of the global "
          "batch alone. `tokens` in `metrics.jsonl` counts the positions trained",
          [](MapReader& d, FinetuningConfig& ft, const FinetuningContext& c) {
            d.get("allow_pad_trimming", ft.allow_pad_trimming);
            ANVIL_CHECK(c.train || !ft.allow_pad_trimming, "{}: {}: true is for the train loader (evaluation pads "
                        "each example to max_seq_len)", d.source("allow_pad_trimming"), d.full("allow_pad_trimming"));
          },
          [](YAML::Emitter& e, const FinetuningConfig& ft) {
            Finetuning::emit(e, "allow_pad_trimming", ft.allow_pad_trimming);
          }),
      Finetuning::custom(
          "packing_ratio", "1 (off)",
          "train loader only: a step takes round(`packing_ratio` × `global_train_batch_size`) examples and packs "
          "them into the batch's sequences, first fit, longest first; each token keeps its position in its own "
          "example and attends only within it (learned positions, RoPE and ALiBi alike), so packing changes no "
          "example's loss or gradient. An example that fits in no sequence of its step is not trained on (LLM "
          "Foundry's \"waste\"); the log reports the examples per sequence and what was left out after the first "
          "step and at the end. The packing depends on the global step alone: the same bits for any world size "
          "and microbatch. `auto` is an error (give a number)",
          [](MapReader& d, FinetuningConfig& ft, const FinetuningContext& c) {
            if (!d.has("packing_ratio")) return;
            const YAML::Node r = d.raw("packing_ratio");
            ANVIL_CHECK(!(r.IsScalar() && r.Scalar() == "auto"), "{}: {}: auto (profiling for a ratio) is not "
                        "supported: give a number, e.g. the examples of about max_seq_len / (their mean length) per "
                        "sequence", d.source("packing_ratio"), d.full("packing_ratio"));
            d.get("packing_ratio", ft.packing_ratio);
            ANVIL_CHECK(c.train, "{}: {}: evaluation runs each example as its own sequence; packing is for the "
                        "train loader", d.source("packing_ratio"), d.full("packing_ratio"));
            ANVIL_CHECK(ft.packing_ratio >= 1, "{}: {} must be at least 1 (examples per sequence), got {}",
                        d.source("packing_ratio"), d.full("packing_ratio"), ft.packing_ratio);
          },
          [](YAML::Emitter& e, const FinetuningConfig& ft) { Finetuning::emit(e, "packing_ratio", ft.packing_ratio); }),
      Finetuning::accepted("safe_load", true, "accepted: anvil never runs a dataset's code"),
      Finetuning::custom(
          "target_prompts", "`none`", "Foundry's: `none`, `all`, or `length>=N` (prompts of at least N tokens "
          "carry loss)",
          [](MapReader& d, FinetuningConfig& ft, const FinetuningContext&) {
            std::string prompts = target_prompts_name(ft.targets);
            d.get("target_prompts", prompts);
            ft.targets = parse_target_policy(prompts, target_responses_name(ft.targets),
                                             d.source("target_prompts") + ": " + section_of(d));
          },
          [](YAML::Emitter& e, const FinetuningConfig& ft) {
            Finetuning::emit(e, "target_prompts", target_prompts_name(ft.targets));
          }),
      Finetuning::custom(
          "target_responses", "`last`", "Foundry's: `last` (only the final response of a conversation carries "
          "loss) or `all`",
          [](MapReader& d, FinetuningConfig& ft, const FinetuningContext&) {
            std::string responses = target_responses_name(ft.targets);
            d.get("target_responses", responses);
            ft.targets = parse_target_policy(target_prompts_name(ft.targets), responses,
                                             d.source("target_responses") + ": " + section_of(d));
          },
          [](YAML::Emitter& e, const FinetuningConfig& ft) {
            Finetuning::emit(e, "target_responses", target_responses_name(ft.targets));
          }),
      Finetuning::custom(
          "chat_template", "`auto`",
          "how chat messages become text: `tokenizer`, the tokenizer's own Jinja chat template "
          "(`tokenizer_config.json`'s `chat_template`, or `chat_template.jinja` beside it) rendered as transformers "
          "renders it, turns cut as LLM Foundry cuts them, no BOS added (the template writes its special tokens); "
          "`chatml` (`<\\|im_start\\|>{role}\\n{content}<\\|im_end\\|>\\n`, generation prompt "
          "`<\\|im_start\\|>assistant\\n`); a map `{name, message, generation_prompt}` whose assistant message must "
          "begin with the generation prompt; `auto`: the tokenizer's where it has one, else `chatml`. The template "
          "used is written beside the prepared data (`chat_template.json`)",
          [](MapReader& d, FinetuningConfig& ft, const FinetuningContext&) {
            if (!d.has("chat_template")) return;
            const std::string where = d.source("chat_template") + ": " + d.full("chat_template");
            const YAML::Node t = d.raw("chat_template");
            if (t.IsScalar()) {
              ft.chat_template = chat_template_named(t.Scalar(), where);
            } else {
              MapReader c = d.sub("chat_template");
              ft.chat_template.name = "custom";
              c.get("name", ft.chat_template.name);
              ANVIL_CHECK(ft.chat_template.name != "auto" && ft.chat_template.name != "tokenizer", "{}: a chat "
                          "template map cannot be named '{}' (that name chooses the tokenizer's template)", where,
                          ft.chat_template.name);
              ANVIL_CHECK(c.has("message") && c.has("generation_prompt"), "{}: a chat template map needs message "
                          "(with {{role}} and {{content}}) and generation_prompt", where);
              c.get("message", ft.chat_template.message);
              c.get("generation_prompt", ft.chat_template.generation_prompt);
              c.finish();
            }
            validate_chat_template(ft.chat_template, where);
          },
          [](YAML::Emitter& e, const FinetuningConfig& ft) {
            const ChatTemplate& t = ft.chat_template;
            if (t.name == "auto" || t.name == "tokenizer" || t.name == "chatml") {
              e << YAML::Key << "chat_template" << YAML::Value << t.name;
              return;
            }
            e << YAML::Key << "chat_template" << YAML::Value << YAML::BeginMap;
            e << YAML::Key << "name" << YAML::Value << t.name;
            e << YAML::Key << "message" << YAML::Value << t.message;
            e << YAML::Key << "generation_prompt" << YAML::Value << t.generation_prompt;
            e << YAML::EndMap;
          }),
      Finetuning::value("too_long", &FinetuningConfig::too_long, "an example longer than `max_seq_len`: `truncate` "
                        "(Foundry's collator) or `drop`; either way it is counted"),
      Finetuning::value("skip_malformed", &FinetuningConfig::skip_malformed,
                        "a record that is not one of the shapes above (bad JSON, other keys, an unknown role, two "
                        "messages of one role in a row, ...) stops the run naming its file, line and what is wrong; "
                        "`true` skips and counts it"),
  };
  return table;
}

const std::vector<Field<DatasetConfig, DatasetContext>>& dataset_fields() {
  static const std::vector<Field<DatasetConfig, DatasetContext>> table = {
      Dataset::value("remote", &DatasetConfig::remote, "`s3://bucket/prefix`, `http(s)://...` or a path holding the "
                     "dataset; shards stream into `local` (default `$TMPDIR/anvil-cache/<hash>`)"),
      Dataset::value("local", &DatasetConfig::local, "an MDS dataset directory (`anvil data prepare`), or the cache "
                     "directory for `remote`"),
      Dataset::custom(
          "split", "`train` (`val` for `eval_loader`)", "a subdirectory of `local` and `remote`",
          [](MapReader& r, DatasetConfig& ds, const DatasetContext& c) {
            ds.split = c.loader.train ? "train" : "val";
            r.get("split", ds.split);
          },
          [](YAML::Emitter& e, const DatasetConfig& ds) { Dataset::emit(e, "split", ds.split); }),
      // A finetuning loader's keys (their own table below), read with the dataset's.
      Dataset::custom("", "", "", [](MapReader& r, DatasetConfig& ds, const DatasetContext& c) {
        if (c.kind == LoaderKind::kFinetuning)
          read_fields(r, finetuning_fields(), ds.finetuning, FinetuningContext{ds.split, c.loader.train});
      }),
      Dataset::value("shuffle", &DatasetConfig::shuffle, ""),
      Dataset::value("shuffle_seed", &DatasetConfig::shuffle_seed, ""),
      Dataset::value("shuffle_algo", &DatasetConfig::shuffle_algo,
                     "`none`, `py1s` (shuffle within shards) or `py1e` (samples scattered over a window of about "
                     "`shuffle_block_size`)",
                     Check<std::string>{[](const std::string& a) { return a == "none" || a == "py1s" || a == "py1e"; },
                                        "be none, py1s or py1e"}),
      Dataset::value("shuffle_block_size", &DatasetConfig::shuffle_block_size, "py1e's window",
                     minus_one_or_positive<int64_t>("the default"))
          .defaults("max(4,000,000 / `num_canonical_nodes`, 262,144)"),
      Dataset::value("num_canonical_nodes", &DatasetConfig::num_canonical_nodes,
                     "how the epoch is dealt into node-sized parts; fixed for a run, whatever the real node count",
                     at_least<int64_t>(1)),
      Dataset::value("epoch_size", &DatasetConfig::epoch_size, "samples per epoch (streams contribute by proportion)",
                     minus_one_or_positive<int64_t>("the streams' total"))
          .defaults("the streams' total"),
      Dataset::bytes("cache_limit", &DatasetConfig::cache_limit, "bytes per stream cache (`\"10gb\"` accepted); least "
                     "recently used shards are evicted")
          .defaults("none"),
      Dataset::value("predownload", &DatasetConfig::predownload, "samples per rank to download ahead")
          .defaults("8 batches"),
      Dataset::value("download_retry", &DatasetConfig::download_retry, "retries, with exponential backoff and jitter",
                     not_negative<int>()),
      Dataset::value("download_timeout", &DatasetConfig::download_timeout, "seconds per download attempt",
                     positive<double>()),
      Dataset::value("validate_hash", &DatasetConfig::validate_hash, "check each shard against the index's hashes the "
                     "first time it is used"),
      Dataset::custom("max_seq_len", "", "LLM Foundry repeats `max_seq_len` here: when given, it must equal the "
                      "top-level value",
                      [](MapReader& r, DatasetConfig&, const DatasetContext& c) {
                        check_repeated_max_seq_len(r, "max_seq_len", c.loader.max_seq_len);
                      }),
      Dataset::custom("tokenizer_name", "", "Foundry's older files repeat the tokenizer here: when given, it must be "
                      "`tokenizer.name`",
                      [](MapReader& r, DatasetConfig&, const DatasetContext& c) {
                        std::string repeated = c.loader.tokenizer;
                        r.get("tokenizer_name", repeated);
                        ANVIL_CHECK(tokenizer_name_as_kept(repeated) == c.loader.tokenizer, "{}: {} is '{}', but "
                                    "tokenizer.name is '{}': they must agree", r.source("tokenizer_name"),
                                    r.full("tokenizer_name"), repeated, c.loader.tokenizer);
                      }),
      [] {
        Field<DatasetConfig, DatasetContext> f = Dataset::custom(
            "streams", "", "instead of `remote`/`local`: datasets mixed by proportion, by name",
            [](MapReader& d, DatasetConfig& ds, const DatasetContext&) {
              if (!d.has("streams")) return;
              const YAML::Node streams = d.raw("streams");
              ANVIL_CHECK(streams.IsMap() && streams.size() > 0, "{}: {} must map stream names to their settings",
                          d.source("streams"), d.full("streams"));
              for (auto it = streams.begin(); it != streams.end(); ++it) {
                StreamConfig sc;
                sc.name = it->first.as<std::string>();
                MapReader sr(it->second, d.full("streams") + "." + sc.name, d.file());
                read_fields(sr, stream_fields(), sc, StreamContext{ds.split});
                sr.finish();
                ANVIL_CHECK(!sc.remote.empty() || !sc.local.empty(), "{}: {} needs `local` (a dataset directory) or "
                            "`remote`", d.file(), sr.full("local"));
                ds.streams.push_back(sc);
              }
            },
            [](YAML::Emitter& e, const DatasetConfig& ds) {
              if (ds.streams.empty()) return;  // an empty map is not a valid value
              e << YAML::Key << "streams" << YAML::Value << YAML::BeginMap;
              for (const StreamConfig& s : ds.streams) {
                e << YAML::Key << s.name << YAML::Value << YAML::BeginMap;
                write_fields(e, stream_fields(), s);
                e << YAML::EndMap;
              }
              e << YAML::EndMap;
            });
        f.rows = key_docs(stream_fields(), "NAME.");
        return f;
      }(),
  };
  return table;
}

// Where a loader's data comes from: JSON records or an MDS dataset, one of them.
void check_data_source(const MapReader& d, const LoaderConfig& l) {
  const DatasetConfig& ds = l.dataset;
  const bool mds = !ds.streams.empty() || !ds.remote.empty() || !ds.local.empty();
  if (!ds.finetuning.hf_name.empty())
    ANVIL_CHECK(!mds, "{}: {} reads JSON records and local/remote/streams an MDS dataset: give one of them",
                d.file(), d.full("hf_name"));
  else if (l.name == LoaderKind::kFinetuning)
    ANVIL_CHECK(mds, "{}: {} (JSON records: a .jsonl file, a directory, or json with hf_kwargs.data_dir) or {} (a "
                "dataset made by `anvil data prepare --format finetuning`) is required", d.file(), d.full("hf_name"),
                d.full("local"));
  else
    ANVIL_CHECK(mds, "{}: {} or {} is required (a dataset made by `anvil data prepare`, or a remote holding one)",
                d.file(), d.full("local"), d.full("remote"));
}

const std::vector<Field<LoaderConfig, LoaderContext>>& loader_fields() {
  static const std::vector<Field<LoaderConfig, LoaderContext>> table = {
      Loader::value("name", &LoaderConfig::name, "`text`: packed pretraining tokens; `finetuning`: instruction "
                    "records (their dataset keys below)"),
      [] {
        Field<LoaderConfig, LoaderContext> f = Loader::custom(
            "dataset", "", "",
            [](MapReader& r, LoaderConfig& l, const LoaderContext& c) {
              MapReader d = r.sub("dataset");
              read_fields(d, dataset_fields(), l.dataset, DatasetContext{c, l.name});
              d.finish();
              check_data_source(d, l);
            },
            [](YAML::Emitter& e, const LoaderConfig& l) {
              e << YAML::Key << "dataset" << YAML::Value << YAML::BeginMap;
              write_fields(e, dataset_fields(), l.dataset);
              if (l.name == LoaderKind::kFinetuning) write_fields(e, finetuning_fields(), l.dataset.finetuning);
              e << YAML::EndMap;
            });
        f.rows = key_docs(dataset_fields());
        return f;
      }(),
      Loader::value("drop_last", &LoaderConfig::drop_last, "accepted; a partial last batch of an epoch is always "
                    "dropped"),
      Loader::value("num_workers", &LoaderConfig::num_workers, "threads that decode batches ahead of training; "
                    "batches are the same for any number", not_negative<int>()),
      // PyTorch DataLoader's worker settings: anvil's decode threads share the process's memory
      // (nothing to pin or to keep alive) and wait for their batch as long as it takes.
      Loader::accepted("pin_memory", false, "PyTorch DataLoader's; accepted (decode threads share the process's "
                       "memory)"),
      Loader::accepted("persistent_workers", false, "PyTorch DataLoader's; accepted (decode threads live as long as "
                       "the run)"),
      Loader::accepted("prefetch_factor", 2, "PyTorch DataLoader's; accepted (`num_workers` says how far ahead)"),
      Loader::accepted("timeout", 0.0, "PyTorch DataLoader's; accepted (a batch is waited for as long as it takes)"),
  };
  return table;
}

const std::vector<Field<OptimizerConfig>>& optimizer_fields() {
  using O = Fields<OptimizerConfig>;
  static const std::vector<Field<OptimizerConfig>> table = {
      O::value("name", &OptimizerConfig::name, "`decoupled_adamw` (Composer's: decay scaled by lr/`optimizer.lr`) or "
               "`adamw` (PyTorch's: decay scaled by lr)"),
      O::value("lr", &OptimizerConfig::lr, "peak learning rate", positive<double>()).defaults("6e-4"),
      O::custom(
          "betas", "[0.9, 0.95]", "",
          [](MapReader& o, OptimizerConfig& out, const NoContext&) {
            if (!o.has("betas")) return;
            const YAML::Node b = o.raw("betas");
            const std::string must = fmt::format("{}: {} must be a list of two numbers in [0, 1), e.g. [0.9, 0.95]",
                                                 o.source("betas"), o.full("betas"));
            ANVIL_CHECK(b.IsSequence() && b.size() == 2, "{}", must);
            try {
              out.beta1 = b[0].as<double>();
              out.beta2 = b[1].as<double>();
            } catch (const YAML::Exception&) {
              ANVIL_FAIL("{}", must);
            }
            ANVIL_CHECK(out.beta1 >= 0 && out.beta1 < 1 && out.beta2 >= 0 && out.beta2 < 1, "{}, got [{}, {}]", must,
                        out.beta1, out.beta2);
          },
          [](YAML::Emitter& e, const OptimizerConfig& o) {
            e << YAML::Key << "betas" << YAML::Value << YAML::Flow << YAML::BeginSeq << yaml_number(o.beta1)
              << yaml_number(o.beta2) << YAML::EndSeq;
          }),
      O::value("eps", &OptimizerConfig::eps, "", positive<double>()).defaults("1e-8"),
      O::value("weight_decay", &OptimizerConfig::weight_decay, "applied to matmul weights only, never to biases, "
               "norms or embeddings", not_negative<double>()),
      O::value("bias_correction", &OptimizerConfig::bias_correction, "divide the moments by 1 - beta^t as Adam does; "
               "false is DeepSpeed's Adam with `bias_correction: false` (the moments uncorrected: the first step "
               "moves a weight by lr·(1-beta1)/√(1-beta2), not lr)"),
      O::value("master_weights_dtype", &OptimizerConfig::master_weights_dtype, "`bf16`: the weights the optimizer "
               "updates hold bf16 values (rounded to nearest even at the start and after each step's fp32 "
               "arithmetic), as DeepSpeed's `bf16_master_weights_and_grads` keeps them; fp32 storage "
               "(docs/precision.md)"),
      O::value("states_dtype", &OptimizerConfig::states_dtype, "`bf16`: Adam's moments rounded to bf16 after "
               "each step, as DeepSpeed's `bf16_optimizer_states` keeps them; fp32 storage (docs/precision.md)"),
  };
  return table;
}

// Composer's schedules' keys, or DeepSpeed's parameters under the name of one of its schedules
// (their own table, config/scheduler_config.cpp).
const std::vector<Field<SchedulerConfig>>& scheduler_fields() {
  using S = Fields<SchedulerConfig>;
  // A Composer schedule's key: read and written for Composer's schedules only.
  auto composer = [](Field<SchedulerConfig> f) {
    f.read = [inner = f.read](MapReader& r, SchedulerConfig& s, const NoContext& c) {
      if (!s.is_deepspeed()) inner(r, s, c);
    };
    f.write = [inner = f.write](YAML::Emitter& e, const SchedulerConfig& s) {
      if (!s.is_deepspeed()) inner(e, s);
    };
    return f;
  };
  static const std::vector<Field<SchedulerConfig>> table = {
      S::value("name", &SchedulerConfig::name, "also `constant`, `constant_with_warmup`, `linear_decay_with_warmup` "
               "(Composer's formulas); or DeepSpeed's `WarmupLR`, `WarmupDecayLR`, `WarmupCosineLR`, `OneCycle` "
               "with DeepSpeed's parameters (below)"),
      composer(S::value("t_warmup", &SchedulerConfig::t_warmup, "in `ba` or `dur`",
                        duration_in({Duration::Unit::kBatch, Duration::Unit::kDur}, "be in batches (ba) or a fraction "
                                    "of the run (dur)", true))),
      composer(S::value("t_max", &SchedulerConfig::t_max, "where the decay ends, in `ba` or `dur`; name the full "
                        "length to stop a run early and resume it later on the same schedule",
                        duration_in({Duration::Unit::kBatch, Duration::Unit::kDur}, "be a positive number of batches "
                                    "(ba) or a fraction of the run (dur)"))),
      composer(S::value("alpha_f", &SchedulerConfig::alpha_f, "final lr multiplier",
                        Check<double>{[](const double& a) { return a >= 0 && a <= 1; }, "be in [0, 1]"})),
      [] {
        Field<SchedulerConfig> f = S::custom(
            "", "", "",
            [](MapReader& s, SchedulerConfig& out, const NoContext&) {
              if (!out.is_deepspeed()) return;
              const std::string name = choice_name(out.name);
              if (out.name == SchedulerKind::kOneCycle)
                ANVIL_CHECK(s.has("cycle_min_lr") && s.has("cycle_max_lr"), "{}: scheduler OneCycle needs {} and {}",
                            s.file(), s.full("cycle_min_lr"), s.full("cycle_max_lr"));
              for (const SchedulerParam& p : scheduler_params(out.name)) {
                switch (p.kind) {
                  case SchedulerParam::Kind::kRate: {
                    double& v = out.*p.rate;
                    s.get(p.key, v);
                    ANVIL_CHECK(v >= 0, "{}: {} must not be negative, got {}", s.source(p.key), s.full(p.key), v);
                    break;
                  }
                  case SchedulerParam::Kind::kSteps: {
                    int64_t& v = out.*p.steps;
                    s.get(p.key, v);
                    ANVIL_CHECK(v >= p.least, "{}: {} must be at least {} (scheduler {}), got {}", s.source(p.key),
                                s.full(p.key), p.least, name, v);
                    break;
                  }
                  case SchedulerParam::Kind::kWarmupType:
                    s.get(p.key, out.warmup_type);
                    break;
                  case SchedulerParam::Kind::kMomentumOff: {
                    // DeepSpeed cycles Adam's beta1 inversely to the rate unless told not to.
                    bool cycle_momentum = true;
                    s.get(p.key, cycle_momentum);
                    ANVIL_CHECK(!cycle_momentum, "{}: scheduler {} with {} true (DeepSpeed's default) is not "
                                "supported: anvil keeps the optimizer's betas fixed; give {}: false", s.source(p.key),
                                name, p.key, s.full(p.key));
                    break;
                  }
                  case SchedulerParam::Kind::kUnused: {
                    int64_t unused = 0;
                    s.get(p.key, unused);
                    break;
                  }
                }
              }
            },
            [](YAML::Emitter& e, const SchedulerConfig& sc) {
              for (const SchedulerParam& p : scheduler_params(sc.name)) {
                switch (p.kind) {
                  case SchedulerParam::Kind::kRate: S::emit(e, p.key, sc.*p.rate); break;
                  case SchedulerParam::Kind::kSteps: S::emit(e, p.key, sc.*p.steps); break;
                  case SchedulerParam::Kind::kWarmupType: S::emit(e, p.key, sc.warmup_type); break;
                  case SchedulerParam::Kind::kMomentumOff: S::emit(e, p.key, false); break;
                  case SchedulerParam::Kind::kUnused: break;
                }
              }
            });
        f.rows = {
            {"warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type", "0, 0.001, 1000, `log`",
             "`WarmupLR` and `WarmupDecayLR` (DeepSpeed's `deepspeed/runtime/lr_schedules.py`): the rate rises from "
             "`warmup_min_lr` to `warmup_max_lr` (absolute; `optimizer.lr` is not used) over `warmup_num_steps` "
             "updates, by `log(i+1)/log(n)` or linearly, then stays (`WarmupLR`) or falls linearly back to "
             "`warmup_min_lr` at `total_num_steps` (`WarmupDecayLR`)"},
            {"total_num_steps", "0 (the run's length)", "`WarmupDecayLR`, `WarmupCosineLR`"},
            {"warmup_min_ratio, cos_min_ratio", "0, 0.0001", "`WarmupCosineLR`: `optimizer.lr` times a ratio rising "
             "from `warmup_min_ratio` to 1, then down a cosine to `cos_min_ratio`"},
            {"cycle_min_lr, cycle_max_lr, cycle_first_step_size, cycle_second_step_size, decay_step_size, "
             "decay_lr_rate", "required, required, 2000, the first, 0 (none), 0",
             "`OneCycle`: up from `cycle_min_lr` to `cycle_max_lr` and back, then "
             "`cycle_min_lr·(1 + decay_lr_rate·k/decay_step_size)`. `cycle_momentum` must be given as false (anvil "
             "keeps the betas fixed; DeepSpeed's default cycles beta1); the stair counts and momentum bounds are "
             "accepted, as DeepSpeed's rate does not use them"},
        };
        return f;
      }(),
  };
  return table;
}

const std::vector<Field<TrainConfig, TopContext>>& tokenizer_fields() {
  static const std::vector<Field<TrainConfig, TopContext>> table = {
      Top::custom(
          "name", "`gpt2`",
          "`gpt2`, a directory holding a tokenizer's files (`tokenizer.model`: SentencePiece; `vocab.json` + "
          "`merges.txt`: GPT-2-style BPE; else `tokenizer.json`: transformers' fast tokenizer, with its "
          "`tokenizer_config.json`), or a SentencePiece `.model` file; hub names are an error (nothing is "
          "downloaded). The data's recorded tokenizer must be this one",
          [](MapReader& t, TrainConfig& c, const TopContext&) {
            t.get("name", c.tokenizer_name);
            c.tokenizer_name = tokenizer_name_as_kept(c.tokenizer_name);
          },
          [](YAML::Emitter& e, const TrainConfig& c) { Top::emit(e, "name", c.tokenizer_name); }),
      Top::custom("kwargs", "", "", [](MapReader& t, TrainConfig& c, const TopContext&) {
        MapReader kw = t.sub("kwargs");
        check_repeated_max_seq_len(kw, "model_max_length", c.max_seq_len);
        kw.finish();
      }),
  };
  return table;
}
// tokenizer.kwargs' one key, documented as a row of its own.
const KeyDoc kModelMaxLength = {"kwargs.model_max_length", "", "when given, must equal `max_seq_len`"};

const std::vector<Field<TrainConfig, TopContext>>& gradient_clipping_fields() {
  static const std::vector<Field<TrainConfig, TopContext>> table = {
      Top::custom(
          "clipping_type", "`norm`", "global L2 norm",
          [](MapReader& g, TrainConfig&, const TopContext&) {
            std::string type = "norm";
            g.get("clipping_type", type);
            ANVIL_CHECK(type == "norm", "{}: {} '{}' is not supported: expected 'norm'", g.source("clipping_type"),
                        g.full("clipping_type"), type);
          },
          [](YAML::Emitter& e, const TrainConfig&) { Top::emit(e, "clipping_type", std::string("norm")); }),
      Top::value("clipping_threshold", &TrainConfig::clipping_threshold, "", not_negative<double>())
          .defaults("0 (off)"),
  };
  return table;
}

const std::vector<Field<TrainConfig, TopContext>>& algorithms_fields() {
  static const std::vector<Field<TrainConfig, TopContext>> table = {
      Top::group("gradient_clipping", gradient_clipping_fields(), true)};
  return table;
}

const std::vector<Field<LossScalerConfig>>& loss_scaler_fields() {
  using L = Fields<LossScalerConfig>;
  static const std::vector<Field<LossScalerConfig>> table = {
      L::value("init_scale", &LossScalerConfig::init_scale, "`amp_fp16`'s initial loss scale, a power of two"),
      L::value("growth_interval", &LossScalerConfig::growth_interval, "clean steps before the loss scale doubles",
               positive<int>()),
      L::value("hysteresis", &LossScalerConfig::hysteresis, "overflowing steps (each skipped) before the loss scale "
               "halves", positive<int>()),
      L::value("min_scale", &LossScalerConfig::min_scale, "an overflow at this scale is an error"),
      L::value("consecutive_hysteresis", &LossScalerConfig::consecutive_hysteresis, "`true`: a clean step restores "
               "the hysteresis, so only overflows in a row lower the scale"),
  };
  return table;
}

const std::vector<Field<TrainConfig, TopContext>>& callbacks_fields() {
  static const std::vector<Field<TrainConfig, TopContext>> speed_monitor = {
      Top::accepted("window_size", 1, "Composer averages tokens/s over it; anvil reports each step's",
                    positive<int>())};
  static const std::vector<Field<TrainConfig, TopContext>> none;
  static const std::vector<Field<TrainConfig, TopContext>> table = {
      Top::group("speed_monitor", speed_monitor, false, "Composer's; accepted: anvil reports tokens/s and MFU"),
      Top::group("lr_monitor", none, false, "Composer's; accepted: anvil reports the rate"),
      Top::group("memory_monitor", none, false, "Composer's; accepted: anvil reports its memory"),
      Top::group("runtime_estimator", none, false, "Composer's; accepted: anvil reports the ETA"),
  };
  return table;
}

const std::vector<Field<TrainConfig, TopContext>>& loggers_fields() {
  static const std::vector<Field<TrainConfig, TopContext>> tensorboard = {
      Top::value("log_dir", &TrainConfig::tensorboard_dir, "").defaults("`RUN_DIR/tensorboard`"),
      Top::accepted("flush_interval", 1, "accepted: every event is written through", positive<int>()),
      Top::accepted("rank_zero_only", true, "must stay true", only(true, "rank 0 logs the global figures")),
  };
  const std::string service = "it needs a service anvil does not reach; anvil writes metrics.jsonl, train.log and, "
                              "with loggers.tensorboard, TensorBoard event files";
  static const std::vector<Field<TrainConfig, TopContext>> table = {
      [&] {
        Field<TrainConfig, TopContext> f = Top::custom(
            "tensorboard", "off",
            "Composer's TensorBoard logger: event files in `log_dir`, TensorBoard's record format, written by rank "
            "0 after every step: `loss/train`, `lr`, `grad_norm`, `throughput/tokens_per_s`, `throughput/mfu`, "
            "`memory/peak_rss_mib`, `loss_scale` (amp_fp16), and `loss/eval` after each evaluation, by step; a "
            "resumed run adds a file",
            [](MapReader& r, TrainConfig& c, const TopContext& ctx) {
              if (!r.has("tensorboard")) return;
              c.tensorboard = true;
              MapReader tb = r.sub("tensorboard");
              read_fields(tb, tensorboard, c, ctx);
              tb.finish();
            },
            [](YAML::Emitter& e, const TrainConfig& c) {
              if (!c.tensorboard) return;
              e << YAML::Key << "tensorboard" << YAML::Value << YAML::BeginMap;
              write_fields(e, tensorboard, c);
              e << YAML::EndMap;
            });
        f.rows = key_docs(tensorboard);
        return f;
      }(),
      Top::refused("wandb", "an error (a service anvil does not reach)", service),
      Top::refused("mlflow", "an error (a service anvil does not reach)", service),
      Top::refused("comet_ml", "an error (a service anvil does not reach)", service),
      Top::refused("neptune", "an error (a service anvil does not reach)", service),
  };
  return table;
}

const std::vector<Field<DistributedConfig>>& distributed_fields() {
  using D = Fields<DistributedConfig>;
  static const std::vector<Field<DistributedConfig>> table = {
      D::value("zero_stage", &DistributedConfig::zero_stage, "0 (DDP), 1 (optimizer state sharded), 2 (+ gradients), "
               "3 (+ parameters); see [distributed.md](distributed.md)",
               Check<int>{[](const int& s) { return s >= 0 && s <= 3; }, "be 0, 1, 2 or 3"}),
      D::value("all_reduce", &DistributedConfig::all_reduce, "`ring`, `recursive_doubling`, `rank_ordered` (sums in "
               "rank order), `auto` (recursive doubling below 64 KiB, ring above)"),
      D::value("grad_compression", &DistributedConfig::grad_compression, "`bf16`: gradients on the wire in bf16 with "
               "error feedback (zero_stage 0, `deterministic_mode: false` and `kernels: cpu` only)"),
      D::value("gpu_collectives", &DistributedConfig::gpu_collectives, "under `kernels: gpu`: `nccl` (NCCL/RCCL on GPU "
               "memory), `host` (copies through host memory around anvil's collectives; ranks may share a GPU), "
               "`auto` (`nccl` when built with it and no two ranks share a GPU, else `host`); the same bits either "
               "way in deterministic mode"),
      D::value("offload_optimizer", &DistributedConfig::offload_optimizer, "DeepSpeed's ZeRO-Offload: `cpu` keeps the "
               "optimizer states in host memory and runs the optimizer step there. A CPU run (`kernels: cpu` or "
               "`ref`) does so already: accepted, and said in the log. Under `kernels: gpu` an error (not yet "
               "built)"),
      D::value("offload_param", &DistributedConfig::offload_param, "`cpu` keeps the parameters in host memory between "
               "uses; as `offload_optimizer`"),
      D::value("pipeline_parallel", &DistributedConfig::pipeline_parallel, "pipeline stages: the blocks are cut into "
               "this many stages of consecutive blocks, each run by world / N ranks that train it data-parallel, "
               "microbatches flowing through the stages in a 1F1B schedule; the same weights, bit for bit, as one "
               "process. Needs `deterministic_mode`, zero_stage 0 or 1 and a CPU run; see "
               "[distributed.md](distributed.md)",
               positive<int>()),
      D::value("expert_parallel", &DistributedConfig::expert_parallel, "expert parallelism for a mixture of experts: "
               "groups of this many consecutive ranks share the experts, each rank running experts / N of them for "
               "the group's tokens, which cross to it and back (all-to-all) in every layer; the same weights, bit "
               "for bit, as one process. A rank holds its own experts' weights alone (with their gradients and "
               "optimizer states, which ZeRO shards over the ranks holding the same experts). Needs "
               "`deterministic_mode`; a CPU run; see [distributed.md](distributed.md)",
               positive<int>()),
      D::value("tensor_parallel", &DistributedConfig::tensor_parallel, "tensor parallelism (Megatron's): groups of "
               "this many consecutive ranks share one copy of the model, each rank holding 1/N of every block's "
               "heads and MLP width and of the vocabulary (embeddings, LM head, cross-entropy); the ranks' parts of "
               "each sum are added in a fixed order, so the weights are one process's, bit for bit. N must divide "
               "the query heads, the key/value heads and the MLP width, and `vocab_size` must exceed "
               "2048·(N − 1). Composes with `pipeline_parallel` (3D). Needs `deterministic_mode` and a "
               "CPU run; see [distributed.md](distributed.md)",
               positive<int>()),
  };
  return table;
}

// LLM Foundry's fsdp_config spelling of anvil's choices.
const std::vector<Field<TrainConfig, FsdpContext>>& fsdp_fields() {
  static const std::vector<Field<TrainConfig, FsdpContext>> table = {
      Fsdp::custom(
          "sharding_strategy", "", "LLM Foundry's key: `NO_SHARD`, `SHARD_GRAD_OP`, `FULL_SHARD` mean zero_stage 0, "
          "2, 3; giving both it and a different `distributed.zero_stage` is an error",
          [](MapReader& f, TrainConfig& c, const FsdpContext& ctx) {
            if (!f.has("sharding_strategy")) return;
            // LLM Foundry's FSDP strategies are ZeRO stages 0, 2 and 3.
            std::string strategy;
            f.get("sharding_strategy", strategy);
            const int stage = strategy == "NO_SHARD"        ? 0
                              : strategy == "SHARD_GRAD_OP" ? 2
                              : strategy == "FULL_SHARD"    ? 3
                                                            : -1;
            ANVIL_CHECK(stage >= 0, "{}: {} '{}' is not supported: expected NO_SHARD, SHARD_GRAD_OP or FULL_SHARD (or "
                        "set distributed.zero_stage)", f.source("sharding_strategy"), f.full("sharding_strategy"),
                        strategy);
            ANVIL_CHECK(!ctx.zero_stage_given || stage == c.distributed.zero_stage, "{}: {} {} means zero_stage {}, "
                        "but distributed.zero_stage is {}: give one of them", f.source("sharding_strategy"),
                        f.full("sharding_strategy"), strategy, stage, c.distributed.zero_stage);
            c.distributed.zero_stage = stage;
          }),
      Fsdp::custom(
          "activation_checkpointing", "", "the same as the top-level `activation_checkpointing`; the two must agree",
          [](MapReader& f, TrainConfig& c, const FsdpContext& ctx) {
            if (!f.has("activation_checkpointing")) return;
            bool on = false;
            f.get("activation_checkpointing", on);
            ANVIL_CHECK(!ctx.activation_checkpointing_given || on == c.activation_checkpointing, "{}: {} and "
                        "activation_checkpointing differ: give one of them", f.source("activation_checkpointing"),
                        f.full("activation_checkpointing"));
            c.activation_checkpointing = on;
          }),
      Fsdp::custom(
          "mixed_precision", "", "`PURE`, `DEFAULT` or `FULL`: anvil keeps fp32 master weights and reduces gradients in "
          "fp32 whichever (said in the log), the products following `precision`",
          [](MapReader& f, TrainConfig& c, const FsdpContext&) {
            if (!f.has("mixed_precision")) return;
            // FSDP's dtypes for parameters, gradient reduction and buffers. anvil keeps fp32 master
            // weights and reduces gradients in fp32 (exactly, in fixed point, in deterministic mode)
            // whichever is asked, and the matrix products follow `precision`: at least the precision
            // each asks for.
            std::string mp;
            f.get("mixed_precision", mp);
            ANVIL_CHECK(mp == "PURE" || mp == "DEFAULT" || mp == "FULL", "{}: {} '{}' is not known: expected PURE, "
                        "DEFAULT or FULL", f.source("mixed_precision"), f.full("mixed_precision"), mp);
            if (mp != "FULL")
              c.config_notes.push_back(fmt::format("{}: {} {}: anvil reduces gradients in fp32 and keeps fp32 master "
                                                   "weights; the matrix products follow precision",
                                                   f.source("mixed_precision"), f.full("mixed_precision"), mp));
          }),
      Fsdp::accepted("activation_checkpointing_reentrant", false, "accepted: how PyTorch recomputes; anvil recomputes "
                     "a block"),
      Fsdp::accepted("limit_all_gathers", false, "accepted: a rate limit on FSDP's prefetch; anvil gathers a unit at "
                     "a time"),
      Fsdp::accepted("verbose", false, "accepted"),
      Fsdp::accepted("state_dict_type", std::string("full"), "accepted: FSDP's checkpoint layouts; anvil writes one "
                     "shard per rank and loads them on any number of ranks, whichever",
                     one_of({"full", "sharded", "local"})),
      Fsdp::accepted("backward_prefetch", std::string("BACKWARD_POST"), "accepted: when FSDP gathers the next "
                     "parameters in the backward pass; anvil's communication thread gathers the next unit ahead",
                     one_of({"BACKWARD_PRE", "BACKWARD_POST", "NONE"})),
      Fsdp::custom(
          "cpu_offload", "", "Composer's FSDP key: `true` means `distributed.offload_param` and `offload_optimizer` "
          "`cpu` (FSDP's CPUOffload keeps the parameters, their gradients and so the optimizer step on the CPU); "
          "giving it and different `distributed` offload keys is an error",
          [](MapReader& f, TrainConfig& c, const FsdpContext& ctx) {
            if (!f.has("cpu_offload")) return;
            bool on = false;
            f.get("cpu_offload", on);
            const OffloadDevice device = on ? OffloadDevice::kCpu : OffloadDevice::kNone;
            ANVIL_CHECK(!ctx.offload_given ||
                            (c.distributed.offload_param == device && c.distributed.offload_optimizer == device),
                        "{}: {} {} and distributed.offload_param/offload_optimizer differ: give one of them",
                        f.source("cpu_offload"), f.full("cpu_offload"), on);
            c.distributed.offload_param = c.distributed.offload_optimizer = device;
          }),
      Fsdp::accepted("activation_cpu_offload", false, "`true` is an error",
                     only(false, "activations stay where the model runs; activation_checkpointing saves their "
                          "memory")),
  };
  return table;
}

const std::vector<Field<TrainConfig, TopContext>>& top_fields() {
  using Unit = Duration::Unit;
  static const std::vector<Field<TrainConfig, TopContext>> table = {
      Top::value("run_dir", &TrainConfig::run_dir, "where the run's files go; must not already hold a run")
          .defaults("`runs/<run_name or config file name>`"),
      Top::value("run_name", &TrainConfig::run_name, "a name for logs").defaults("last part of `run_dir`"),
      Top::value("seed", &TrainConfig::seed, "weight initialisation"),
      Top::value("max_seq_len", &TrainConfig::max_seq_len, "tokens per training sequence", positive<int>())
          .required("tokens per training sequence"),
      [] {
        Field<TrainConfig, TopContext> f = Top::custom(
            "model", "", "",
            [](MapReader& r, TrainConfig& c, const TopContext& ctx) {
              MapReader m = r.sub("model");
              if (m.has("name") && m.raw("name").IsScalar() && m.raw("name").Scalar() == "hf_causal_lm") {
                HfCausalLm hf = read_hf_causal_lm(m, r.file());
                c.model = hf.model;
                *ctx.pretrained_weights = hf.weights_dir;
                c.config_notes.insert(c.config_notes.end(), hf.notes.begin(), hf.notes.end());
              } else {
                read_model_section(m, c.model);
              }
            },
            [](YAML::Emitter& e, const TrainConfig& c) {
              e << YAML::Key << "model" << YAML::Value;
              write_model_section(e, c.model);
            });
        f.rows = {
            {"name", "`gpt2`", "the model family: `gpt2`, `mpt_causal_lm` (LLM Foundry's MPT), `llama`, `mistral`, `mixtral`, `qwen2`, "
             "`qwen3` or `qwen3_moe`; "
             "or `hf_causal_lm`, a transformers config (and weights); their keys below"},
            {"n_layers, n_heads, d_model", "required", "shape (every family); `d_model` must divide by `n_heads` unless `head_dim` (Llama-shaped families) is given"},
            {"vocab_size", "50257 (`gpt2`), 50368 (`mpt_causal_lm`), 32000 (`llama`, `mistral`, `mixtral`), 151936 (`qwen2`, `qwen3`, `qwen3_moe`)", ""},
            {"max_seq_len", "`max_seq_len`", "rows of the position embedding, where there is one"},
        };
        return f;
      }(),
      [] {
        Field<TrainConfig, TopContext> f = Top::group("tokenizer", tokenizer_fields(), true);
        f.rows.push_back(kModelMaxLength);
        return f;
      }(),
      Top::section<LoaderConfig, LoaderContext>(
          "train_loader", &TrainConfig::train_loader, loader_fields(),
          [](const TrainConfig& c, const TopContext&) { return LoaderContext{true, c.max_seq_len, c.tokenizer_name}; },
          "the training data: its keys below")
          .required("its dataset.local names the data"),
      Top::custom(
          "eval_loader", "", "as `train_loader`'s keys (its split `val` by default); no eval without it",
          [](MapReader& r, TrainConfig& c, const TopContext&) {
            if (!r.has("eval_loader")) return;
            MapReader l = r.sub("eval_loader");
            read_fields(l, loader_fields(), c.eval_loader, LoaderContext{false, c.max_seq_len, c.tokenizer_name});
            l.finish();
            c.has_eval = true;
          },
          [](YAML::Emitter& e, const TrainConfig& c) {
            if (!c.has_eval) return;
            e << YAML::Key << "eval_loader" << YAML::Value << YAML::BeginMap;
            write_fields(e, loader_fields(), c.eval_loader);
            e << YAML::EndMap;
          }),
      Top::section("optimizer", &TrainConfig::optimizer, optimizer_fields()),
      Top::section("scheduler", &TrainConfig::scheduler, scheduler_fields()),
      Top::group("algorithms", algorithms_fields(), true),
      Top::value("max_duration", &TrainConfig::max_duration, "`Nba` (optimizer steps), `Nep`, `Nsp` (samples), `Ntok`; "
                 "a bare number means epochs",
                 duration_in({Unit::kBatch, Unit::kEpoch, Unit::kSample, Unit::kToken}, "be a positive number of ba, "
                             "ep, sp or tok"))
          .required("e.g. 1000ba or 1ep"),
      Top::value("eval_interval", &TrainConfig::eval_interval, "`Nba` or `Nep`; eval also runs after the last step",
                 duration_in({Unit::kBatch, Unit::kEpoch}, "be a positive number of batches (ba) or epochs (ep)")),
      Top::value("eval_first", &TrainConfig::eval_first, "evaluate before the first step"),
      Top::value("eval_subset_num_batches", &TrainConfig::eval_subset_num_batches, "eval batches per evaluation",
                 minus_one_or_positive<int>("all"))
          .defaults("-1 (all)"),
      yaml_setting("icl_tasks", &TrainConfig::icl_tasks, YAML::NodeType::Sequence,
                   "LLM Foundry's in-context-learning tasks, evaluated at each evaluation (with or without "
                   "`eval_loader`) and logged as `metrics/<label>/<N>-shot/<metric>`: a task file's path "
                   "(Foundry's `tasks_v0.3.yaml` as published) or the `icl_tasks` list itself ([eval.md](eval.md))"),
      yaml_setting("eval_gauntlet", &TrainConfig::eval_gauntlet, YAML::NodeType::Map,
                   "LLM Foundry's eval gauntlet over the `icl_tasks` scores, logged as "
                   "`icl/metrics/eval_gauntlet/<category or average>`: a gauntlet file's path or the section itself"),
      Top::value("icl_seq_len", &TrainConfig::icl_seq_len, "the ICL tasks' sequence length (a task's own "
                 "`max_seq_len` wins), at most `max_seq_len`", not_negative<int>())
          .defaults("`max_seq_len`"),
      Top::value("icl_subset_num_batches", &TrainConfig::icl_subset_num_batches, "each ICL task without "
                 "categories cut to its first N batches of `device_eval_batch_size` questions (Foundry's "
                 "rule; counted over all ranks)", minus_one_or_positive<int>("all"))
          .defaults("-1 (all)"),
      Top::custom(
          "global_train_batch_size", "required, unless the next two give it", "sequences per optimizer step",
          [](MapReader& r, TrainConfig& c, const TopContext&) {
            r.get("global_train_batch_size", c.global_train_batch_size);
          },
          [](YAML::Emitter& e, const TrainConfig& c) {
            if (c.global_train_batch_size > 0)  // else derived by DeepSpeed's batch rule
              Top::emit(e, "global_train_batch_size", c.global_train_batch_size);
          }),
      Top::value("gradient_accumulation_steps", &TrainConfig::gradient_accumulation_steps,
                 "DeepSpeed's and Hugging Face's name: with it (or without `global_train_batch_size`), DeepSpeed's "
                 "rule applies: global batch = microbatch × accumulation steps × ranks, any two giving the third (one "
                 "microbatch size alone: one step), checked when the number of ranks is known")
          .defaults("what the sizes give"),
      Top::custom(
          "device_train_microbatch_size", "the whole batch",
          "sequences per forward/backward on a rank (at most `global_train_batch_size / ranks`); the gradient is "
          "the same whatever it is. `auto`: the largest that fits in `memory_limit` (below)",
          [](MapReader& r, TrainConfig& c, const TopContext&) {
            if (!r.has("device_train_microbatch_size")) return;
            const YAML::Node m = r.raw("device_train_microbatch_size");
            c.microbatch_auto = m.IsScalar() && m.Scalar() == "auto";
            if (!c.microbatch_auto) r.get("device_train_microbatch_size", c.device_train_microbatch_size);
          },
          [](YAML::Emitter& e, const TrainConfig& c) {
            if (c.microbatch_auto)
              Top::emit(e, "device_train_microbatch_size", std::string("auto"));
            else
              Top::emit(e, "device_train_microbatch_size", c.device_train_microbatch_size);
          }),
      Top::value("device_eval_batch_size", &TrainConfig::device_eval_batch_size, "")
          .defaults("the microbatch size"),
      Top::bytes("memory_limit", &TrainConfig::memory_limit,
                 "bytes one rank may hold (`\"12gb\"`, as `cache_limit`): model states, working buffers and "
                 "activations. `auto` picks the largest microbatch whose activations fit in what the model states "
                 "leave; an explicit microbatch that does not fit is an error at start. -1: the memory available at "
                 "start (MemAvailable, or the cgroup's limit if lower; under `kernels: gpu` the GPU's free memory, "
                 "with attention's scratch counted), shared by the ranks on the host, less a tenth"),
      Top::value("activation_checkpointing", &TrainConfig::activation_checkpointing,
                 "keep only each block's input and recompute the block in the backward pass: one block's activations "
                 "instead of `n_layers`', for one more forward pass of the blocks; the same bits. LLM Foundry's "
                 "`fsdp_config.activation_checkpointing` means the same"),
      Top::value("precision", &TrainConfig::precision, "`amp_bf16` or `amp_fp16`: matrix products in 16-bit, fp32 "
                 "master weights and sums ([precision.md](precision.md))"),
      Top::section("loss_scaler", &TrainConfig::loss_scaler, loss_scaler_fields()),
      Top::value("console_log_interval", &TrainConfig::console_log_interval, "how often a step line goes into "
                 "`train.log`", duration_in({Unit::kBatch}, "be a positive number of batches (e.g. 1ba)")),
      Top::value("progress_bar", &TrainConfig::progress_bar, "false: plain progress lines every few seconds instead "
                 "of a bar redrawn in place"),
      Top::accepted("expandable_segments", false, "accepted: PyTorch's CUDA allocator option; anvil's GPU memory "
                    "is its own caching allocator's"),
      Top::accepted("log_to_console", true, "accepted as true (anvil always logs to the console and `train.log`); "
                    "false is an error", only(true, "anvil logs to the console and train.log")),
      Top::group("callbacks", callbacks_fields(), false),
      Top::group("loggers", loggers_fields(), true),
      Top::value("save_interval", &TrainConfig::save_interval, "checkpoint every N batches (`ba`) or epochs (`ep`), "
                 "and always at the end",
                 duration_in({Unit::kBatch, Unit::kEpoch}, "be a positive number of batches (ba) or epochs (ep)")),
      Top::value("save_folder", &TrainConfig::save_folder,
                 "Composer's: where checkpoints are written and where `autoresume` looks; `{run_name}` is replaced. A "
                 "local (or mounted) directory, or `s3://bucket/prefix` (S3 or S3-compatible; endpoint, region and "
                 "credentials as for streaming, below): each checkpoint is written to `RUN_DIR/checkpoints` as usual, "
                 "then uploaded by rank 0 (its files under `prefix/step-NNNNNNNN/`, one PUT each or a multipart "
                 "upload above 64 MiB, then `prefix/latest`), in the background; an upload that fails is a failed "
                 "save (`save_failure`). `autoresume` with no usable local checkpoint downloads the one the bucket's "
                 "`latest` names. Remote checkpoints are never pruned (`save_num_checkpoints_to_keep` prunes the "
                 "local ones), as Composer keeps them. Other URL schemes are an error",
                 Check<std::string>{[](const std::string& f) {
                                      return f.find("://") == std::string::npos || is_s3_folder(f);
                                    },
                                    "be a local directory or s3://bucket/prefix (checkpoints are uploaded to S3 or "
                                    "S3-compatible storage only)"})
          .defaults("`RUN_DIR/checkpoints`"),
      Top::value("save_overwrite", &TrainConfig::save_overwrite,
                 "Composer's: a new run (not resuming) in a `run_dir` or `save_folder` that holds an earlier run "
                 "replaces it (its checkpoints, metrics, log and event files); without it that is an error"),
      Top::value("save_failure", &TrainConfig::save_failure,
                 "a checkpoint that cannot be written (a full disk, a read-only directory; the error names the file, "
                 "the bytes it needs and those free): `stop` ends the run with that error, `continue` logs it and "
                 "trains on. Either way what the failed save wrote is removed, the previous checkpoint stays whole "
                 "and `latest`, and a partly written file is never taken for a checkpoint"),
      Top::value("save_num_checkpoints_to_keep", &TrainConfig::save_num_checkpoints_to_keep, "keep the newest N "
                 "checkpoints", minus_one_or_positive<int>("keep all"))
          .defaults("-1 (all)"),
      Top::value("autoresume", &TrainConfig::autoresume,
                 "continue the run in `run_dir` from its newest complete, undamaged checkpoint (damaged ones are "
                 "reported and skipped); this wins over `load_path`, as in Composer; with no checkpoint there, start "
                 "from `load_path`, else from the seed"),
      Top::value("load_path", &TrainConfig::load_path,
                 "start from this checkpoint (a checkpoint directory or a run directory), on any number of ranks and "
                 "any ZeRO stage, or from a transformers model directory's weights"),
      Top::value("load_weights_only", &TrainConfig::load_weights_only,
                 "take only the weights of `load_path`'s checkpoint: a fresh optimizer, data order and step count "
                 "(fine-tuning); a run that autoresumes from its own checkpoint continues it whole. A checkpoint "
                 "without training state (`anvil import`'s, a transformers directory) is always loaded this way; the "
                 "config's model must be the same architecture, its init and (without a position table) its context "
                 "length may differ"),
      Top::value("kernels", &TrainConfig::kernels,
                 "`gpu` runs the GPU kernels (a cuda-release or hip-release build; each rank the GPU numbered its "
                 "local rank, [gpu.md](gpu.md)); `ref` runs the scalar reference ops, for debugging"),
      Top::value("dist_timeout", &TrainConfig::dist_timeout, "seconds a collective waits before the job is aborted, "
                 "naming the ranks that did not arrive", positive<double>()),
      Top::value("deterministic_mode", &TrainConfig::deterministic_mode,
                 "gradients summed in fixed point: the same weights, bit for bit, for any world size, microbatch "
                 "size, ZeRO stage or resume point ([determinism.md](determinism.md)); `false`: fp32 sums, each "
                 "layer's backward one product over the microbatch (faster; needed for `grad_compression: bf16`)"),
      Top::section("distributed", &TrainConfig::distributed, distributed_fields()),
      [] {
        Field<TrainConfig, TopContext> f = Top::custom("fsdp_config", "", "", [](MapReader& r, TrainConfig& c,
                                                                                 const TopContext&) {
          MapReader d = r.sub("distributed");
          const FsdpContext given{d.has("zero_stage"), r.has("activation_checkpointing"),
                                  d.has("offload_optimizer") || d.has("offload_param")};
          MapReader f = r.sub("fsdp_config");
          read_fields(f, fsdp_fields(), c, given);
          f.finish();
        });
        f.rows = key_docs(fsdp_fields());
        return f;
      }(),
      // Consumed before the rest (config/deepspeed.h); named here so that a misspelling of it
      // is suggested the right key.
      Top::custom("deepspeed_config", "", "a DeepSpeed `ds_config` (a mapping, or the path of a JSON file), "
                  "translated into the keys above: see below",
                  [](MapReader& r, TrainConfig&, const TopContext&) { r.has("deepspeed_config"); }),
      // Foundry's fine-tuning YAMLs keep the dataset settings their loaders merge in
      // (`<<: *hf_dataset`) under a top-level `dataset` anchor; the key itself configures nothing.
      Top::custom("dataset", "", "LLM Foundry's anchor for its loaders' merged dataset settings; configures nothing "
                  "itself",
                  [](MapReader& r, TrainConfig&, const TopContext&) { r.raw("dataset"); }),
  };
  return table;
}

}  // namespace

const std::vector<Field<TrainConfig, TopContext>>& train_config_fields() { return top_fields(); }

std::vector<std::string> key_doc_table_names() { return {"main", "finetuning"}; }

std::string key_doc_table(const std::string& name) {
  if (name == "main") return key_docs_markdown(key_docs(top_fields()));
  ANVIL_CHECK(name == "finetuning", "no key table named '{}': expected main or finetuning", name);
  return key_docs_markdown(key_docs(finetuning_fields()));
}

}  // namespace anvil
