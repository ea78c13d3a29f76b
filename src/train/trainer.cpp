// The training loop and its run directory.
#include "train/trainer.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "core/progress.h"
#include "core/targets.h"
#include "dist/collectives.h"
#include "dist/data_parallel.h"
#include "dist/op_collectives.h"
#include "interop/hf_import.h"
#include "kernels/impl.h"
#include "kernels/matmul.h"
#include "train/checkpoint_writer.h"
#include "train/data_pipeline.h"
#include "train/loss_plot.h"
#include "train/microbatch.h"
#include "train/step.h"
#include "train/stop_signal.h"
#include "train/tensorboard.h"

namespace anvil {
namespace fs = std::filesystem;
namespace {

// Mean loss per target token over the eval split in dataset order (or its first
// eval_subset_num_batches batches), the same bits whatever the world size. Rank r takes batches r, r + W, ...; under ZeRO-3 a forward
// pass gathers parameters with every rank, so a rank past the last batch runs its first batch
// again and discards it.
double evaluate(Model& model, DataParallel& dp, const DataPipeline& eval_data, const TrainConfig& cfg,
                std::vector<int32_t>& tokens, std::vector<int32_t>& targets) {
  StreamingDataset& data = *eval_data.data;
  const int T = cfg.max_seq_len, B = cfg.device_eval_batch_size;
  Communicator& comm = dp.comm();
  const int W = comm.size(), rank = comm.rank();
  int64_t samples = data.num_samples();
  if (cfg.eval_subset_num_batches > 0) samples = std::min<int64_t>(samples, int64_t{cfg.eval_subset_num_batches} * B);
  const int64_t batches = (samples + B - 1) / B;
  const int64_t rounds = (batches + W - 1) / W;
  int64_t sum = 0, count = 0;
  for (int64_t round = 0; round < rounds; round++) {
    const int64_t batch = round * W + rank;
    const bool real = batch < batches;
    if (!real && dp.zero_stage() < 3) break;
    const int64_t s0 = (real ? batch : rank % batches) * B;
    const int b = static_cast<int>(std::min<int64_t>(B, samples - s0));
    for (int k = 0; k < b; k++)
      load_example(data, s0 + k, T, cfg.model.vocab_size, eval_data.finetuning,
                   tokens.data() + static_cast<size_t>(k) * T, targets.data() + static_cast<size_t>(k) * T);
    int64_t n = 0;
    model.forward(tokens.data(), targets.data(), b, T, &n);
    if (!real) continue;
    sum += fixed_point_loss_sum(model.losses(), b, T);
    count += n;
  }
  dp.quiesce();
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
              model_family_title(m), choice_name(m.name), m.n_layers, m.n_heads, m.d_model, m.vocab_size,
              m.max_seq_len, m.name == c.name ? " (the families' options differ: compare the model sections)" : "",
              model_family_title(c), choice_name(c.name), c.n_layers, c.n_heads, c.d_model, c.vocab_size,
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

}  // namespace

TrainSummary run_training(const TrainConfig& config, Communicator& comm) {
  TrainConfig cfg = config;  // the batch sizes, microbatch and eval batch are resolved below
  select_kernel_impl(cfg.kernels, comm.local_rank());
  resolve_batch_sizes(cfg, comm.size());
  const int T = cfg.max_seq_len, GB = cfg.global_train_batch_size;
  const int W = comm.size(), rank = comm.rank();
  const bool writer = rank == 0;
  comm.set_timeout(cfg.dist_timeout);
  log_set_rank(rank, W);
  ANVIL_CHECK(GB % W == 0, "global_train_batch_size {} is not divisible by the {} ranks: each rank takes an equal "
              "block of the batch", GB, W);
  const int local_batch = GB / W;
  ANVIL_CHECK(!cfg.model.has_lora() || !cfg.load_path.empty(), "model.peft_config (LoRA) adapts a pretrained model: "
              "set load_path to it (a transformers directory or an anvil checkpoint), or use model.name: "
              "hf_causal_lm with its pretrained_model_name_or_path");

  const TokenizerFiles tokenizer = resolve_tokenizer(cfg.tokenizer_name);
  std::vector<std::string> data_notes;  // logged once the run directory holds the log
  DataPipeline train_data = open_data(cfg.train_loader, T, cfg.tokenizer_name, cfg.run_dir + "/finetuning_data/train",
                                      comm, data_notes);
  check_data_tokenizer(*train_data.data, tokenizer, cfg.model.vocab_size);
  LoaderOptions lopt;
  lopt.global_batch = GB;
  lopt.rank = rank;
  lopt.world = W;
  lopt.seq_len = T;
  lopt.num_workers = cfg.train_loader.num_workers;
  lopt.predownload = cfg.train_loader.dataset.predownload;
  lopt.vocab_size = cfg.model.vocab_size;
  lopt.finetuning = train_data.finetuning;
  lopt.packing_ratio = cfg.train_loader.dataset.finetuning.packing_ratio;
  TokenLoader loader(*train_data.data, train_data.order, lopt);
  const int64_t n_samples = epoch_samples(train_data.order);
  const int64_t batches_per_epoch = loader.steps_per_epoch();
  DataPipeline eval_data;
  if (cfg.has_eval) {
    eval_data = open_data(cfg.eval_loader, T, cfg.tokenizer_name, cfg.run_dir + "/finetuning_data/eval", comm,
                          data_notes);
    check_data_tokenizer(*eval_data.data, tokenizer, cfg.model.vocab_size);
  }
  const int64_t total_steps = duration_to_batches(cfg.max_duration, batches_per_epoch, GB, T, -1, "max_duration");
  ANVIL_CHECK(total_steps > 0, "max_duration '{}' is less than one batch of {} samples", cfg.max_duration.text, GB);
  const int64_t eval_every = duration_to_batches(cfg.eval_interval, batches_per_epoch, GB, T, total_steps, "eval_interval");
  const int64_t log_every = static_cast<int64_t>(cfg.console_log_interval.value);
  const int64_t save_every = duration_to_batches(cfg.save_interval, batches_per_epoch, GB, T, total_steps, "save_interval");
  const LrSchedule schedule(
      cfg.scheduler,
      duration_to_batches(cfg.scheduler.t_warmup, batches_per_epoch, GB, T, total_steps, "scheduler.t_warmup"),
      duration_to_batches(cfg.scheduler.t_max, batches_per_epoch, GB, T, total_steps, "scheduler.t_max"), total_steps);

  std::optional<LoadedCheckpoint> resume = resume_point(cfg, comm);
  const bool continuing = resume && !resume->data_state.empty();  // else weights only, from step 0
  if (continuing) loader.restore(DataState::from_json(resume->data_state, resume->dir + "/manifest.json"));
  const int64_t start_step = resume ? resume->step : 0, start_tokens = resume ? resume->tokens_seen : 0;

  FILE* metrics = writer ? open_run_directory(cfg, continuing, start_step) : nullptr;
  for (const std::string& note : data_notes) log_info("{}", note);
  std::optional<TensorBoardWriter> tensorboard;  // rank 0 writes the global figures
  if (writer && cfg.tensorboard)
    tensorboard.emplace(cfg.tensorboard_dir.empty() ? cfg.run_dir + "/tensorboard" : cfg.tensorboard_dir);
  auto write_metrics = [&](const nlohmann::json& row) {
    if (!metrics) return;
    std::fprintf(metrics, "%s\n", row.dump().c_str());
    std::fflush(metrics);
  };

  const DistributedConfig& dc = cfg.distributed;
  const DataParallelOptions dp_options = data_parallel_options(cfg);
  // Activations are sized once the memory the model states take is known.
  const std::unique_ptr<Model> built = make_model(cfg.model, 1, T, model_storage_for(cfg));
  Model& model = *built;
  LoraBaseRef lora_base;  // under LoRA, what the checkpoints name as the adapters' base
  if (cfg.model.has_lora()) lora_base = load_frozen_base(cfg, resume ? &*resume : nullptr, model, writer);
  DataParallel dp(comm, model, cfg.optimizer, dp_options);
  const MemoryReport mem = dp.memory();
  // Ranks drawing on this rank's memory: the host's, or under kernels=gpu its GPU's.
  const int sharing = kernel_impl() == KernelImpl::kGpu ? dp.gpu_sharing().on_my_gpu : comm.local_size();
  const MicrobatchPlan plan =
      plan_microbatch(cfg, local_batch, mem.model_states() + mem.working + model.base_bytes(), sharing);
  int microbatch = plan.microbatch;
  // Every rank must cut its batch alike (ZeRO-2/3 communicate per microbatch): auto takes the
  // smallest choice of any rank.
  if (cfg.microbatch_auto && W > 1)
    for (double choice : all_gather_values(comm, plan.microbatch))
      microbatch = std::min(microbatch, static_cast<int>(choice));
  const int eval_batch = cfg.device_eval_batch_size > 0 ? cfg.device_eval_batch_size : microbatch;
  cfg.device_train_microbatch_size = microbatch;
  cfg.device_eval_batch_size = eval_batch;
  const int max_batch = std::max(microbatch, eval_batch);
  model.set_max_batch(max_batch);
  std::string resume_loss_scaler, resume_dir_loaded = resume ? resume->dir : "";
  if (resume) {
    dp.load_full_state(resume->params, resume->exp_avg, resume->exp_avg_sq, resume->optimizer_steps);
    if (cfg.deterministic_mode && !resume->grad_scales.empty())
      dp.set_grad_scales(resume->grad_scales);
    else if (cfg.deterministic_mode && continuing)
      log_info("the checkpoint has no fixed-point gradient scales (saved without deterministic_mode); starting them "
               "afresh");
    resume_loss_scaler = resume->loss_scaler;
    if (continuing)
      log_info("resumed from {} (step {}, {} tokens)", resume->dir, resume->step, resume->tokens_seen);
    else
      log_info("loaded the weights of {} (weights only: a fresh optimizer and data order, from step 0)", resume->dir);
    resume.reset();  // the state now lives in the model and optimizer
  } else {
    dp.init_weights(cfg.seed);
  }
  TrainStep step(cfg, model, dp, schedule);
  if (step.loss_scaler().enabled() && !resume_loss_scaler.empty())
    step.loss_scaler().restore(resume_loss_scaler, resume_dir_loaded + "/manifest.json");
  const double flops_per_token = model_train_flops_per_token(cfg.model, T);
  // The job's peak: every rank's measured GEMM rate, for MFU over the global tokens/s.
  const double peak = sum_in_rank_order(comm, matmul_peak_gflops(cfg.precision));

  log_info("anvil train: run '{}' in {}", cfg.run_name, cfg.run_dir);
  for (const std::string& note : cfg.config_notes) log_info("{}", note);
  log_info("model: {}; {:.2f}M parameters", model_architecture_summary(cfg.model), model.num_params() / 1e6);
  log_info("data: {} train samples of {} tokens ({} batches/epoch of {}, {} per rank, microbatch {}{}); {} steps",
           n_samples, T, batches_per_epoch, GB, local_batch, microbatch,
           cfg.microbatch_auto ? fmt::format(", chosen by auto for a limit of {}", mib(plan.limit)) : "", total_steps);
  log_info("kernels: {}, {}; measured peak {:.0f} GFLOP/s{}", choice_name(cfg.kernels), matmul_backend_description(),
           peak,
           W > 1 ? fmt::format(" over {} ranks", W) : "");
  if (W > 1) {
    const LaunchInfo li = detect_launch();
    log_info("distributed: {} ranks ({} on this host) via {}{}; ZeRO stage {}, all-reduce {}{}, collectives {}, "
             "timeout {:.0f} s", W, comm.local_size(), comm.backend(),
             li.launcher.empty() ? "" : ", launched by " + li.launcher, dc.zero_stage, choice_name(dc.all_reduce),
             dc.grad_compression == GradCompression::kBf16 ? ", bf16 gradient compression" : "",
             dp.collectives_description(),
             cfg.dist_timeout);
  }
  if (W == 1 && cfg.kernels == KernelImpl::kGpu && dc.gpu_collectives == GpuCollectivesChoice::kNccl)
    log_info("collectives: {} (one rank)", dp.collectives_description());
  // Params, grads (fixed point in deterministic mode) and two moments, all on one rank.
  const size_t unsharded =
      model.num_params() * (3 * sizeof(float) + (cfg.deterministic_mode ? sizeof(int64_t) : sizeof(float)));
  log_info("memory per rank: model states {} (params {}, grads {}, optimizer {}) = {:.1f}% of unsharded{}; working "
           "buffers {}; activations {}{}", mib(mem.model_states()), mib(mem.params), mib(mem.grads),
           mib(mem.optimizer), 100.0 * static_cast<double>(mem.model_states()) / static_cast<double>(unsharded),
           model.base_bytes() ? fmt::format("; LoRA's frozen base {}", mib(model.base_bytes())) : "",
           mib(mem.working), mib(model.activation_bytes()),
           cfg.activation_checkpointing ? " (activation checkpointing: one block's, recomputed)" : "");
  write_metrics({{"memory_per_rank", {{"params", mem.params}, {"grads", mem.grads}, {"optimizer", mem.optimizer},
                                      {"frozen_base", model.base_bytes()},
                                      {"working", mem.working}, {"activations", model.activation_bytes()},
                                      {"microbatch", microbatch}, {"memory_limit", plan.limit},
                                      {"unsharded_model_states", unsharded}, {"zero_stage", dc.zero_stage},
                                      {"world_size", W}}}});

  std::vector<int32_t> tokens(static_cast<size_t>(std::max(local_batch, max_batch)) * T);
  std::vector<int32_t> targets(tokens.size());
  std::vector<int32_t> positions(loader.packing() ? tokens.size() : 0);  // of packed examples
  TrainSummary summary;
  auto run_eval = [&](int64_t at_step) {
    if (!eval_data.data) return;
    auto t0 = std::chrono::steady_clock::now();
    const double loss = evaluate(model, dp, eval_data, cfg, tokens, targets);
    if (at_step == 0) summary.first_eval_loss = loss;
    summary.last_eval_loss = loss;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    log_info("step {}/{}: eval loss {:.4f} (perplexity {:.1f}, {:.1f}s)", at_step, total_steps, loss, std::exp(loss), secs);
    write_metrics({{"step", at_step}, {"eval_loss", loss}});
    if (tensorboard) tensorboard->scalars(at_step, {{"loss/eval", loss}});
  };

  int64_t tokens_seen = start_tokens;
  CheckpointWriter checkpoints(comm);
  auto save = [&](int64_t at_step) {
    CheckpointShard shard;
    shard.rank = rank;
    shard.world = W;
    dp.copy_shard(shard.lo, shard.hi, shard.params, shard.exp_avg, shard.exp_avg_sq);  // what training waits for
    checkpoints.save(checkpoints_dir(cfg), cfg, std::move(shard),
                     {at_step, tokens_seen, dp.optimizer_steps(), dp.grad_scales(), loader.state().to_json(),
                      step.loss_scaler().enabled() ? step.loss_scaler().to_json() : "", lora_base},
                     cfg.save_num_checkpoints_to_keep);
  };

  install_stop_handlers();
  if (cfg.eval_first && start_step == 0) run_eval(0);
  Progress bar("train", total_steps - start_step, "steps", cfg.progress_bar);  // drawn by rank 0 only
  const auto run_start = std::chrono::steady_clock::now();
  int64_t saved_step = start_step;
  for (int64_t t = start_step; t < total_steps; t++) {
    const int64_t epoch = loader.state().epoch;
    loader.next(tokens.data(), targets.data(), nullptr, loader.packing() ? positions.data() : nullptr);
    if (t == start_step && rank == 0) {
      const int64_t ignored = std::count(targets.begin(), targets.begin() + int64_t{local_batch} * T, kIgnoreIndex);
      if (train_data.finetuning) {
        log_info("the first batch: {:.0f}% of its positions carry loss (the rest are prompts, or padding to "
                 "max_seq_len {})", 100.0 - 100.0 * static_cast<double>(ignored) / (static_cast<double>(local_batch) * T), T);
        if (loader.packing()) log_info("{}", packing_report(loader.packing_stats(), cfg, "the first step"));
      } else if (ignored > local_batch) {
        log_info("the first batch's samples are shorter than max_seq_len {}: {:.0f}% of its positions are padding, "
                 "which carries no loss; prepare the data with --max-seq-len {} to fill them", T,
                 100.0 * static_cast<double>(ignored) / (static_cast<double>(local_batch) * T), T);
      }
    }

    int step_len = T;
    if (cfg.train_loader.dataset.finetuning.allow_pad_trimming) {
      step_len = trimmed_length(comm, targets, local_batch, T);
      if (step_len < T) {
        trim_rows(tokens, local_batch, T, step_len);
        trim_rows(targets, local_batch, T, step_len);
        if (loader.packing()) trim_rows(positions, local_batch, T, step_len);
      }
      if (t == start_step)
        log_info("allow_pad_trimming: the first step's sequences cut to {} of max_seq_len {} tokens", step_len, T);
    }
    const auto t0 = std::chrono::steady_clock::now();
    const StepResult r = step.run(tokens.data(), targets.data(), local_batch, step_len, t,
                                  loader.packing() ? positions.data() : nullptr);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ANVIL_CHECK(r.skipped || std::isfinite(r.loss), "step {}: the loss is {} (diverged); lower optimizer.lr or "
                "enable algorithms.gradient_clipping", t + 1, r.loss);
    if (r.skipped) {
      summary.skipped_steps++;
      log_info("step {}: fp16 gradients overflowed at loss scale 2^{}; step skipped, the scale is now 2^{}", t + 1,
               std::ilogb(r.loss_scale), std::ilogb(step.loss_scaler().scale()));
    }
    tokens_seen += static_cast<int64_t>(GB) * step_len;
    const double tps = static_cast<double>(GB) * step_len / secs;
    const double gflops = tps * flops_per_token / 1e9;
    nlohmann::json row = {{"step", t + 1},       {"epoch", epoch},          {"loss", r.loss},
                          {"lr", r.lr},          {"grad_norm", r.grad_norm}, {"tokens", tokens_seen},
                          {"tokens_per_s", tps}, {"gflops", gflops},        {"mfu", gflops / peak},
                          {"step_s", secs},      {"peak_rss_mib", peak_rss_mib()}};
    if (step.loss_scaler().enabled()) {
      row["loss_scale"] = r.loss_scale;
      row["skipped"] = r.skipped;
    }
    write_metrics(row);
    if (tensorboard) {
      std::vector<std::pair<std::string, double>> scalars = {
          {"loss/train", r.loss}, {"lr", r.lr}, {"grad_norm", r.grad_norm}, {"throughput/tokens_per_s", tps},
          {"throughput/mfu", gflops / peak}, {"memory/peak_rss_mib", row["peak_rss_mib"].get<double>()}};
      if (step.loss_scaler().enabled()) scalars.emplace_back("loss_scale", r.loss_scale);
      tensorboard->scalars(t + 1, scalars);
    }
    summary.final_train_loss = r.loss;
    if ((t + 1) % log_every == 0)
      log_file_only(fmt::format("step {}/{}: loss {:.4f} lr {:.3e} grad_norm {:.3f} {:.0f} tok/s mfu {:.1f}%", t + 1,
                                total_steps, r.loss, r.lr, r.grad_norm, tps, 100 * gflops / peak));
    if (writer) bar.update(t + 1 - start_step, fmt::format("loss {:.4f} | lr {:.2e} | {:.0f} tok/s", r.loss, r.lr, tps));
    if ((t + 1) % eval_every == 0 && t + 1 < total_steps) run_eval(t + 1);
    // A stop signal on any rank stops every rank after this step (the largest signal number, so
    // that all agree on which), with this step's checkpoint.
    const int stop = static_cast<int>(max_exact(comm, stop_requested()));
    if ((t + 1) % save_every == 0 || t + 1 == total_steps || stop != 0) {
      save(t + 1);
      saved_step = t + 1;
    } else {
      checkpoints.poll();  // completes a save in flight once every rank has written its shard
    }
    if (stop != 0) {
      summary.stopped_by = stop;
      summary.steps = t + 1;
      if (writer) bar.finish(fmt::format("stopped by {}", signal_name(stop)));
      log_info("{} received: stopped after step {} of {}; continue with autoresume=true", signal_name(stop), t + 1,
               total_steps);
      break;
    }
  }
  if (summary.stopped_by != 0) {
    summary.checkpoint = checkpoints.finish();
    if (writer) {
      log_info("checkpoint: {}", summary.checkpoint);
      std::fclose(metrics);
      draw_loss_plot(cfg.run_dir);
      log_close_file();
    }
    barrier(comm);
    return summary;
  }
  if (writer) bar.finish(fmt::format("loss {:.4f}", summary.final_train_loss));
  const double total_secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
  const int64_t trained = total_steps - start_step;
  if (loader.packing() && rank == 0) log_info("{}", packing_report(loader.packing_stats(), cfg, "the run"));
  const int64_t trained_tokens = tokens_seen - start_tokens;  // fewer than steps × GB × T when trimmed
  log_info("trained {} steps, {} tokens in {} ({:.0f} tokens/s)", trained, trained_tokens,
           format_duration(total_secs), static_cast<double>(trained_tokens) / total_secs);
  run_eval(total_steps);
  summary.steps = total_steps;
  if (saved_step != total_steps) save(total_steps);  // a resumed run that had nothing left to do
  summary.checkpoint = checkpoints.finish();
  if (writer) {
    log_info("checkpoint: {}", summary.checkpoint);
    std::fclose(metrics);
    metrics = nullptr;
    draw_loss_plot(cfg.run_dir);
    log_close_file();
  }
  barrier(comm);  // no rank reports success before the checkpoint is on disk
  return summary;
}

}  // namespace anvil
