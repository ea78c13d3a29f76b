// The training loop and its run directory.
#include "train/trainer.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "core/progress.h"
#include "core/targets.h"
#include "data/tokenizer.h"
#include "config/families/family.h"
#include "parallel/collectives.h"
#include "parallel/data_parallel.h"
#include "parallel/expert_parallel.h"
#include "parallel/op_collectives.h"
#include "parallel/tensor_parallel.h"
#include "interop/hf_import.h"
#include "kernels/impl.h"
#include "kernels/matmul.h"
#include "model/tensor_parallel.h"
#include "train/checkpoint_writer.h"
#include "train/data_pipeline.h"
#include "train/icl_eval.h"
#include "train/loss_plot.h"
#include "train/microbatch.h"
#include "train/stack.h"
#include "train/step.h"
#include "train/stop_signal.h"
#include "train/tensorboard.h"

namespace anvil {
namespace fs = std::filesystem;
namespace {

// Mean loss per target token over the eval split in dataset order (or its first
// eval_subset_num_batches batches), the same bits whatever the world size. Data-parallel rank r
// of W takes batches r, r + W, ...; under ZeRO-3 a forward pass gathers parameters with every
// rank (and under expert parallelism exchanges rows with its group), so a rank past the last
// batch runs its first batch again and discards it. A pipeline stage's ranks pass each batch
// through the stages; the last stage's losses are every stage's result. comm: the data-parallel
// ranks (TrainStep's batch).
double evaluate(Model& model, DataParallel& dp, Communicator& comm, PipelineSchedule* pipeline,
                const DataPipeline& eval_data, const TrainConfig& cfg, std::vector<int32_t>& tokens,
                std::vector<int32_t>& targets) {
  StreamingDataset& data = *eval_data.data;
  const int T = cfg.max_seq_len, B = cfg.device_eval_batch_size;
  const int W = comm.size(), rank = comm.rank();
  int64_t samples = data.num_samples();
  if (cfg.eval_subset_num_batches > 0) samples = std::min<int64_t>(samples, int64_t{cfg.eval_subset_num_batches} * B);
  const int64_t batches = (samples + B - 1) / B;
  const int64_t rounds = (batches + W - 1) / W;
  int64_t sum = 0, count = 0;
  for (int64_t round = 0; round < rounds; round++) {
    const int64_t batch = round * W + rank;
    const bool real = batch < batches;
    if (!real && dp.zero_stage() < 3 && !model.expert_parallel()) break;
    const int64_t s0 = (real ? batch : rank % batches) * B;
    const int b = static_cast<int>(std::min<int64_t>(B, samples - s0));
    for (int k = 0; k < b; k++)
      load_example(data, s0 + k, T, cfg.model.vocab_size, eval_data.finetuning,
                   tokens.data() + static_cast<size_t>(k) * T, targets.data() + static_cast<size_t>(k) * T);
    const float* losses = nullptr;
    if (pipeline) {
      pipeline->evaluate(tokens.data(), targets.data(), b, T, [&](const float* l, int, double) { losses = l; });
    } else {
      model.forward(tokens.data(), targets.data(), b, T, nullptr);
      losses = model.losses();
    }
    if (!real) continue;
    if (losses) sum += fixed_point_loss_sum(losses, b, T);
    count += std::count_if(targets.begin(), targets.begin() + static_cast<std::ptrdiff_t>(b) * T,
                           [](int32_t x) { return x != kIgnoreIndex; });
  }
  dp.quiesce();
  if (pipeline) pipeline->share_from_last(&sum, sizeof sum);
  return fixed_point_loss_value(sum_exact(comm, sum)) / static_cast<double>(sum_exact(comm, count));
}

// load_path's checkpoint, or a transformers directory's weights as a checkpoint that holds no
// training state (hf_causal_lm's pretrained weights); show_progress on rank 0.
LoadedCheckpoint load_start_point(const std::string& path, bool show_progress) {
  if (!is_hf_model_dir(path)) return load_checkpoint(path, /*with_optimizer=*/true, show_progress);
  HfModel hf = read_hf_model(path, show_progress ? "load weights" : nullptr);
  LoadedCheckpoint c;
  c.dir = path;
  c.config = hf.config;
  c.params = std::move(hf.params);
  c.exp_avg.assign(c.params.size(), 0.0f);
  c.exp_avg_sq.assign(c.params.size(), 0.0f);
  c.data_state = "null";
  return c;
}

// Under autoresume the newest checkpoint of the run that loads cleanly (damaged or incomplete
// ones are reported and skipped), or the one an s3:// save_folder's `latest` names, else
// load_path; nothing: start from the seed. As Composer chooses, the run's own checkpoint wins
// over load_path (a restarted job continues rather than starting again from the weights it began
// with), and load_weights_only then does not apply. *own tells which was chosen.
std::optional<LoadedCheckpoint> choose_resume_checkpoint(const TrainConfig& cfg, bool* own) {
  *own = false;
  if (cfg.autoresume) {
    for (const std::string& dir : list_checkpoints(checkpoints_dir(cfg))) {
      try {
        LoadedCheckpoint c = load_checkpoint(dir, /*with_optimizer=*/true, /*show_progress=*/true);
        *own = true;
        return c;
      } catch (const Error& e) {
        log_warn("autoresume: skipping {}: {}", dir, e.what());
      }
    }
    // None here (a new machine, a wiped run directory): the newest one uploaded to an s3:// save_folder.
    if (const std::string remote = checkpoints_remote(cfg); !remote.empty())
      if (const std::string dir = download_latest_checkpoint(remote, checkpoints_dir(cfg)); !dir.empty()) {
        *own = true;
        return load_checkpoint(dir, /*with_optimizer=*/true, /*show_progress=*/true);
      }
  }
  // Under LoRA load_path is the frozen base (load_frozen_base), not a starting point of the adapters.
  if (!cfg.load_path.empty() && !cfg.model.has_lora())
    return load_start_point(cfg.load_path, /*show_progress=*/true);
  if (cfg.autoresume) log_info("autoresume: no checkpoint in {}; starting from the seed", checkpoints_dir(cfg));
  return std::nullopt;
}

// RUN_DIR/loss.png at the end of a run. A plot that cannot be drawn is reported, never fatal.
void draw_loss_plot(const std::string& run_dir) {
  if (const std::string why = loss_plot_unavailable(); !why.empty()) {
    log_info("loss.png not drawn: {}", why);
    return;
  }
  try {
    plot_loss_curves({read_loss_curve(run_dir)}, run_dir + "/loss.png");
    log_info("loss plot: {}/loss.png", run_dir);
  } catch (const Error& e) {
    log_warn("loss.png not drawn: {}", e.what());
  }
}

std::string broadcast_string(Communicator& comm, std::string s) {
  uint64_t len = s.size();
  broadcast(comm, &len, sizeof len, 0);
  s.resize(len);
  broadcast(comm, s.data(), len, 0);
  return s;
}

// Keeps the rows of metrics.jsonl up to step (rows of steps after the checkpoint belong to the
// interrupted attempt, which the resumed run repeats), atomically.
void truncate_metrics(const std::string& path, int64_t step) {
  const std::string text = read_file(path, "metrics");
  std::string kept;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    nlohmann::json row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (row.is_discarded()) continue;  // a line cut short by the interruption
    if (row.contains("step") && row["step"].is_number_integer() && row["step"].get<int64_t>() > step) continue;
    kept += line + "\n";
  }
  write_file_atomic(path, kept);
}

std::string mib(size_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

// Where training starts: load_path, the newest usable checkpoint of this run (autoresume), or
// none (the seed). Rank 0 chooses, so that every rank loads the same one; it must hold the
// config's model.
std::optional<LoadedCheckpoint> resume_point(const TrainConfig& cfg, Communicator& comm) {
  const bool writer = comm.rank() == 0;
  std::optional<LoadedCheckpoint> resume;
  bool own = false;
  if (writer) resume = choose_resume_checkpoint(cfg, &own);
  const std::string resume_dir = broadcast_string(comm, resume ? resume->dir : "");
  own = broadcast_string(comm, own ? "own" : "") == "own";
  if (!writer && !resume_dir.empty())
    resume = own ? load_checkpoint(resume_dir, /*with_optimizer=*/true) : load_start_point(resume_dir, false);
  if (!resume) return resume;
  // Weights only (load_path with load_weights_only, or a checkpoint without training state such
  // as an import): the model must be the same architecture; how it was initialised, its dropout,
  // and the context length of a model without a position table, may differ.
  const bool weights_only = (cfg.load_weights_only && !own) || resume->data_state == "null";
  const ModelConfig& m = resume->config;
  const ModelConfig& c = cfg.model;
  ANVIL_CHECK(weights_only ? same_architecture(m, c) : m == c, "checkpoint '{}' holds another model than the config "
              "asks for: {} {} of {} layers, {} heads, d_model {}, vocab {}, max_seq_len {}{}; the config: {} {}, {}, "
              "{}, {}, {}, {}", resume->dir,
              family(m.name).title, choice_name(m.name), m.n_layers, m.n_heads, m.d_model, m.vocab_size,
              m.max_seq_len, m.name == c.name ? " (the families' options differ: compare the model sections)" : "",
              family(c.name).title, choice_name(c.name), c.n_layers, c.n_heads, c.d_model, c.vocab_size,
              c.max_seq_len);
  if (weights_only) {  // a fresh optimizer, data order and step count
    resume->step = resume->tokens_seen = resume->optimizer_steps = 0;
    resume->data_state.clear();
    std::fill(resume->exp_avg.begin(), resume->exp_avg.end(), 0.0f);
    std::fill(resume->exp_avg_sq.begin(), resume->exp_avg_sq.end(), 0.0f);
    resume->grad_scales.clear();
    resume->loss_scaler.clear();
  }
  return resume;
}

// Under LoRA: the frozen base into the model, from load_path, or when resuming adapters from
// the base their checkpoint names (which must still hold the weights they were trained on).
// Every rank reads it. Returns what the run's checkpoints record of it.
LoraBaseRef load_frozen_base(const TrainConfig& cfg, const LoadedCheckpoint* resume, Model& model, bool writer) {
  std::error_code ec;
  const std::string path =
      resume ? resume->lora_base.path : fs::absolute(cfg.load_path, ec).lexically_normal().string();
  const std::string what = resume ? fmt::format("LoRA checkpoint '{}'", resume->dir) : std::string("load_path");
  LoraBase base = load_lora_base(path, resume ? resume->lora_base.weights_sha256 : "", what, writer);
  ANVIL_CHECK(same_architecture(base.config, cfg.model.base()), "{}: the base '{}' is another model ({}) than the "
              "config's ({})", what, path, model_architecture_summary(base.config),
              model_architecture_summary(cfg.model));
  if (model.config().expert_share()) {  // the base's weights of the rank's experts alone
    std::vector<float> share(model_num_params(model.config().base()));
    take_share(cfg.model.base(), model.config().base(), base.params.data(), share.data());
    base.params = std::move(share);
  }
  // Under amp_bf16 the products round the base's weights to bf16 anyway: held so, the same bits.
  model.set_base_weights(base.params, cfg.precision == ComputeDtype::kBf16);
  if (writer)
    log_info("LoRA: the frozen base is '{}' (weights sha256 {}); r {}, alpha {:g}, dropout {:g}, adapting {}", path,
             base.sha256, cfg.model.lora.r, cfg.model.lora.alpha, cfg.model.lora.dropout,
             fmt::join(cfg.model.lora.target_modules, ", "));
  return {path, base.sha256};
}

// allow_pad_trimming: where the step's sequences may be cut, after the last position any sequence
// of the global batch trains on, rounded up to a multiple of 8 as LLM Foundry's collator rounds
// (at most T). The same on every rank (a max over ranks), so the step's shape depends on the
// global batch alone, never on how it is cut into ranks and microbatches.
int trimmed_length(Communicator& comm, const std::vector<int32_t>& targets, int batch, int T) {
  int64_t last = 0;
  for (int b = 0; b < batch; b++)
    for (int t = T - 1; t >= 0 && t + 1 > last; t--)
      if (targets[static_cast<size_t>(b) * T + t] != kIgnoreIndex) {
        last = t + 1;
        break;
      }
  const int64_t longest = std::max<int64_t>(1, max_exact(comm, last));
  return static_cast<int>(std::min<int64_t>(T, (longest + 7) / 8 * 8));
}

// Rows of T values become rows of n < T (the first n of each), in place.
void trim_rows(std::vector<int32_t>& v, int rows, int T, int n) {
  for (int r = 1; r < rows; r++)
    std::copy_n(v.begin() + static_cast<std::ptrdiff_t>(r) * T, n, v.begin() + static_cast<std::ptrdiff_t>(r) * n);
}

// What packing did, over `span` (the loader's counts so far).
std::string packing_report(const PackingStats& s, const TrainConfig& cfg, const char* span) {
  std::string r = fmt::format("packing (packing_ratio {}): {} examples in {} sequences over {}, {:.2f} per sequence",
                              cfg.train_loader.dataset.finetuning.packing_ratio, s.examples, s.sequences, span,
                              s.sequences ? static_cast<double>(s.examples) / static_cast<double>(s.sequences) : 0.0);
  if (s.dropped)
    r += fmt::format("; {} examples ({:.1f}%) fitted in no sequence of their step and were not trained on: lower "
                     "packing_ratio", s.dropped,
                     100.0 * static_cast<double>(s.dropped) / static_cast<double>(s.examples + s.dropped));
  return r;
}

// The run directory (rank 0): its resolved config, train.log, and metrics.jsonl, opened for
// writing. An existing run is continued only when resuming (its metrics cut back to the
// checkpoint's step), or replaced with save_overwrite.
FILE* open_run_directory(const TrainConfig& cfg, bool resuming, int64_t start_step) {
  const std::string metrics_path = cfg.run_dir + "/metrics.jsonl";
  const bool earlier_run = fs::exists(metrics_path) || !list_checkpoints(checkpoints_dir(cfg)).empty();
  const bool replace = earlier_run && !resuming && !cfg.autoresume;
  ANVIL_CHECK(!replace || cfg.save_overwrite, "run directory '{}' (checkpoints in {}) already holds a run; continue "
              "it with autoresume=true, replace it with save_overwrite=true, or choose another run_dir (e.g. "
              "run_dir=runs/NAME)", cfg.run_dir, checkpoints_dir(cfg));
  if (replace) {
    // Composer's save_overwrite: the earlier run's checkpoints, metrics, log and event files go.
    for (const std::string& dir : list_checkpoints(checkpoints_dir(cfg))) fs::remove_all(dir);
    for (const char* name : {"/metrics.jsonl", "/train.log", "/tensorboard"})
      fs::remove_all(cfg.run_dir + name);
    fs::remove(checkpoints_dir(cfg) + "/latest");
  }
  make_dirs(cfg.run_dir);
  write_file_atomic(cfg.run_dir + "/config.yaml", to_yaml(cfg));
  log_to_file(cfg.run_dir + "/train.log");
  if (replace) log_info("save_overwrite: replaced the earlier run in {}", cfg.run_dir);
  if (resuming && fs::exists(metrics_path)) truncate_metrics(metrics_path, start_step);
  FILE* metrics = std::fopen(metrics_path.c_str(), resuming ? "a" : "w");
  ANVIL_CHECK(metrics, "cannot create '{}'", metrics_path);
  return metrics;
}

// One training run, in the order run_training calls it: set-up (the data, the run's length, the
// run directory, the model and its data parallelism with the resumed state), a description of
// it in the log, the start (stop handlers, the first evaluation), the steps with their
// evaluations and checkpoints, and the end. Every rank builds one; rank 0 (the writer) writes
// the run directory.
class TrainingRun {
 public:
  TrainingRun(const TrainConfig& config, Communicator& comm);
  void describe();
  void start();
  // Step t + 1 (t from start_step()): false when a stop signal ends the run after it.
  bool step(int64_t t);
  int64_t start_step() const { return start_step_; }
  int64_t total_steps() const { return total_steps_; }
  // After the last step: the final evaluation and checkpoint (only the checkpoint when stopped).
  TrainSummary finish();

 private:
  void open_datasets();
  void build_model();
  void write_metrics(const nlohmann::json& row);
  void evaluate_at(int64_t at_step);
  // LLM Foundry's ICL tasks and gauntlet at an evaluation: their metrics go into row.
  void evaluate_icl_at(int64_t at_step, nlohmann::json& row, std::vector<std::pair<std::string, double>>& scalars);
  void save(int64_t at_step);
  void report_first_batch() const;
  // The step's sequence length: max_seq_len, or shorter where allow_pad_trimming cuts every
  // rank's padding.
  int trim_batch(int64_t t);
  void report_step(int64_t t, const StepResult& r, int step_len, double secs, int64_t epoch);

  TrainConfig cfg_;  // the batch sizes, microbatch and eval batch resolved
  Communicator& comm_;
  // Pipeline parallelism's groups (distributed.pipeline_parallel > 1), else null: then the
  // data-parallel group is the whole job.
  std::unique_ptr<PipelineGroups> groups_;
  // Tensor parallelism's groups (distributed.tensor_parallel > 1; within a stage's ranks under
  // pipeline parallelism), else null.
  std::unique_ptr<TensorGroups> tensor_;
  Communicator& data_comm() { return tensor_ ? *tensor_->data : groups_ ? *groups_->data : comm_; }
  // Expert parallelism's groups (distributed.expert_parallel > 1; within a stage's ranks under
  // pipeline parallelism), else null.
  std::unique_ptr<ExpertGroups> experts_;
  // The ranks holding this rank's parameters, over which data parallelism reduces and shards them:
  // the data-parallel group, or under expert parallelism those of its ranks holding the same experts.
  Communicator& holders_comm() { return experts_ ? *experts_->data : data_comm(); }
  // The group of ranks sharing a copy of the model (tensor or expert parallelism's), else null; and
  // the share configs of its ranks, in their order.
  Communicator* share_comm() {
    return tensor_ ? &tensor_->tensor->comm() : experts_ ? &experts_->experts->comm() : nullptr;
  }
  std::vector<ModelConfig> group_shares() const;
  // A whole-model array (model_param_layout(cfg_.model) order), or its range [from, to), from
  // every rank's part of the same array (its stage's, its share's), each part given as this rank's
  // range [lo, hi) of it (its ZeRO shard); a collective of the job.
  std::vector<float> gather_whole(size_t lo, size_t hi, const std::vector<float>& mine, size_t from = 0,
                                  size_t to = std::numeric_limits<size_t>::max());
  // The reverse: this rank's part of a whole-model array.
  std::vector<float> own_part(const std::vector<float>& whole) const;
  // W_, rank_: of the job; D_, data_rank_: of the data-parallel group, which splits the batch.
  int T_, GB_, W_, rank_, D_, data_rank_, local_batch_;
  bool writer_;
  std::vector<std::string> data_notes_;  // logged once the run directory holds the log
  DataPipeline train_data_, eval_data_;
  // icl_tasks: read with the run's data, tokenized once the eval batch is known.
  std::vector<IclTaskEntry> icl_tasks_;
  std::vector<std::vector<IclExample>> icl_examples_;
  std::optional<GauntletSpec> gauntlet_;
  std::unique_ptr<Tokenizer> icl_tokenizer_;
  std::unique_ptr<IclSuite> icl_;
  std::unique_ptr<TokenLoader> loader_;
  int64_t n_samples_ = 0, batches_per_epoch_ = 0, total_steps_ = 0, eval_every_ = 0, log_every_ = 0, save_every_ = 0;
  std::unique_ptr<LrSchedule> schedule_;
  std::optional<LoadedCheckpoint> resume_;  // until its state is in the model and optimizer
  bool continuing_ = false;                 // resuming a run, not only loading weights
  int64_t start_step_ = 0, start_tokens_ = 0, tokens_seen_ = 0, saved_step_ = 0;
  FILE* metrics_ = nullptr;
  std::optional<TensorBoardWriter> tensorboard_;  // rank 0 writes the global figures
  std::unique_ptr<Model> model_;
  int64_t step_exchange_bytes_ = 0;        // the last step's, sent between ranks, every rank's summed
  LoraBaseRef lora_base_;  // under LoRA, what the checkpoints name as the adapters' base
  std::unique_ptr<DataParallel> dp_;
  std::unique_ptr<PipelineSchedule> pipeline_;
  MicrobatchPlan plan_;
  std::unique_ptr<TrainStep> step_;
  double flops_per_token_ = 0, peak_ = 0;
  std::vector<int32_t> tokens_, targets_, positions_;  // positions: of packed examples
  std::unique_ptr<Progress> bar_;  // drawn by rank 0 only
  std::chrono::steady_clock::time_point run_start_;
  TrainSummary summary_;
  CheckpointWriter checkpoints_;
};

TrainingRun::TrainingRun(const TrainConfig& config, Communicator& comm)
    : cfg_(config), comm_(comm), checkpoints_(comm) {
  prepare_kernel_impl(cfg_.kernels, comm.local_rank());
  W_ = comm.size();
  rank_ = comm.rank();
  writer_ = rank_ == 0;
  comm.set_timeout(cfg_.dist_timeout);
  log_set_rank(rank_, W_);
  if (cfg_.distributed.pipeline_parallel > 1)
    groups_ = std::make_unique<PipelineGroups>(
        make_pipeline_groups(comm, cfg_.model, cfg_.distributed.pipeline_parallel));
  // Under pipeline stages too, the tensor groups are within a stage's ranks.
  if (cfg_.distributed.tensor_parallel > 1)
    tensor_ = std::make_unique<TensorGroups>(
        make_tensor_groups(groups_ ? *groups_->data : comm, cfg_.model, cfg_.distributed.tensor_parallel));
  if (cfg_.distributed.expert_parallel > 1)  // under pipeline stages, groups of a stage's ranks (in lockstep)
    experts_ = std::make_unique<ExpertGroups>(
        make_expert_groups(groups_ ? *groups_->data : comm, cfg_.model, cfg_.distributed.expert_parallel));
  D_ = data_comm().size();
  data_rank_ = data_comm().rank();
  resolve_batch_sizes(cfg_, D_);  // DeepSpeed's rule counts the data-parallel ranks
  T_ = cfg_.max_seq_len;
  GB_ = cfg_.global_train_batch_size;
  ANVIL_CHECK(GB_ % D_ == 0, "global_train_batch_size {} is not divisible by the {} data-parallel ranks: each takes "
              "an equal block of the batch", GB_, D_);
  local_batch_ = GB_ / D_;
  ANVIL_CHECK(!cfg_.model.has_lora() || !cfg_.load_path.empty(), "model.peft_config (LoRA) adapts a pretrained "
              "model: set load_path to it (a transformers directory or an anvil checkpoint), or use model.name: "
              "hf_causal_lm with its pretrained_model_name_or_path");
  open_datasets();

  resume_ = resume_point(cfg_, comm);
  continuing_ = resume_ && !resume_->data_state.empty();  // else weights only, from step 0
  if (continuing_) loader_->restore(DataState::from_json(resume_->data_state, resume_->dir + "/manifest.json"));
  start_step_ = saved_step_ = resume_ ? resume_->step : 0;
  start_tokens_ = tokens_seen_ = resume_ ? resume_->tokens_seen : 0;

  metrics_ = writer_ ? open_run_directory(cfg_, continuing_, start_step_) : nullptr;
  for (const std::string& note : data_notes_) log_info("{}", note);
  if (writer_ && cfg_.tensorboard)
    tensorboard_.emplace(cfg_.tensorboard_dir.empty() ? cfg_.run_dir + "/tensorboard" : cfg_.tensorboard_dir);
  build_model();
}

void TrainingRun::open_datasets() {
  const TokenizerFiles tokenizer = resolve_tokenizer(cfg_.tokenizer_name);
  train_data_ = open_data(cfg_.train_loader, T_, cfg_.tokenizer_name,
                                   cfg_.run_dir + "/finetuning_data/train", comm_, data_notes_);
  check_data_tokenizer(*train_data_.data, tokenizer, cfg_.model.vocab_size);
  LoaderOptions lopt;
  lopt.global_batch = GB_;
  lopt.rank = data_rank_;
  lopt.world = D_;
  lopt.seq_len = T_;
  lopt.num_workers = cfg_.train_loader.num_workers;
  lopt.predownload = cfg_.train_loader.dataset.predownload;
  lopt.vocab_size = cfg_.model.vocab_size;
  lopt.finetuning = train_data_.finetuning;
  lopt.packing_ratio = cfg_.train_loader.dataset.finetuning.packing_ratio;
  loader_ = std::make_unique<TokenLoader>(*train_data_.data, train_data_.order, lopt);
  n_samples_ = epoch_samples(train_data_.order);
  batches_per_epoch_ = loader_->steps_per_epoch();
  if (cfg_.has_eval) {
    eval_data_ = open_data(cfg_.eval_loader, T_, cfg_.tokenizer_name, cfg_.run_dir + "/finetuning_data/eval",
                                    comm_, data_notes_);
    check_data_tokenizer(*eval_data_.data, tokenizer, cfg_.model.vocab_size);
  }
  if (!cfg_.icl_tasks.empty()) {
    icl_tasks_ = read_icl_tasks_setting(cfg_.icl_tasks, "icl_tasks");
    icl_examples_ = read_icl_task_examples(icl_tasks_);
    ANVIL_CHECK(cfg_.icl_seq_len <= T_, "icl_seq_len {} is longer than max_seq_len {}, the longest sequence the "
                "model's buffers hold", cfg_.icl_seq_len, T_);
  }
  ANVIL_CHECK(!icl_tasks_.empty() || (cfg_.icl_seq_len == 0 && cfg_.icl_subset_num_batches == -1),
              "icl_seq_len and icl_subset_num_batches shape the icl_tasks: give icl_tasks too");
  if (!cfg_.eval_gauntlet.empty()) {
    ANVIL_CHECK(!icl_tasks_.empty(), "eval_gauntlet scores the icl_tasks: give icl_tasks too");
    gauntlet_ = read_gauntlet_setting(cfg_.eval_gauntlet, "eval_gauntlet");
  }
  auto batches = [&](const Duration& d, int64_t whole, const char* key) {
    return duration_to_batches(d, batches_per_epoch_, GB_, T_, whole, key);
  };
  total_steps_ = batches(cfg_.max_duration, -1, "max_duration");
  ANVIL_CHECK(total_steps_ > 0, "max_duration '{}' is less than one batch of {} samples", cfg_.max_duration.text, GB_);
  eval_every_ = batches(cfg_.eval_interval, total_steps_, "eval_interval");
  log_every_ = static_cast<int64_t>(cfg_.console_log_interval.value);
  save_every_ = batches(cfg_.save_interval, total_steps_, "save_interval");
  schedule_ = std::make_unique<LrSchedule>(cfg_.scheduler, batches(cfg_.scheduler.t_warmup, total_steps_, "scheduler.t_warmup"),
                                           batches(cfg_.scheduler.t_max, total_steps_, "scheduler.t_max"), total_steps_);
}

void TrainingRun::build_model() {
  TrainingStack stack = build_training_stack(cfg_, holders_comm(), local_batch_, T_, [&](Model& model) {
    lora_base_ = load_frozen_base(cfg_, resume_ ? &*resume_ : nullptr, model, writer_);
  }, groups_.get(), tensor_.get(), experts_.get());
  model_ = std::move(stack.model);
  dp_ = std::move(stack.dp);
  pipeline_ = std::move(stack.pipeline);
  plan_ = stack.plan;
  Model& model = *model_;
  if (experts_) {
    const ModelConfig& share = model.config();
    log_info("expert parallelism: {} ranks share the experts, {} each (this rank holds and runs experts {}..{}; its "
             "parameters, gradients and optimizer states are shared with the {} ranks holding the same experts)",
             experts_->ranks, share.held_experts(), share.first_expert(),
             share.first_expert() + share.held_experts() - 1, holders_comm().size());
  }
  if (tensor_) {
    const ModelConfig& share = model.config();
    const int r = tensor_->rank, q = share.n_heads, kv = share.kv_heads(), h = share.mlp_width();
    log_info("tensor parallelism: {} ranks share each of {} copies of the model; this rank holds query heads {}..{}, "
             "key/value heads {}..{} and MLP units {}..{} of every block, token ids {}..{} of the embeddings and "
             "the LM head, and 1/{} of each microbatch's rows of the residual stream", tensor_->ranks, D_, r * q,
             (r + 1) * q - 1, r * kv, (r + 1) * kv - 1, r * h,
             (r + 1) * h - 1, share.vocab_first, share.vocab_first + share.vocab_size - 1, tensor_->ranks);
  }
  std::string loss_scaler;
  const std::string loaded_dir = resume_ ? resume_->dir : "";
  if (resume_) {
    const LoadedCheckpoint& r = *resume_;
    dp_->load_full_state(own_part(r.params), own_part(r.exp_avg), own_part(r.exp_avg_sq), r.optimizer_steps);
    if (cfg_.deterministic_mode && !r.grad_scales.empty())
      dp_->set_grad_scales(groups_ ? stage_tensor_part(model, r.grad_scales) : r.grad_scales);
    else if (cfg_.deterministic_mode && continuing_)
      log_info("the checkpoint has no fixed-point gradient scales (saved without deterministic_mode); starting them "
               "afresh");
    loss_scaler = r.loss_scaler;
    if (continuing_)
      log_info("resumed from {} (step {}, {} tokens)", r.dir, r.step, r.tokens_seen);
    else
      log_info("loaded the weights of {} (weights only: a fresh optimizer and data order, from step 0)", r.dir);
    resume_.reset();  // the state now lives in the model and optimizer
  } else {
    dp_->init_weights(cfg_.seed);
  }
  if (!icl_tasks_.empty()) {
    icl_tokenizer_ = load_tokenizer(resolve_tokenizer(cfg_.tokenizer_name));
    IclSuiteOptions so;
    so.batch = cfg_.device_eval_batch_size;
    so.max_seq_len = cfg_.icl_seq_len > 0 ? cfg_.icl_seq_len : T_;
    so.longest = T_;
    so.subset_batches = std::max(cfg_.icl_subset_num_batches, 0);
    icl_ = std::make_unique<IclSuite>(icl_tasks_, icl_examples_, *icl_tokenizer_, cfg_.model.vocab_size, so);
    icl_examples_.clear();
  }
  step_ = std::make_unique<TrainStep>(cfg_, model, *dp_, data_comm(), *schedule_, pipeline_.get());
  if (step_->loss_scaler().enabled() && !loss_scaler.empty())
    step_->loss_scaler().restore(loss_scaler, loaded_dir + "/manifest.json");
  flops_per_token_ = model_train_flops_per_token(cfg_.model, T_);
  // The job's peak: every rank's measured GEMM rate, for MFU over the global tokens/s.
  peak_ = sum_in_rank_order(comm_, matmul_peak_gflops(cfg_.kernels, cfg_.precision));
  tokens_.resize(static_cast<size_t>(std::max(local_batch_, model.max_batch())) * T_);
  targets_.resize(tokens_.size());
  positions_.resize(loader_->packing() ? tokens_.size() : 0);
}

void TrainingRun::describe() {
  const Model& model = *model_;
  const DistributedConfig& dc = cfg_.distributed;
  log_info("anvil train: run '{}' in {}", cfg_.run_name, cfg_.run_dir);
  for (const std::string& note : cfg_.config_notes) log_info("{}", note);
  log_info("model: {}; {:.2f}M parameters", model_architecture_summary(cfg_.model), model_num_params(cfg_.model) / 1e6);
  log_info("data: {} train samples of {} tokens ({} batches/epoch of {}, {} per rank, microbatch {}{}); {} steps",
           n_samples_, T_, batches_per_epoch_, GB_, local_batch_,
           cfg_.device_train_microbatch_size,
           cfg_.microbatch_auto ? fmt::format(", chosen by auto for a limit of {}", mib(plan_.limit)) : "",
           total_steps_);
  log_info("kernels: {}, {}; measured peak {:.0f} GFLOP/s{}", choice_name(cfg_.kernels),
           matmul_backend_description(cfg_.kernels), peak_, W_ > 1 ? fmt::format(" over {} ranks", W_) : "");
  if (W_ > 1) {
    const LaunchInfo li = detect_launch();
    log_info("distributed: {} ranks ({} on this host) via {}{}; ZeRO stage {}, all-reduce {}{}, collectives {}, "
             "timeout {:.0f} s", W_, comm_.local_size(), comm_.backend(),
             li.launcher.empty() ? "" : ", launched by " + li.launcher, dc.zero_stage, choice_name(dc.all_reduce),
             dc.grad_compression == GradCompression::kBf16 ? ", bf16 gradient compression" : "",
             dp_->collectives_description(), cfg_.dist_timeout);
  }
  if (groups_) {
    const int P = groups_->stages, M = (local_batch_ + cfg_.device_train_microbatch_size - 1) /
                                       cfg_.device_train_microbatch_size;
    log_info("pipeline: {} stages of {} data-parallel rank(s), {} microbatches a step in the 1F1B order (bubble "
             "{:.0f}%); this rank: stage {}, blocks {}-{}{}{}, holding up to {} microbatch(es) at once", P, D_, M,
             100.0 * pipeline_bubble(P, M), groups_->stage, groups_->blocks.first_layer,
             groups_->blocks.end_layer - 1, groups_->first() ? ", the embeddings" : "",
             groups_->last() ? ", the final norm and LM head" : "", pipeline_->slots());
  }
  if (W_ == 1 && cfg_.kernels == KernelImpl::kGpu && dc.gpu_collectives == GpuCollectivesChoice::kNccl)
    log_info("collectives: {} (one rank)", dp_->collectives_description());
  // Params, grads (fixed point in deterministic mode) and two moments of the whole model, all on
  // one rank.
  const MemoryReport mem = dp_->memory();
  const size_t unsharded =
      model_num_params(cfg_.model) * (3 * sizeof(float) + (cfg_.deterministic_mode ? sizeof(int64_t) : sizeof(float)));
  const size_t activations = pipeline_ ? pipeline_->activation_bytes() : model.activation_bytes();
  log_info("memory per rank: model states {} (params {}, grads {}, optimizer {}) = {:.1f}% of unsharded{}; working "
           "buffers {}; activations {}{}", mib(mem.model_states()), mib(mem.params), mib(mem.grads),
           mib(mem.optimizer), 100.0 * static_cast<double>(mem.model_states()) / static_cast<double>(unsharded),
           model.base_bytes() ? fmt::format("; LoRA's frozen base {}", mib(model.base_bytes())) : "",
           mib(mem.working), mib(activations),
           cfg_.activation_checkpointing ? " (activation checkpointing: one block's, recomputed)" : "");
  nlohmann::json stages = nlohmann::json::array();
  if (groups_) {
    // Each stage's ranks hold its own part: the largest rank's memory of each stage.
    dp_->quiesce();
    const std::vector<double> all =
        all_gather_values(comm_, static_cast<double>(mem.model_states() + mem.working + activations));
    std::string text;
    const int per_stage = W_ / groups_->stages;  // its data-parallel ranks, or copies' shares
    for (int st = 0; st < groups_->stages; st++) {
      const double most = *std::max_element(all.begin() + st * per_stage, all.begin() + (st + 1) * per_stage);
      stages.push_back(most);
      text += fmt::format("{}stage {} {}", st ? ", " : "", st, mib(static_cast<size_t>(most)));
    }
    log_info("memory per rank by stage (model states, working buffers and activations): {}", text);
  }
  write_metrics({{"memory_per_rank", {{"params", mem.params}, {"grads", mem.grads}, {"optimizer", mem.optimizer},
                                      {"frozen_base", model.base_bytes()},
                                      {"working", mem.working}, {"activations", activations},
                                      {"microbatch", cfg_.device_train_microbatch_size}, {"memory_limit", plan_.limit},
                                      {"unsharded_model_states", unsharded}, {"zero_stage", dc.zero_stage},
                                      {"world_size", W_},
                                      {"pipeline_parallel", cfg_.distributed.pipeline_parallel},
                                      {"tensor_parallel", cfg_.distributed.tensor_parallel},
                                      {"expert_parallel", cfg_.distributed.expert_parallel},
                                      {"by_stage", stages}}}});
}

void TrainingRun::start() {
  install_stop_handlers();
  if (cfg_.eval_first && start_step_ == 0) evaluate_at(0);
  bar_ = std::make_unique<Progress>("train", total_steps_ - start_step_, "steps", cfg_.progress_bar);
  run_start_ = std::chrono::steady_clock::now();
}

void TrainingRun::write_metrics(const nlohmann::json& row) {
  if (!metrics_) return;
  std::fprintf(metrics_, "%s\n", row.dump().c_str());
  std::fflush(metrics_);
}

void TrainingRun::evaluate_at(int64_t at_step) {
  if (!eval_data_.data && !icl_) return;
  nlohmann::json row = {{"step", at_step}};
  std::vector<std::pair<std::string, double>> scalars;
  if (eval_data_.data) {
    auto t0 = std::chrono::steady_clock::now();
    const double loss = evaluate(*model_, *dp_, data_comm(), pipeline_.get(), eval_data_, cfg_, tokens_, targets_);
    if (at_step == 0) summary_.first_eval_loss = loss;
    summary_.last_eval_loss = loss;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    log_info("step {}/{}: eval loss {:.4f} (perplexity {:.1f}, {:.1f}s)", at_step, total_steps_, loss, std::exp(loss),
             secs);
    row["eval_loss"] = loss;
    scalars.emplace_back("loss/eval", loss);
  }
  if (icl_) evaluate_icl_at(at_step, row, scalars);
  write_metrics(row);
  if (tensorboard_) tensorboard_->scalars(at_step, scalars);
}

// Each rank scores its share of every evaluator's questions (icl_eval.h: IclShare) and the right
// answers are summed exactly: the same accuracies for any world size. Logged under Composer's and
// Foundry's names: metrics/<label>/<N>-shot[/<category>]/<metric> and
// icl/metrics/eval_gauntlet/<category or average>.
void TrainingRun::evaluate_icl_at(int64_t at_step, nlohmann::json& row,
                                  std::vector<std::pair<std::string, double>>& scalars) {
  const auto t0 = std::chrono::steady_clock::now();
  const IclShare share{rank_, W_, dp_->zero_stage() == 3 || model_->expert_parallel()};
  // A pipeline stage or a tensor-parallel share cannot score questions alone: every rank gathers
  // the whole model's parameters for the evaluation (the memory of one process's weights and
  // eval activations, freed after it), and the ranks share the questions as data-parallel ranks
  // do.
  std::unique_ptr<Model> whole;
  if (groups_ || tensor_) {
    dp_->quiesce();
    ModelStorage storage = model_storage_for(cfg_);
    storage.stage = {};
    storage.params = true;
    storage.grads = false;
    whole = make_model(cfg_.model, model_->max_batch(), T_, storage);
    whole->set_compute_dtype(cfg_.precision);
    size_t lo = 0, hi = 0;
    std::vector<float> params;
    dp_->copy_shard(lo, hi, params);
    const std::vector<float> w = gather_whole(lo, hi, params);
    std::copy(w.begin(), w.end(), whole->params());
  }
  Model& scorer = whole ? *whole : *model_;
  std::unique_ptr<Progress> bar;
  if (writer_) bar = std::make_unique<Progress>("icl eval", icl_->questions(share), "questions", cfg_.progress_bar);
  std::vector<int64_t> right = icl_->right_answers(scorer, share, scorer.max_batch(), bar.get());
  whole.reset();
  dp_->quiesce();
  for (int64_t& r : right) r = sum_exact(comm_, r);
  if (bar) bar->finish("");
  const std::vector<IclScore> scores = icl_->scores(right);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const IclScore& s : scores) {
    log_info("step {}/{}: icl {} {:.4f} ({} questions{})", at_step, total_steps_, s.task, s.accuracy, s.questions,
             s.mean_of_categories ? ", the mean of its categories" : "");
    if (s.mean_of_categories) continue;  // Foundry logs the categories' evaluators alone
    const std::string key = fmt::format("metrics/{}/{}", s.task, s.metric);
    row[key] = s.accuracy;
    scalars.emplace_back(key, s.accuracy);
  }
  if (gauntlet_) {
    const Gauntlet g = eval_gauntlet(*gauntlet_, scores);
    for (const std::string& d : g.dropped) log_info("step {}/{}: eval gauntlet: left out category {}", at_step,
                                                    total_steps_, d);
    for (const auto* list : {&g.categories, &g.averages})
      for (const GauntletScore& s : *list) {
        log_info("step {}/{}: eval gauntlet {} {:.4f}", at_step, total_steps_, s.name, s.score);
        const std::string key = "icl/metrics/eval_gauntlet/" + s.name;
        row[key] = s.score;
        scalars.emplace_back(key, s.score);
      }
  }
  log_info("step {}/{}: icl evaluation took {:.1f}s", at_step, total_steps_, secs);
}

std::vector<float> TrainingRun::own_part(const std::vector<float>& whole) const {
  std::vector<float> share;
  const bool shared = tensor_ || experts_;
  if (shared) {
    share.resize(model_num_params(model_->config()));
    take_share(cfg_.model, model_->config(), whole.data(), share.data());
  }
  const std::vector<float>& mine = shared ? share : whole;
  return groups_ ? stage_part(*model_, mine) : mine;
}

std::vector<ModelConfig> TrainingRun::group_shares() const {
  std::vector<ModelConfig> shares;
  if (tensor_)
    for (int r = 0; r < tensor_->ranks; r++) shares.push_back(tensor_share_config(cfg_.model, tensor_->ranks, r));
  if (experts_)
    for (int r = 0; r < experts_->ranks; r++) shares.push_back(expert_share_config(cfg_.model, experts_->ranks, r));
  return shares;
}

std::vector<float> TrainingRun::gather_whole(size_t lo, size_t hi, const std::vector<float>& mine, size_t from,
                                             size_t to) {
  // The data-parallel ranks' ranges follow one another in rank order: the rank's whole part.
  Communicator& data = holders_comm();
  std::vector<size_t> counts;
  for (double n : all_gather_values(data, static_cast<double>(hi - lo))) counts.push_back(static_cast<size_t>(n));
  std::vector<float> part(model_->num_params());
  std::copy(mine.begin(), mine.end(), part.begin() + static_cast<std::ptrdiff_t>(lo));
  all_gather(data, part.data(), counts);
  if (groups_) {  // the stages' parts, into the whole model (or share)
    std::vector<float> stages(model_num_params(model_->config()));
    gather_whole_params(*groups_, *model_, part.data(), stages.data());
    part = std::move(stages);
  }
  to = std::min(to, model_num_params(cfg_.model));
  Communicator* shares = share_comm();
  if (!shares && from == 0 && to == part.size()) return part;
  if (!shares) return std::vector<float>(part.begin() + static_cast<std::ptrdiff_t>(from),
                                         part.begin() + static_cast<std::ptrdiff_t>(to));
  std::vector<float> range(to - from);
  gather_shares(*shares, cfg_.model, group_shares(), part.data(), from, to, range.data());
  return range;
}

void TrainingRun::save(int64_t at_step) {
  CheckpointShard shard;
  shard.rank = rank_;
  shard.world = W_;
  dp_->copy_shard(shard.lo, shard.hi, shard.params, &shard.exp_avg, &shard.exp_avg_sq);  // what training waits for
  std::vector<int> grad_scales = dp_->grad_scales();
  if (tensor_ || experts_) {
    // The whole model's state, of which this rank gathers and writes the rank-th of W even ranges.
    // The shares' scales are the whole tensors' (parallel/gradient_reduction.h).
    const size_t n = model_num_params(cfg_.model), lo = n * rank_ / W_, hi = n * (rank_ + 1) / W_;
    for (std::vector<float>* v : {&shard.params, &shard.exp_avg, &shard.exp_avg_sq})
      *v = gather_whole(shard.lo, shard.hi, *v, lo, hi);
    shard.lo = lo;
    shard.hi = hi;
  } else if (groups_) {
    // The stage's shard as a range of the whole model's array (a tied head's copy of the
    // embeddings left to the first stage).
    const StageSpan span = stage_span(*model_);
    const size_t lo = std::max(shard.lo, span.first), hi = std::max(shard.hi, lo);
    for (std::vector<float>* v : {&shard.params, &shard.exp_avg, &shard.exp_avg_sq})
      v->erase(v->begin(), v->begin() + static_cast<std::ptrdiff_t>(std::min(lo - shard.lo, v->size())));
    shard.lo = span.whole_first + (lo - span.first);
    shard.hi = span.whole_first + (hi - span.first);
  }
  if (groups_ && !grad_scales.empty()) grad_scales = whole_tensor_values(*groups_, *model_, grad_scales);
  checkpoints_.save(checkpoints_dir(cfg_), cfg_, std::move(shard),
                     {at_step, tokens_seen_, dp_->optimizer_steps(), grad_scales, loader_->state().to_json(),
                      step_->loss_scaler().enabled() ? step_->loss_scaler().to_json() : "", lora_base_},
                     cfg_.save_num_checkpoints_to_keep);
  saved_step_ = at_step;
}

void TrainingRun::report_first_batch() const {
  const int64_t n = int64_t{local_batch_} * T_;
  const int64_t ignored = std::count(targets_.begin(), targets_.begin() + n, kIgnoreIndex);
  if (train_data_.finetuning) {
    log_info("the first batch: {:.0f}% of its positions carry loss (the rest are prompts, or padding to max_seq_len "
             "{})", 100.0 - 100.0 * static_cast<double>(ignored) / static_cast<double>(n), T_);
    if (loader_->packing()) log_info("{}", packing_report(loader_->packing_stats(), cfg_, "the first step"));
  } else if (ignored > local_batch_) {
    log_info("the first batch's samples are shorter than max_seq_len {}: {:.0f}% of its positions are padding, which "
             "carries no loss; prepare the data with --max-seq-len {} to fill them", T_,
             100.0 * static_cast<double>(ignored) / static_cast<double>(n), T_);
  }
}

int TrainingRun::trim_batch(int64_t t) {
  if (!cfg_.train_loader.dataset.finetuning.allow_pad_trimming) return T_;
  const int len = trimmed_length(comm_, targets_, local_batch_, T_);
  if (len < T_) {
    trim_rows(tokens_, local_batch_, T_, len);
    trim_rows(targets_, local_batch_, T_, len);
    if (loader_->packing()) trim_rows(positions_, local_batch_, T_, len);
  }
  if (t == start_step_)
    log_info("allow_pad_trimming: the first step's sequences cut to {} of max_seq_len {} tokens", len, T_);
  return len;
}

bool TrainingRun::step(int64_t t) {
  const int64_t epoch = loader_->state().epoch;
  int32_t* positions = loader_->packing() ? positions_.data() : nullptr;
  loader_->next(tokens_.data(), targets_.data(), nullptr, positions);
  if (t == start_step_ && writer_) report_first_batch();
  const int step_len = trim_batch(t);
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t sent = experts_ ? experts_->experts->bytes_sent() : 0;
  const StepResult r = step_->run(tokens_.data(), targets_.data(), local_batch_, step_len, t, positions);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (experts_) step_exchange_bytes_ = sum_exact(comm_, experts_->experts->bytes_sent() - sent);
  ANVIL_CHECK(r.skipped || std::isfinite(r.loss), "step {}: the loss is {} (diverged); lower optimizer.lr or "
              "enable algorithms.gradient_clipping", t + 1, r.loss);
  if (r.skipped) {
    summary_.skipped_steps++;
    log_info("step {}: fp16 gradients overflowed at loss scale 2^{}; step skipped, the scale is now 2^{}", t + 1,
             std::ilogb(r.loss_scale), std::ilogb(step_->loss_scaler().scale()));
  }
  tokens_seen_ += static_cast<int64_t>(GB_) * step_len;
  report_step(t, r, step_len, secs, epoch);
  if ((t + 1) % eval_every_ == 0 && t + 1 < total_steps_) evaluate_at(t + 1);
  // A stop signal on any rank stops every rank after this step (the largest signal number, so
  // that all agree on which), with this step's checkpoint.
  const int stop = static_cast<int>(max_exact(comm_, stop_requested()));
  if ((t + 1) % save_every_ == 0 || t + 1 == total_steps_ || stop != 0)
    save(t + 1);
  else
    checkpoints_.poll();  // completes a save in flight once every rank has written its shard
  if (stop == 0) return true;
  summary_.stopped_by = stop;
  summary_.steps = t + 1;
  if (writer_) bar_->finish(fmt::format("stopped by {}", signal_name(stop)));
  log_info("{} received: stopped after step {} of {}; continue with autoresume=true", signal_name(stop), t + 1,
           total_steps_);
  return false;
}

void TrainingRun::report_step(int64_t t, const StepResult& r, int step_len, double secs, int64_t epoch) {
  const double tps = static_cast<double>(GB_) * step_len / secs;
  const double gflops = tps * flops_per_token_ / 1e9;
  nlohmann::json row = {{"step", t + 1},       {"epoch", epoch},          {"loss", r.loss},
                        {"lr", r.lr},          {"grad_norm", r.grad_norm}, {"tokens", tokens_seen_},
                        {"tokens_per_s", tps}, {"gflops", gflops},        {"mfu", gflops / peak_},
                        {"step_s", secs},      {"peak_rss_mib", peak_rss_mib()}};
  if (step_->loss_scaler().enabled()) {
    row["loss_scale"] = r.loss_scale;
    row["skipped"] = r.skipped;
  }
  const bool moe = cfg_.model.has_moe();
  const double exchanged_mib = static_cast<double>(step_exchange_bytes_) / (1 << 20);
  if (moe) {
    row["moe_balance_loss"] = r.balance_loss;
    row["moe_skipped_choices"] = r.skipped_choices;
    if (experts_) row["moe_all_to_all_mib"] = exchanged_mib;
  }
  write_metrics(row);
  if (tensorboard_) {
    std::vector<std::pair<std::string, double>> scalars = {
        {"loss/train", r.loss}, {"lr", r.lr}, {"grad_norm", r.grad_norm}, {"throughput/tokens_per_s", tps},
        {"throughput/mfu", gflops / peak_}, {"memory/peak_rss_mib", row["peak_rss_mib"].get<double>()}};
    if (step_->loss_scaler().enabled()) scalars.emplace_back("loss_scale", r.loss_scale);
    if (moe) {
      scalars.emplace_back("loss/train/moe_balance", r.balance_loss);
      scalars.emplace_back("moe/skipped_choices", r.skipped_choices);
      if (experts_) scalars.emplace_back("moe/all_to_all_mib", exchanged_mib);
    }
    tensorboard_->scalars(t + 1, scalars);
  }
  summary_.final_train_loss = r.loss;
  if ((t + 1) % log_every_ == 0)
    log_file_only(fmt::format("step {}/{}: loss {:.4f} lr {:.3e} grad_norm {:.3f} {:.0f} tok/s mfu {:.1f}%", t + 1,
                              total_steps_, r.loss, r.lr, r.grad_norm, tps, 100 * gflops / peak_));
  if (writer_)
    bar_->update(t + 1 - start_step_, fmt::format("loss {:.4f} | lr {:.2e} | {:.0f} tok/s", r.loss, r.lr, tps));
}

TrainSummary TrainingRun::finish() {
  if (summary_.stopped_by == 0) {
    if (writer_) bar_->finish(fmt::format("loss {:.4f}", summary_.final_train_loss));
    const double total_secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start_).count();
    const int64_t trained = total_steps_ - start_step_;
    if (loader_->packing() && writer_) log_info("{}", packing_report(loader_->packing_stats(), cfg_, "the run"));
    const int64_t trained_tokens = tokens_seen_ - start_tokens_;  // fewer than steps × GB × T when trimmed
    log_info("trained {} steps, {} tokens in {} ({:.0f} tokens/s)", trained, trained_tokens,
             format_duration(total_secs), static_cast<double>(trained_tokens) / total_secs);
    evaluate_at(total_steps_);
    summary_.steps = total_steps_;
    if (saved_step_ != total_steps_) save(total_steps_);  // a resumed run that had nothing left to do
  }
  summary_.checkpoint = checkpoints_.finish();
  if (writer_) {
    log_info("checkpoint: {}", summary_.checkpoint);
    std::fclose(metrics_);
    metrics_ = nullptr;
    draw_loss_plot(cfg_.run_dir);
    log_close_file();
  }
  barrier(comm_);  // no rank reports success before the checkpoint is on disk
  return summary_;
}

}  // namespace

TrainSummary run_training(const TrainConfig& config, Communicator& comm) {
  TrainingRun run(config, comm);
  run.describe();
  run.start();
  for (int64_t t = run.start_step(); t < run.total_steps(); t++)
    if (!run.step(t)) break;
  return run.finish();
}

}  // namespace anvil
