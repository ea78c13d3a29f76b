// YAML -> TrainConfig: overrides are applied to the YAML tree first, so a key=value is checked
// exactly like the same key written in the file.
#include "config/train_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <set>

#include "config/deepspeed.h"
#include "config/hf_model_config.h"
#include "config/map_reader.h"
#include "config/model_section.h"
#include "config/yaml_document.h"
#include "config/yaml_number.h"
#include "core/error.h"
#include "core/log.h"

namespace anvil {
namespace {

// LLM Foundry repeats max_seq_len in places (a loader's dataset, the tokenizer's kwargs): given
// there, it must be the top-level value.
void check_repeated_max_seq_len(MapReader& r, const char* key, int max_seq_len, const std::string& file) {
  int repeated = 0;
  r.get(key, repeated);
  ANVIL_CHECK(!r.has(key) || repeated == max_seq_len, "{}: {} is {}, but max_seq_len is {}: they must agree",
              file, r.full(key), repeated, max_seq_len);
}

// A tokenizer name as the config keeps it: a path is made absolute, so that the checkpoint's
// config names the same files from anywhere.
std::string tokenizer_name_as_kept(const std::string& name) {
  std::error_code ec;
  if (name == "gpt2" || !std::filesystem::exists(name, ec)) return name;
  return std::filesystem::absolute(name, ec).lexically_normal().string();
}

// A finetuning loader's dataset keys, as LLM Foundry names them.
void read_finetuning(MapReader& d, DatasetConfig& ds, bool train) {
  FinetuningConfig& ft = ds.finetuning;
  d.get("hf_name", ft.hf_name);
  MapReader kw = d.sub("hf_kwargs");
  kw.get("data_dir", ft.data_dir);
  if (kw.has("data_files")) {
    // One path, a list of them, or (as Hugging Face's loaders take it) a map of split to path(s).
    YAML::Node files = kw.raw("data_files");
    if (files.IsMap()) {
      ANVIL_CHECK(files[ds.split], "{}: {} names no files for split '{}'", kw.source("data_files"),
                  kw.full("data_files"), ds.split);
      files = files[ds.split];
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
  if (d.has("preprocessing_fn")) {
    std::string fn;
    d.get("preprocessing_fn", fn);
    ANVIL_FAIL("{}: {} '{}' names Python code, which anvil does not run: write the records as JSON lines of "
               "{{\"prompt\", \"response\"}} or {{\"messages\": [...]}} and leave preprocessing_fn out",
               d.source("preprocessing_fn"), d.full("preprocessing_fn"), fn);
  }
  bool flag = true;
  d.get("decoder_only_format", flag);
  ANVIL_CHECK(flag, "{}: {}: false is for encoder-decoder models; anvil's models are decoders", d.source(
              "decoder_only_format"), d.full("decoder_only_format"));
  d.get("allow_pad_trimming", ft.allow_pad_trimming);
  ANVIL_CHECK(train || !ft.allow_pad_trimming, "{}: {}: true is for the train loader (evaluation pads each example to "
              "max_seq_len)", d.source("allow_pad_trimming"), d.full("allow_pad_trimming"));
  if (d.has("packing_ratio")) {
    const YAML::Node r = d.raw("packing_ratio");
    ANVIL_CHECK(!(r.IsScalar() && r.Scalar() == "auto"), "{}: {}: auto (profiling for a ratio) is not supported: give "
                "a number, e.g. the examples of about max_seq_len / (their mean length) per sequence",
                d.source("packing_ratio"), d.full("packing_ratio"));
    d.get("packing_ratio", ft.packing_ratio);
    ANVIL_CHECK(train, "{}: {}: evaluation runs each example as its own sequence; packing is for the train loader",
                d.source("packing_ratio"), d.full("packing_ratio"));
    ANVIL_CHECK(ft.packing_ratio >= 1, "{}: {} must be at least 1 (examples per sequence), got {}",
                d.source("packing_ratio"), d.full("packing_ratio"), ft.packing_ratio);
  }
  d.get("safe_load", flag);  // whether Foundry may run a dataset's own code; anvil never does
  std::string prompts = "none", responses = "last";
  d.get("target_prompts", prompts);
  d.get("target_responses", responses);
  std::string section = d.full("-");  // the dataset's dotted name, for the message
  section.pop_back();
  section.pop_back();
  ft.targets = parse_target_policy(prompts, responses, d.source("target_prompts") + ": " + section);
  if (d.has("chat_template")) {
    const std::string where = d.source("chat_template") + ": " + d.full("chat_template");
    const YAML::Node t = d.raw("chat_template");
    if (t.IsScalar()) {
      ft.chat_template = chat_template_named(t.Scalar(), where);
    } else {
      MapReader c = d.sub("chat_template");
      ft.chat_template.name = "custom";
      c.get("name", ft.chat_template.name);
      ANVIL_CHECK(c.has("message") && c.has("generation_prompt"), "{}: a chat template map needs message (with "
                  "{{role}} and {{content}}) and generation_prompt", where);
      c.get("message", ft.chat_template.message);
      c.get("generation_prompt", ft.chat_template.generation_prompt);
      c.finish();
    }
    validate_chat_template(ft.chat_template, where);
  }
  d.get("too_long", ft.too_long);
  d.get("skip_malformed", ft.skip_malformed);
}

void read_loader(MapReader r, LoaderConfig& out, const std::string& default_split, int max_seq_len,
                 const std::string& tokenizer, const std::string& file) {
  r.get("name", out.name);
  MapReader d = r.sub("dataset");
  DatasetConfig& ds = out.dataset;
  d.get("remote", ds.remote);
  d.get("local", ds.local);
  ds.split = default_split;
  d.get("split", ds.split);
  if (out.name == LoaderKind::kFinetuning) read_finetuning(d, ds, default_split == "train");
  d.get("shuffle", ds.shuffle);
  d.get("shuffle_seed", ds.shuffle_seed);
  d.get("shuffle_algo", ds.shuffle_algo);
  d.get("shuffle_block_size", ds.shuffle_block_size);
  d.get("num_canonical_nodes", ds.num_canonical_nodes);
  d.get("epoch_size", ds.epoch_size);
  d.get_bytes("cache_limit", ds.cache_limit);
  d.get("predownload", ds.predownload);
  d.get("download_retry", ds.download_retry);
  d.get("download_timeout", ds.download_timeout);
  d.get("validate_hash", ds.validate_hash);
  check_repeated_max_seq_len(d, "max_seq_len", max_seq_len, file);
  // Foundry's older files repeat the tokenizer in the dataset: it must be tokenizer.name's.
  std::string repeated = tokenizer;
  d.get("tokenizer_name", repeated);
  ANVIL_CHECK(tokenizer_name_as_kept(repeated) == tokenizer, "{}: {} is '{}', but tokenizer.name is '{}': they must "
              "agree", file, d.full("tokenizer_name"), repeated, tokenizer);
  if (d.has("streams")) {
    const YAML::Node streams = d.raw("streams");
    ANVIL_CHECK(streams.IsMap() && streams.size() > 0, "{}: {} must map stream names to their settings", file,
                d.full("streams"));
    for (auto it = streams.begin(); it != streams.end(); ++it) {
      StreamConfig sc;
      sc.name = it->first.as<std::string>();
      MapReader sr(it->second, d.full("streams") + "." + sc.name, file);
      sr.get("remote", sc.remote);
      sr.get("local", sc.local);
      sc.split = ds.split;
      sr.get("split", sc.split);
      sr.get("proportion", sc.proportion);
      sr.finish();
      ANVIL_CHECK(!sc.remote.empty() || !sc.local.empty(), "{}: {} needs `local` (a dataset directory) or `remote`",
                  file, sr.full("local"));
      ANVIL_CHECK(sc.proportion > 0, "{}: {} must be positive", file, sr.full("proportion"));
      ds.streams.push_back(sc);
    }
  }
  d.finish();
  const bool mds = !ds.streams.empty() || !ds.remote.empty() || !ds.local.empty();
  if (!ds.finetuning.hf_name.empty())
    ANVIL_CHECK(!mds, "{}: {} reads JSON records and local/remote/streams an MDS dataset: give one of them", file,
                d.full("hf_name"));
  else if (out.name == LoaderKind::kFinetuning)
    ANVIL_CHECK(mds, "{}: {} (JSON records: a .jsonl file, a directory, or json with hf_kwargs.data_dir) or {} (a "
                "dataset made by `anvil data prepare --format finetuning`) is required", file, d.full("hf_name"),
                d.full("local"));
  else
    ANVIL_CHECK(mds, "{}: {} or {} is required (a dataset made by `anvil data prepare`, or a remote holding one)",
                file, d.full("local"), d.full("remote"));
  ANVIL_CHECK(ds.shuffle_algo == "none" || ds.shuffle_algo == "py1s" || ds.shuffle_algo == "py1e",
              "{}: {} = '{}' is not known (expected none, py1s or py1e)", file, d.full("shuffle_algo"), ds.shuffle_algo);
  ANVIL_CHECK(ds.num_canonical_nodes >= 1, "{}: {} must be at least 1", file, d.full("num_canonical_nodes"));
  ANVIL_CHECK(ds.shuffle_block_size == -1 || ds.shuffle_block_size >= 1, "{}: {} must be positive", file,
              d.full("shuffle_block_size"));
  ANVIL_CHECK(ds.epoch_size == -1 || ds.epoch_size >= 1, "{}: {} must be positive", file, d.full("epoch_size"));
  ANVIL_CHECK(ds.download_retry >= 0, "{}: {} must be 0 or more", file, d.full("download_retry"));
  ANVIL_CHECK(ds.download_timeout > 0, "{}: {} must be positive (seconds)", file, d.full("download_timeout"));
  r.get("drop_last", out.drop_last);
  r.get("num_workers", out.num_workers);
  // PyTorch DataLoader's worker settings: anvil's num_workers decode threads share the process's
  // memory (nothing to pin or to keep alive) and wait for their batch as long as it takes.
  bool flag = false;
  int count = 0;
  double seconds = 0;
  r.get("pin_memory", flag);
  r.get("persistent_workers", flag);
  r.get("prefetch_factor", count);
  r.get("timeout", seconds);
  ANVIL_CHECK(out.num_workers >= 0, "{} must be >= 0", r.full("num_workers"));
  r.finish();
}

// Composer's keys, or DeepSpeed's parameters under the name of one of its schedules.
void read_scheduler(MapReader& s, SchedulerConfig& out, const std::string& file) {
  s.get("name", out.name);
  if (!out.is_deepspeed()) {
    s.get_duration("t_warmup", out.t_warmup);
    s.get_duration("t_max", out.t_max);
    s.get("alpha_f", out.alpha_f);
    return;
  }
  const std::string name = choice_name(out.name);
  if (out.name == SchedulerKind::kOneCycle)
    ANVIL_CHECK(s.has("cycle_min_lr") && s.has("cycle_max_lr"), "{}: scheduler OneCycle needs {} and {}", file,
                s.full("cycle_min_lr"), s.full("cycle_max_lr"));
  for (const SchedulerParam& p : scheduler_params(out.name)) {
    switch (p.kind) {
      case SchedulerParam::Kind::kRate: {
        double& v = out.*p.rate;
        s.get(p.key, v);
        ANVIL_CHECK(v >= 0, "{}: {} must not be negative, got {}", file, s.full(p.key), v);
        break;
      }
      case SchedulerParam::Kind::kSteps: {
        int64_t& v = out.*p.steps;
        s.get(p.key, v);
        ANVIL_CHECK(v >= p.least, "{}: {} must be at least {} (scheduler {}), got {}", file, s.full(p.key), p.least,
                    name, v);
        break;
      }
      case SchedulerParam::Kind::kWarmupType:
        s.get(p.key, out.warmup_type);
        break;
      case SchedulerParam::Kind::kMomentumOff: {
        // DeepSpeed cycles Adam's beta1 inversely to the rate unless told not to.
        bool cycle_momentum = true;
        s.get(p.key, cycle_momentum);
        ANVIL_CHECK(!cycle_momentum, "{}: scheduler {} with {} true (DeepSpeed's default) is not supported: anvil "
                    "keeps the optimizer's betas fixed; give {}: false", file, name, p.key, s.full(p.key));
        break;
      }
      case SchedulerParam::Kind::kUnused: {
        int64_t unused = 0;
        s.get(p.key, unused);
        break;
      }
    }
  }
}

}  // namespace

namespace {
std::string save_folder_of(const TrainConfig& cfg) {
  std::string dir = cfg.save_folder;
  for (size_t at; (at = dir.find("{run_name}")) != std::string::npos;) dir.replace(at, 10, cfg.run_name);
  return dir;
}
bool remote_folder(const std::string& folder) { return folder.rfind("s3://", 0) == 0; }
}  // namespace

std::string checkpoints_dir(const TrainConfig& cfg) {
  if (cfg.save_folder.empty() || remote_folder(cfg.save_folder)) return cfg.run_dir + "/checkpoints";
  return save_folder_of(cfg);
}

std::string checkpoints_remote(const TrainConfig& cfg) {
  return remote_folder(cfg.save_folder) ? save_folder_of(cfg) : "";
}

int64_t parse_bytes(const std::string& text, const std::string& what) {
  size_t end = 0;
  double v = -1;
  try {
    v = std::stod(text, &end);
  } catch (const std::exception&) {
  }
  std::string unit = text.substr(end);
  for (char& ch : unit) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  const std::pair<const char*, double> kUnits[] = {{"", 1}, {"b", 1}, {"kb", 1024.0}, {"mb", 1024.0 * 1024},
                                                   {"gb", 1024.0 * 1024 * 1024}, {"tb", 1024.0 * 1024 * 1024 * 1024}};
  for (auto& [u, scale] : kUnits)
    if (unit == u && v > 0) return static_cast<int64_t>(v * scale);
  ANVIL_FAIL("{} = '{}' is not a size (expected bytes, or a number with kb, mb, gb or tb)", what, text);
}

namespace {

// optimizer: AdamW's settings.
void read_optimizer(MapReader& top, OptimizerConfig& out, const std::string& path) {
  MapReader o = top.sub("optimizer");
  o.get("name", out.name);
  o.get("lr", out.lr);
  if (o.has("betas")) {
    YAML::Node b = o.raw("betas");
    ANVIL_CHECK(b.IsSequence() && b.size() == 2, "{}: optimizer.betas must be a list of two numbers, e.g. [0.9, 0.95]", path);
    try {
      out.beta1 = b[0].as<double>();
      out.beta2 = b[1].as<double>();
    } catch (const YAML::Exception&) {
      ANVIL_FAIL("{}: optimizer.betas must be a list of two numbers, e.g. [0.9, 0.95]", path);
    }
  }
  o.get("eps", out.eps);
  o.get("weight_decay", out.weight_decay);
  o.finish();
}

// algorithms.gradient_clipping: by the global norm only.
void read_gradient_clipping(MapReader& top, TrainConfig& c, const std::string& path) {
  MapReader a = top.sub("algorithms");
  MapReader g = a.sub("gradient_clipping");
  std::string type = "norm";
  g.get("clipping_type", type);
  ANVIL_CHECK(type == "norm", "{}: algorithms.gradient_clipping.clipping_type '{}' is not supported: expected 'norm'", path, type);
  g.get("clipping_threshold", c.clipping_threshold);
  g.finish();
  a.finish();
}

// loss_scaler: amp_fp16's dynamic loss scale.
void read_loss_scaler(MapReader& top, LossScalerConfig& out) {
  MapReader l = top.sub("loss_scaler");
  l.get("init_scale", out.init_scale);
  l.get("growth_interval", out.growth_interval);
  l.get("hysteresis", out.hysteresis);
  l.get("min_scale", out.min_scale);
  l.get("consecutive_hysteresis", out.consecutive_hysteresis);
  l.finish();
}

// Composer's callbacks whose figures anvil reports anyway (tokens/s, lr, memory, ETA).
void read_callbacks(MapReader& top, const std::string& path) {
  MapReader cb = top.sub("callbacks");
  if (cb.has("speed_monitor")) {
    MapReader sm = cb.sub("speed_monitor");
    int window = 1;  // Composer averages tokens/s over it; anvil reports each step's
    sm.get("window_size", window);
    ANVIL_CHECK(window > 0, "{}: callbacks.speed_monitor.window_size must be positive", path);
    sm.finish();
  }
  for (const char* name : {"lr_monitor", "memory_monitor", "runtime_estimator"}) {
    if (!cb.has(name)) continue;
    MapReader sub = cb.sub(name);
    sub.finish();
  }
  cb.finish();
}

// Composer's loggers: TensorBoard's event files; the others need services anvil does not reach.
void read_loggers(MapReader& top, TrainConfig& c, const std::string& path) {
  MapReader lg = top.sub("loggers");
  if (lg.has("tensorboard")) {
    c.tensorboard = true;
    MapReader tb = lg.sub("tensorboard");
    tb.get("log_dir", c.tensorboard_dir);
    int flush_interval = 1;  // Composer flushes every N batches; anvil writes each event through
    tb.get("flush_interval", flush_interval);
    ANVIL_CHECK(flush_interval > 0, "{}: loggers.tensorboard.flush_interval must be positive", path);
    bool rank_zero_only = true;
    tb.get("rank_zero_only", rank_zero_only);
    ANVIL_CHECK(rank_zero_only, "{}: loggers.tensorboard.rank_zero_only: false is not supported (rank 0 logs the "
                "global figures)", path);
    tb.finish();
  }
  for (const char* other : {"wandb", "mlflow", "comet_ml", "neptune"})
    ANVIL_CHECK(!lg.has(other), "{}: loggers.{} is not supported (it needs a service anvil does not reach); "
                "anvil writes metrics.jsonl, train.log and, with loggers.tensorboard, TensorBoard event files",
                path, other);
  lg.finish();
}

// distributed, and LLM Foundry's fsdp_config spelling of the same choices.
void read_distributed(MapReader& top, TrainConfig& c, const std::string& path) {
  MapReader d = top.sub("distributed");
  d.get("zero_stage", c.distributed.zero_stage);
  d.get("all_reduce", c.distributed.all_reduce);
  d.get("grad_compression", c.distributed.grad_compression);
  d.get("gpu_collectives", c.distributed.gpu_collectives);
  const bool stage_given = d.has("zero_stage");
  d.finish();
  MapReader f = top.sub("fsdp_config");
  if (f.has("sharding_strategy")) {
    // LLM Foundry's FSDP strategies are ZeRO stages 0, 2 and 3.
    std::string strategy;
    f.get("sharding_strategy", strategy);
    const int stage = strategy == "NO_SHARD" ? 0 : strategy == "SHARD_GRAD_OP" ? 2 : strategy == "FULL_SHARD" ? 3 : -1;
    ANVIL_CHECK(stage >= 0, "{}: fsdp_config.sharding_strategy '{}' is not supported: expected NO_SHARD, "
                "SHARD_GRAD_OP or FULL_SHARD (or set distributed.zero_stage)", path, strategy);
    ANVIL_CHECK(!stage_given || stage == c.distributed.zero_stage, "{}: fsdp_config.sharding_strategy {} means "
                "zero_stage {}, but distributed.zero_stage is {}: give one of them", path, strategy, stage,
                c.distributed.zero_stage);
    c.distributed.zero_stage = stage;
  }
  if (f.has("activation_checkpointing")) {
    bool on = false;
    f.get("activation_checkpointing", on);
    ANVIL_CHECK(!top.has("activation_checkpointing") || on == c.activation_checkpointing, "{}: "
                "fsdp_config.activation_checkpointing and activation_checkpointing differ: give one of them", path);
    c.activation_checkpointing = on;
  }
  if (f.has("mixed_precision")) {
    // FSDP's dtypes for parameters, gradient reduction and buffers. anvil keeps fp32 master
    // weights and reduces gradients in fp32 (exactly, in fixed point, in deterministic mode)
    // whichever is asked, and the matrix products follow `precision`: at least the precision
    // each asks for.
    std::string mp;
    f.get("mixed_precision", mp);
    ANVIL_CHECK(mp == "PURE" || mp == "DEFAULT" || mp == "FULL", "{}: fsdp_config.mixed_precision '{}' is not "
                "known: expected PURE, DEFAULT or FULL", path, mp);
    if (mp != "FULL")
      c.config_notes.push_back(fmt::format("{}: fsdp_config.mixed_precision {}: anvil reduces gradients in fp32 "
                                           "and keeps fp32 master weights; the matrix products follow precision",
                                           path, mp));
  }
  bool flag = false;
  f.get("activation_checkpointing_reentrant", flag);  // how PyTorch recomputes; anvil recomputes a block
  f.get("limit_all_gathers", flag);                   // a rate limit on FSDP's prefetch; anvil gathers a unit at a time
  f.get("verbose", flag);
  bool offload = false;
  f.get("activation_cpu_offload", offload);
  ANVIL_CHECK(!offload, "{}: fsdp_config.activation_cpu_offload: true is not supported (activations stay where "
              "the model runs; activation_checkpointing saves their memory)", path);
  f.finish();
}

// The batch sizes: DeepSpeed's rule (left for resolve_batch_sizes, once the ranks are known), or
// a global batch with the microbatch and eval batch defaulting to it. global_given: the config set
// global_train_batch_size.
void check_batch_sizes(TrainConfig& c, const MapReader& blame, const std::string& path, bool global_given) {
  auto positive = [&](long long v, const char* key) {
    ANVIL_CHECK(v > 0, "{}: {} must be a positive integer, got {}", blame.source(key), key, v);
  };
  if (c.gradient_accumulation_steps != 0 || !global_given) {
    // DeepSpeed's batch rule, resolved once the number of ranks is known (resolve_batch_sizes).
    ANVIL_CHECK(c.gradient_accumulation_steps >= 0, "{}: gradient_accumulation_steps must be positive, got {}",
                blame.source("gradient_accumulation_steps"), c.gradient_accumulation_steps);
    ANVIL_CHECK(!c.microbatch_auto, "{}: device_train_microbatch_size: auto chooses the accumulation steps itself: "
                "give global_train_batch_size without gradient_accumulation_steps", path);
    ANVIL_CHECK(c.device_train_microbatch_size > 0 || c.global_train_batch_size > 0, "{}: give "
                "global_train_batch_size, or device_train_microbatch_size and gradient_accumulation_steps", path);
    ANVIL_CHECK(c.device_train_microbatch_size >= 0 && c.global_train_batch_size >= 0, "{}: the batch sizes must "
                "be positive", path);
  } else if (!c.microbatch_auto) {  // auto is resolved by the trainer, and so is the eval batch it defaults
    positive(c.global_train_batch_size, "global_train_batch_size");
    if (c.device_train_microbatch_size == 0) c.device_train_microbatch_size = c.global_train_batch_size;
    positive(c.device_train_microbatch_size, "device_train_microbatch_size");
    if (c.device_train_microbatch_size > c.global_train_batch_size) {
      log_warn("device_train_microbatch_size {} exceeds the device batch {}; using {}", c.device_train_microbatch_size,
               c.global_train_batch_size, c.global_train_batch_size);
      c.device_train_microbatch_size = c.global_train_batch_size;
    }
    if (c.device_eval_batch_size == 0) c.device_eval_batch_size = c.device_train_microbatch_size;
    positive(c.device_eval_batch_size, "device_eval_batch_size");
  } else {
    positive(c.global_train_batch_size, "global_train_batch_size");
  }
  ANVIL_CHECK(c.device_eval_batch_size >= 0, "{}: device_eval_batch_size must be positive, got {}",
              blame.source("device_eval_batch_size"),
              c.device_eval_batch_size);
}

// Validation of values, in one place, once every key is read; resolves the sizes that default
// to others (the model's max_seq_len, the microbatch and eval batch). blame: where each key's
// value came from.
void check_values(TrainConfig& c, const MapReader& blame, const std::string& path, bool global_given) {
  auto positive = [&](long long v, const char* key) {
    ANVIL_CHECK(v > 0, "{}: {} must be a positive integer, got {}", blame.source(key), key, v);
  };
  positive(c.max_seq_len, "max_seq_len");
  if (c.model.max_seq_len == 0) c.model.max_seq_len = c.max_seq_len;  // the model section checked the rest
  ANVIL_CHECK(c.model.max_seq_len >= c.max_seq_len, "{}: model.max_seq_len ({}) must be at least max_seq_len ({})",
              blame.source("model.max_seq_len"), c.model.max_seq_len, c.max_seq_len);
  check_batch_sizes(c, blame, path, global_given);
  ANVIL_CHECK(c.optimizer.lr > 0, "{}: optimizer.lr must be positive, got {}",
              blame.source("optimizer.lr"), c.optimizer.lr);
  ANVIL_CHECK(c.optimizer.beta1 >= 0 && c.optimizer.beta1 < 1 && c.optimizer.beta2 >= 0 && c.optimizer.beta2 < 1,
              "{}: optimizer.betas must be in [0, 1), got [{}, {}]",
              blame.source("optimizer.betas"), c.optimizer.beta1, c.optimizer.beta2);
  ANVIL_CHECK(c.optimizer.eps > 0, "{}: optimizer.eps must be positive", blame.source("optimizer.eps"));
  ANVIL_CHECK(c.optimizer.weight_decay >= 0, "{}: optimizer.weight_decay must not be negative",
              blame.source("optimizer.weight_decay"));
  ANVIL_CHECK(c.scheduler.t_warmup.unit == Duration::Unit::kBatch || c.scheduler.t_warmup.unit == Duration::Unit::kDur,
              "{}: scheduler.t_warmup '{}' must be in batches (ba) or a fraction of the run (dur)",
              blame.source("scheduler.t_warmup"),
              c.scheduler.t_warmup.text);
  ANVIL_CHECK((c.scheduler.t_max.unit == Duration::Unit::kBatch || c.scheduler.t_max.unit == Duration::Unit::kDur) &&
                  c.scheduler.t_max.value > 0,
              "{}: scheduler.t_max '{}' must be a positive number of batches (ba) or a fraction of the run (dur)",
              blame.source("scheduler.t_max"),
              c.scheduler.t_max.text);
  ANVIL_CHECK(c.save_interval.unit == Duration::Unit::kBatch || c.save_interval.unit == Duration::Unit::kEpoch,
              "{}: save_interval '{}' must be in batches (ba) or epochs (ep)",
              blame.source("save_interval"), c.save_interval.text);
  ANVIL_CHECK(c.save_interval.value > 0, "{}: save_interval must be positive", blame.source("save_interval"));
  ANVIL_CHECK(c.save_num_checkpoints_to_keep == -1 || c.save_num_checkpoints_to_keep > 0,
              "{}: save_num_checkpoints_to_keep must be -1 (keep all) or positive, got {}",
              blame.source("save_num_checkpoints_to_keep"),
              c.save_num_checkpoints_to_keep);
  ANVIL_CHECK(c.scheduler.alpha_f >= 0 && c.scheduler.alpha_f <= 1, "{}: scheduler.alpha_f must be in [0, 1]",
              blame.source("scheduler.alpha_f"));
  ANVIL_CHECK(c.clipping_threshold >= 0, "{}: algorithms.gradient_clipping.clipping_threshold must not be negative",
              blame.source("algorithms.gradient_clipping.clipping_threshold"));
  ANVIL_CHECK(c.max_duration.unit != Duration::Unit::kDur && c.max_duration.value > 0,
              "{}: max_duration '{}' must be a positive number of ba, ep, sp or tok",
              blame.source("max_duration"), c.max_duration.text);
  ANVIL_CHECK(c.eval_interval.unit == Duration::Unit::kBatch || c.eval_interval.unit == Duration::Unit::kEpoch,
              "{}: eval_interval '{}' must be in batches (ba) or epochs (ep)",
              blame.source("eval_interval"), c.eval_interval.text);
  ANVIL_CHECK(c.eval_interval.value > 0, "{}: eval_interval must be positive", blame.source("eval_interval"));
  ANVIL_CHECK(c.console_log_interval.unit == Duration::Unit::kBatch && c.console_log_interval.value > 0,
              "{}: console_log_interval must be a positive number of batches (e.g. 1ba)",
              blame.source("console_log_interval"));
  ANVIL_CHECK(c.eval_subset_num_batches == -1 || c.eval_subset_num_batches > 0,
              "{}: eval_subset_num_batches must be -1 (all) or positive", blame.source("eval_subset_num_batches"));
  auto power_of_two = [](double x) {
    int e = 0;
    return x > 0 && std::frexp(x, &e) == 0.5;
  };
  const LossScalerConfig& ls = c.loss_scaler;
  ANVIL_CHECK(power_of_two(ls.init_scale) && ls.init_scale <= 0x1p60 && power_of_two(ls.min_scale) &&
                  ls.min_scale <= ls.init_scale,
              "{}: loss_scaler.init_scale ({}) and min_scale ({}) must be powers of two, min_scale <= init_scale "
              "<= 2^60", blame.source("loss_scaler.init_scale"), ls.init_scale, ls.min_scale);
  ANVIL_CHECK(ls.growth_interval > 0 && ls.hysteresis > 0, "{}: loss_scaler.growth_interval ({}) and hysteresis ({}) "
              "must be positive", blame.source("loss_scaler.growth_interval"), ls.growth_interval, ls.hysteresis);
  ANVIL_CHECK(c.dist_timeout > 0, "{}: dist_timeout must be a positive number of seconds, got {}",
              blame.source("dist_timeout"), c.dist_timeout);
  ANVIL_CHECK(c.distributed.zero_stage >= 0 && c.distributed.zero_stage <= 3,
              "{}: distributed.zero_stage {} is not valid: expected 0, 1, 2 or 3",
              blame.source("distributed.zero_stage"), c.distributed.zero_stage);
  const bool compressed = c.distributed.grad_compression != GradCompression::kNone;
  ANVIL_CHECK(!compressed || c.distributed.zero_stage == 0,
              "{}: distributed.grad_compression bf16 needs distributed.zero_stage 0 (stages 1-3 reduce-scatter in "
              "fp32)", blame.source("distributed.grad_compression"));
  ANVIL_CHECK(!compressed || !c.deterministic_mode,
              "{}: distributed.grad_compression bf16 rounds gradients on the wire, so it needs deterministic_mode: false",
              blame.source("distributed.grad_compression"));
  ANVIL_CHECK(!compressed || c.kernels != KernelImpl::kGpu,
              "{}: distributed.grad_compression bf16 works on host memory: use it with kernels=cpu",
              blame.source("distributed.grad_compression"));
}

}  // namespace

TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides,
                              std::set<std::string>* keys_read) {
  std::map<std::string, std::string> origins;  // dotted keys set by the command line or a ds_config
  std::set<std::string> variables;
  YAML::Node root = load_config_yaml(path, overrides, origins, variables);
  // Every unknown key is reported at once, with the error that stopped the reading if one did.
  UnknownKeys unknown;
  TrainConfig c;
  std::string pretrained_weights;  // hf_causal_lm's transformers directory, when pretrained
  bool global_given = false;
  try {
    c.config_notes = apply_deepspeed_config(root, path, origins, &unknown);

    MapReader top(root, "", path, keys_read, &unknown, &origins);
    for (const std::string& v : variables) top.raw(v);
    // Foundry's fine-tuning YAMLs keep the dataset settings their loaders merge in (`<<: *hf_dataset`)
    // under a top-level `dataset` anchor; the key itself configures nothing.
    top.raw("dataset");
    top.get("run_dir", c.run_dir);
    top.get("run_name", c.run_name);
    top.get("seed", c.seed);
    top.get("max_seq_len", c.max_seq_len);
    {
      MapReader m = top.sub("model");
      if (m.has("name") && m.raw("name").IsScalar() && m.raw("name").Scalar() == "hf_causal_lm") {
        HfCausalLm hf = read_hf_causal_lm(m, path);
        c.model = hf.model;
        pretrained_weights = hf.weights_dir;
      } else {
        read_model_section(m, c.model);
      }
    }
    {
      MapReader t = top.sub("tokenizer");
      t.get("name", c.tokenizer_name);
      c.tokenizer_name = tokenizer_name_as_kept(c.tokenizer_name);
      MapReader kw = t.sub("kwargs");
      check_repeated_max_seq_len(kw, "model_max_length", c.max_seq_len, path);
      kw.finish();
      t.finish();
    }
    ANVIL_CHECK(top.has("train_loader"), "{}: train_loader is required (its dataset.local names the data)", path);
    read_loader(top.sub("train_loader"), c.train_loader, "train", c.max_seq_len, c.tokenizer_name, path);
    if (top.has("eval_loader")) {
      read_loader(top.sub("eval_loader"), c.eval_loader, "val", c.max_seq_len, c.tokenizer_name, path);
      c.has_eval = true;
    }
    read_optimizer(top, c.optimizer, path);
    {
      MapReader s = top.sub("scheduler");
      read_scheduler(s, c.scheduler, path);
      s.finish();
    }
    read_gradient_clipping(top, c, path);
    ANVIL_CHECK(top.has("max_duration"), "{}: max_duration is required (e.g. 1000ba or 1ep)", path);
    top.get_duration("max_duration", c.max_duration);
    top.get_duration("eval_interval", c.eval_interval);
    top.get("eval_first", c.eval_first);
    top.get("eval_subset_num_batches", c.eval_subset_num_batches);
    global_given = top.has("global_train_batch_size");
    top.get("global_train_batch_size", c.global_train_batch_size);
    top.get("gradient_accumulation_steps", c.gradient_accumulation_steps);
    if (top.has("device_train_microbatch_size")) {
      YAML::Node m = top.raw("device_train_microbatch_size");
      c.microbatch_auto = m.IsScalar() && m.Scalar() == "auto";
      if (!c.microbatch_auto) top.get("device_train_microbatch_size", c.device_train_microbatch_size);
    }
    top.get("device_eval_batch_size", c.device_eval_batch_size);
    top.get_bytes("memory_limit", c.memory_limit);
    top.get("activation_checkpointing", c.activation_checkpointing);
    top.get("precision", c.precision);
    read_loss_scaler(top, c.loss_scaler);
    top.get_duration("console_log_interval", c.console_log_interval);
    top.get("progress_bar", c.progress_bar);
    bool to_console = true;
    top.get("log_to_console", to_console);
    ANVIL_CHECK(to_console, "{}: log_to_console: false is not supported (anvil logs to the console and train.log)", path);
    read_callbacks(top, path);
    read_loggers(top, c, path);
    top.get_duration("save_interval", c.save_interval);
    top.get("save_folder", c.save_folder);
    ANVIL_CHECK(c.save_folder.find("://") == std::string::npos || remote_folder(c.save_folder),
                "{}: save_folder '{}': expected a local directory or s3://bucket/prefix (checkpoints are uploaded to "
                "S3 or S3-compatible storage only)", path, c.save_folder);
    top.get("save_overwrite", c.save_overwrite);
    top.get("save_failure", c.save_failure);
    top.get("save_num_checkpoints_to_keep", c.save_num_checkpoints_to_keep);
    top.get("autoresume", c.autoresume);
    top.get("load_path", c.load_path);
    top.get("load_weights_only", c.load_weights_only);
    // hf_causal_lm's pretrained weights are a weights-only load of its directory, unless load_path
    // names a checkpoint to start from instead (Composer loads load_path over the pretrained model).
    if (!pretrained_weights.empty() && c.load_path.empty()) {
      c.load_path = pretrained_weights;
      c.load_weights_only = true;
    }
    top.get("kernels", c.kernels);
    top.get("dist_timeout", c.dist_timeout);
    top.get("deterministic_mode", c.deterministic_mode);
    read_distributed(top, c, path);
    top.finish();
  } catch (const Error& e) {
    unknown.raise(e.what());
    throw;
  }
  unknown.raise();

  check_values(c, MapReader(root, "", path, nullptr, nullptr, &origins), path, global_given);
  if (c.run_dir.empty())
    c.run_dir = "runs/" + (c.run_name.empty() ? std::filesystem::path(path).stem().string() : c.run_name);
  if (c.run_name.empty()) c.run_name = std::filesystem::path(c.run_dir).filename().string();
  return c;
}

std::string to_yaml(const TrainConfig& c) {
  YAML::Emitter e;
  auto loader = [&](const char* key, const LoaderConfig& l) {
    e << YAML::Key << key << YAML::Value << YAML::BeginMap;
    e << YAML::Key << "name" << YAML::Value << choice_name(l.name);
    e << YAML::Key << "dataset" << YAML::Value << YAML::BeginMap;
    const DatasetConfig& ds = l.dataset;
    e << YAML::Key << "remote" << YAML::Value << ds.remote;
    e << YAML::Key << "local" << YAML::Value << ds.local;
    e << YAML::Key << "split" << YAML::Value << ds.split;
    if (!ds.streams.empty()) {
      e << YAML::Key << "streams" << YAML::Value << YAML::BeginMap;
      for (const StreamConfig& s : ds.streams) {
        e << YAML::Key << s.name << YAML::Value << YAML::BeginMap;
        if (!s.remote.empty()) e << YAML::Key << "remote" << YAML::Value << s.remote;
        if (!s.local.empty()) e << YAML::Key << "local" << YAML::Value << s.local;
        e << YAML::Key << "split" << YAML::Value << s.split;
        e << YAML::Key << "proportion" << YAML::Value << yaml_number(s.proportion);
        e << YAML::EndMap;
      }
      e << YAML::EndMap;
    }
    e << YAML::Key << "shuffle" << YAML::Value << ds.shuffle;
    e << YAML::Key << "shuffle_seed" << YAML::Value << ds.shuffle_seed;
    e << YAML::Key << "shuffle_algo" << YAML::Value << ds.shuffle_algo;
    e << YAML::Key << "shuffle_block_size" << YAML::Value << ds.shuffle_block_size;
    e << YAML::Key << "num_canonical_nodes" << YAML::Value << ds.num_canonical_nodes;
    e << YAML::Key << "epoch_size" << YAML::Value << ds.epoch_size;
    e << YAML::Key << "cache_limit" << YAML::Value << ds.cache_limit;
    e << YAML::Key << "predownload" << YAML::Value << ds.predownload;
    e << YAML::Key << "download_retry" << YAML::Value << ds.download_retry;
    e << YAML::Key << "download_timeout" << YAML::Value << yaml_number(ds.download_timeout);
    e << YAML::Key << "validate_hash" << YAML::Value << ds.validate_hash;
    if (l.name == LoaderKind::kFinetuning) {
      const FinetuningConfig& ft = ds.finetuning;
      if (!ft.hf_name.empty()) {
        e << YAML::Key << "hf_name" << YAML::Value << ft.hf_name;
        e << YAML::Key << "hf_kwargs" << YAML::Value << YAML::BeginMap;
        if (!ft.data_dir.empty()) e << YAML::Key << "data_dir" << YAML::Value << ft.data_dir;
        if (!ft.data_files.empty()) e << YAML::Key << "data_files" << YAML::Value << ft.data_files;
        e << YAML::EndMap;
      }
      e << YAML::Key << "target_prompts" << YAML::Value << target_prompts_name(ft.targets);
      e << YAML::Key << "target_responses" << YAML::Value << target_responses_name(ft.targets);
      e << YAML::Key << "chat_template" << YAML::Value << YAML::BeginMap;
      e << YAML::Key << "name" << YAML::Value << ft.chat_template.name;
      e << YAML::Key << "message" << YAML::Value << ft.chat_template.message;
      e << YAML::Key << "generation_prompt" << YAML::Value << ft.chat_template.generation_prompt;
      e << YAML::EndMap;
      e << YAML::Key << "too_long" << YAML::Value << choice_name(ft.too_long);
      e << YAML::Key << "skip_malformed" << YAML::Value << ft.skip_malformed;
      e << YAML::Key << "packing_ratio" << YAML::Value << yaml_number(ft.packing_ratio);
      e << YAML::Key << "allow_pad_trimming" << YAML::Value << ft.allow_pad_trimming;
    }
    e << YAML::EndMap;
    e << YAML::Key << "drop_last" << YAML::Value << l.drop_last;
    e << YAML::Key << "num_workers" << YAML::Value << l.num_workers;
    e << YAML::EndMap;
  };
  e << YAML::BeginMap;
  e << YAML::Key << "run_dir" << YAML::Value << c.run_dir;
  e << YAML::Key << "run_name" << YAML::Value << c.run_name;
  e << YAML::Key << "seed" << YAML::Value << c.seed;
  e << YAML::Key << "max_seq_len" << YAML::Value << c.max_seq_len;
  e << YAML::Key << "model" << YAML::Value;
  write_model_section(e, c.model);
  e << YAML::Key << "tokenizer" << YAML::Value << YAML::BeginMap << YAML::Key << "name" << YAML::Value
    << c.tokenizer_name << YAML::EndMap;
  loader("train_loader", c.train_loader);
  if (c.has_eval) loader("eval_loader", c.eval_loader);
  e << YAML::Key << "optimizer" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "name" << YAML::Value << choice_name(c.optimizer.name);
  e << YAML::Key << "lr" << YAML::Value << yaml_number(c.optimizer.lr);
  e << YAML::Key << "betas" << YAML::Value << YAML::Flow << YAML::BeginSeq << yaml_number(c.optimizer.beta1)
    << yaml_number(c.optimizer.beta2) << YAML::EndSeq;
  e << YAML::Key << "eps" << YAML::Value << yaml_number(c.optimizer.eps);
  e << YAML::Key << "weight_decay" << YAML::Value << yaml_number(c.optimizer.weight_decay);
  e << YAML::EndMap;
  e << YAML::Key << "scheduler" << YAML::Value << YAML::BeginMap;
  const SchedulerConfig& sc = c.scheduler;
  e << YAML::Key << "name" << YAML::Value << choice_name(sc.name);
  auto key = [&](const char* k, const auto& v) { e << YAML::Key << k << YAML::Value << yaml_value(v); };
  if (!sc.is_deepspeed()) {
    key("t_warmup", sc.t_warmup.text);
    key("t_max", sc.t_max.text);
    key("alpha_f", sc.alpha_f);
  }
  for (const SchedulerParam& p : scheduler_params(sc.name)) {
    switch (p.kind) {
      case SchedulerParam::Kind::kRate: key(p.key, sc.*p.rate); break;
      case SchedulerParam::Kind::kSteps: key(p.key, sc.*p.steps); break;
      case SchedulerParam::Kind::kWarmupType: key(p.key, choice_name(sc.warmup_type)); break;
      case SchedulerParam::Kind::kMomentumOff: key(p.key, false); break;
      case SchedulerParam::Kind::kUnused: break;
    }
  }
  e << YAML::EndMap;
  e << YAML::Key << "algorithms" << YAML::Value << YAML::BeginMap << YAML::Key << "gradient_clipping"
    << YAML::Value << YAML::BeginMap << YAML::Key << "clipping_type" << YAML::Value << "norm" << YAML::Key
    << "clipping_threshold" << YAML::Value << yaml_number(c.clipping_threshold) << YAML::EndMap << YAML::EndMap;
  e << YAML::Key << "max_duration" << YAML::Value << c.max_duration.text;
  e << YAML::Key << "eval_interval" << YAML::Value << c.eval_interval.text;
  e << YAML::Key << "eval_first" << YAML::Value << c.eval_first;
  e << YAML::Key << "loggers" << YAML::Value << YAML::BeginMap;
  if (c.tensorboard)
    e << YAML::Key << "tensorboard" << YAML::Value << YAML::BeginMap << YAML::Key << "log_dir" << YAML::Value
      << c.tensorboard_dir << YAML::EndMap;
  e << YAML::EndMap;
  e << YAML::Key << "eval_subset_num_batches" << YAML::Value << c.eval_subset_num_batches;
  if (c.global_train_batch_size > 0)  // else derived by DeepSpeed's batch rule
    e << YAML::Key << "global_train_batch_size" << YAML::Value << c.global_train_batch_size;
  e << YAML::Key << "gradient_accumulation_steps" << YAML::Value << c.gradient_accumulation_steps;
  if (c.microbatch_auto)
    e << YAML::Key << "device_train_microbatch_size" << YAML::Value << "auto";
  else
    e << YAML::Key << "device_train_microbatch_size" << YAML::Value << c.device_train_microbatch_size;
  e << YAML::Key << "device_eval_batch_size" << YAML::Value << c.device_eval_batch_size;
  e << YAML::Key << "memory_limit" << YAML::Value << c.memory_limit;
  e << YAML::Key << "activation_checkpointing" << YAML::Value << c.activation_checkpointing;
  e << YAML::Key << "precision" << YAML::Value << choice_name(c.precision);
  e << YAML::Key << "loss_scaler" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "init_scale" << YAML::Value << yaml_number(c.loss_scaler.init_scale);
  e << YAML::Key << "growth_interval" << YAML::Value << c.loss_scaler.growth_interval;
  e << YAML::Key << "hysteresis" << YAML::Value << c.loss_scaler.hysteresis;
  e << YAML::Key << "min_scale" << YAML::Value << yaml_number(c.loss_scaler.min_scale);
  e << YAML::Key << "consecutive_hysteresis" << YAML::Value << c.loss_scaler.consecutive_hysteresis;
  e << YAML::EndMap;
  e << YAML::Key << "console_log_interval" << YAML::Value << c.console_log_interval.text;
  e << YAML::Key << "progress_bar" << YAML::Value << c.progress_bar;
  e << YAML::Key << "kernels" << YAML::Value << choice_name(c.kernels);
  e << YAML::Key << "save_interval" << YAML::Value << c.save_interval.text;
  e << YAML::Key << "save_folder" << YAML::Value << c.save_folder;
  e << YAML::Key << "save_overwrite" << YAML::Value << c.save_overwrite;
  e << YAML::Key << "save_failure" << YAML::Value << choice_name(c.save_failure);
  e << YAML::Key << "save_num_checkpoints_to_keep" << YAML::Value << c.save_num_checkpoints_to_keep;
  e << YAML::Key << "autoresume" << YAML::Value << c.autoresume;
  e << YAML::Key << "load_path" << YAML::Value << c.load_path;
  e << YAML::Key << "load_weights_only" << YAML::Value << c.load_weights_only;
  e << YAML::Key << "dist_timeout" << YAML::Value << yaml_number(c.dist_timeout);
  e << YAML::Key << "deterministic_mode" << YAML::Value << c.deterministic_mode;
  e << YAML::Key << "distributed" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "zero_stage" << YAML::Value << c.distributed.zero_stage;
  e << YAML::Key << "all_reduce" << YAML::Value << choice_name(c.distributed.all_reduce);
  e << YAML::Key << "grad_compression" << YAML::Value << choice_name(c.distributed.grad_compression);
  e << YAML::Key << "gpu_collectives" << YAML::Value << choice_name(c.distributed.gpu_collectives);
  e << YAML::EndMap;
  e << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

}  // namespace anvil
