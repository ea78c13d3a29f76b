// The training configuration: one typed struct per concern, read from LLM-Foundry-style YAML
// with dotted key=value overrides, validated in one place (unknown keys are errors at every
// level), and written back out resolved, with every default, into the run directory.
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "config/choices.h"
#include "config/duration.h"
#include "config/finetuning_config.h"
#include "config/model_config.h"
#include "config/scheduler_config.h"

namespace anvil {

struct OptimizerConfig {
  OptimizerKind name = OptimizerKind::kDecoupledAdamW;  // LLM Foundry's default
  double lr = 6e-4;
  double beta1 = 0.9, beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool bias_correction = true;  // false: DeepSpeed's Adam without bias correction (bias_correction: false)
  StateDtype master_weights_dtype = StateDtype::kFp32;
  StateDtype states_dtype = StateDtype::kFp32;
};

struct StreamConfig {
  std::string name;
  std::string remote;  // s3://bucket/prefix, http(s)://..., a path, or "" for local-only data
  std::string local;   // the dataset directory, or the cache directory for a remote
  std::string split;   // defaults to the dataset's split
  double proportion = 1.0;
};

// LLM Foundry's / MosaicML streaming's dataset keys (docs/config.md).
struct DatasetConfig {
  std::string remote, local, split;
  std::vector<StreamConfig> streams;  // `streams:` by name; when empty, one stream of remote/local
  bool shuffle = true;
  uint64_t shuffle_seed = 9176;
  std::string shuffle_algo = "py1e";   // none | py1s | py1e
  int64_t shuffle_block_size = -1;     // -1: max(4,000,000 / num_canonical_nodes, 262,144)
  int64_t num_canonical_nodes = 1;
  int64_t epoch_size = -1;             // samples per epoch; -1: the streams' total
  int64_t cache_limit = -1;            // bytes per stream cache ("10gb" accepted); -1: none
  int64_t predownload = -1;            // samples per rank to download ahead; -1: 8 batches
  int download_retry = 2;
  double download_timeout = 60;        // seconds per download attempt
  bool validate_hash = true;
  FinetuningConfig finetuning;         // name: finetuning
};

struct LoaderConfig {
  LoaderKind name = LoaderKind::kText;
  DatasetConfig dataset;
  bool drop_last = true;
  int num_workers = 0;  // decode threads ahead of training; 0 decodes in the training thread
};

// Data parallelism across the ranks of an MPI job (docs/config.md).
struct DistributedConfig {
  int zero_stage = 0;                    // 0 | 1 | 2 | 3; fsdp_config.sharding_strategy maps onto it
  AllReduceAlgo all_reduce = AllReduceAlgo::kAuto;
  GradCompression grad_compression = GradCompression::kNone;  // bf16: zero_stage 0
  GpuCollectivesChoice gpu_collectives = GpuCollectivesChoice::kAuto;  // kernels=gpu
  OffloadDevice offload_optimizer = OffloadDevice::kNone;  // DeepSpeed's zero_optimization.offload_optimizer
  OffloadDevice offload_param = OffloadDevice::kNone;      // and offload_param
  int pipeline_parallel = 1;  // stages the blocks are cut into; world / it ranks train each stage's part
  int expert_parallel = 1;    // ranks that share a mixture of experts' experts, each running its part
  int tensor_parallel = 1;    // consecutive ranks that share each block (heads and MLP width), one copy of the model
};

// amp_fp16's dynamic loss scale (DeepSpeed's fp16 block, PyTorch's GradScaler): the loss is
// multiplied by the scale, a power of two; a step whose gradients overflow is skipped, and after
// `hysteresis` such steps in a row the scale halves (never below min_scale); after
// growth_interval steps without overflow it doubles. The hysteresis count is restored when the
// scale grows, or with consecutive_hysteresis after every clean step (only consecutive
// overflows then count).
struct LossScalerConfig {
  double init_scale = 65536.0;
  int growth_interval = 2000;
  int hysteresis = 2;
  double min_scale = 1.0;
  bool consecutive_hysteresis = false;
};

struct TrainConfig {
  std::string run_dir;
  std::string run_name;
  uint64_t seed = 17;
  int max_seq_len = 0;
  ModelConfig model;
  std::string tokenizer_name = "gpt2";  // tokenizer.name: gpt2, a tokenizer directory or a .model file
  LoaderConfig train_loader, eval_loader;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  double clipping_threshold = 0.0;  // algorithms.gradient_clipping (norm); 0 = off
  Duration max_duration;
  Duration eval_interval = parse_duration("1ep", "eval_interval");
  bool eval_first = false;
  bool tensorboard = false;      // loggers.tensorboard: event files of the run's scalars
  std::string tensorboard_dir;   // loggers.tensorboard.log_dir; "": RUN_DIR/tensorboard
  int eval_subset_num_batches = -1;  // -1: the whole eval split
  // LLM Foundry's in-context-learning evaluation, run at each evaluation with or without an
  // eval_loader: icl_tasks and eval_gauntlet as YAML text, each a file's path or the list / section
  // inline, as Foundry's train.py takes either ("": none); train/icl_eval.h reads them.
  // icl_seq_len: the tasks' sequence length (0: max_seq_len); icl_subset_num_batches: the
  // batches of device_eval_batch_size questions a task without categories is cut to (-1: all).
  std::string icl_tasks, eval_gauntlet;
  int icl_seq_len = 0;
  int icl_subset_num_batches = -1;
  // DeepSpeed's batch rule when gradient_accumulation_steps is given or the global batch is not:
  // global = microbatch x accumulation steps x ranks, any two giving the third (train/microbatch.h: resolve_batch_sizes, once the ranks are known).
  int global_train_batch_size = 0;
  int device_train_microbatch_size = 0;  // 0: the whole device batch
  int gradient_accumulation_steps = 0;   // 0: what the batch sizes give
  // device_train_microbatch_size: auto: the largest microbatch whose activations fit in
  // memory_limit (the gradient is the same whatever the microbatch size).
  bool microbatch_auto = false;
  int device_eval_batch_size = 0;        // 0: the microbatch size
  // Bytes one rank may hold (model states, working buffers, activations); -1: a share of the
  // memory available at start. Checked at start; what `auto` fits the microbatch into.
  int64_t memory_limit = -1;
  // Keep each block's input only and recompute the block in the backward pass
  // (LLM Foundry: fsdp_config.activation_checkpointing).
  bool activation_checkpointing = false;
  // LLM Foundry's keys: fp32, amp_bf16 or amp_fp16 (16-bit matrix products, fp32 master weights,
  // accumulation and optimizer; docs/precision.md).
  ComputeDtype precision = ComputeDtype::kFp32;
  LossScalerConfig loss_scaler;  // amp_fp16's dynamic loss scaling
  Duration console_log_interval = parse_duration("1ba", "console_log_interval");
  bool progress_bar = true;  // false: plain progress lines every few seconds, never a redrawn bar
  KernelImpl kernels = KernelImpl::kCpu;  // anvil: cpu (fast), gpu (a build with a GPU backend) or ref
  DistributedConfig distributed;
  // Checkpoints (docs/formats.md): every save_interval and at the end, into run_dir/checkpoints.
  Duration save_interval = parse_duration("1000ba", "save_interval");
  // Composer's save_folder: where the checkpoints go ("": RUN_DIR/checkpoints); {run_name} in it
  // is the run's name. An s3:// folder gets each checkpoint uploaded once it is complete in
  // RUN_DIR/checkpoints, as Composer uploads to a remote save_folder. save_overwrite: a new run
  // may replace the checkpoints, metrics and event files of an earlier one in the same places
  // (else that is an error).
  std::string save_folder;
  bool save_overwrite = false;
  // A checkpoint that cannot be written (a full disk, a read-only directory): stop the run with
  // the error, or log it and train on. Either way the previous checkpoint stays whole and
  // `latest`; a partly written one is never taken for a checkpoint.
  SaveFailure save_failure = SaveFailure::kStop;
  int save_num_checkpoints_to_keep = -1;  // -1: all; otherwise the newest N
  bool autoresume = false;                // continue from the newest complete checkpoint in run_dir
  std::string load_path;                  // or from this checkpoint (directory or run directory)
  bool load_weights_only = false;         // take only its weights: a fresh optimizer and data order, step 0
  double dist_timeout = 600;    // seconds a collective may wait before the job is aborted
  // Composer's key. anvil: gradients summed in fixed point, so that the weights after N steps are
  // the same bits whatever the world size, microbatch size or ZeRO stage (docs/determinism.md).
  bool deterministic_mode = true;
  bool has_eval = false;        // whether eval_loader was given
  // What configuration layers did that the run log should say (the keys a ds_config set).
  std::vector<std::string> config_notes;
};

// Loads path, applies overrides ("a.b.c=value", later wins), validates, and returns the config.
// Errors name the file, the key and what was expected. keys_read (may be null) collects the
// dotted name of every key the reader accepts (what to_yaml must write back).
TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides,
                              std::set<std::string>* keys_read = nullptr);

// The directory a run's checkpoints go to and autoresume looks in: a local save_folder (with
// {run_name} replaced), else RUN_DIR/checkpoints.
std::string checkpoints_dir(const TrainConfig& cfg);
// Whether a save_folder names S3 (s3://bucket/prefix) rather than a local directory.
bool is_s3_folder(const std::string& folder);
// An s3:// save_folder (with {run_name} replaced), where checkpoints are uploaded; "" for a local one.
std::string checkpoints_remote(const TrainConfig& cfg);

// "1000", "64kb", "10mb", "1.5gb", "2tb" (powers of 1024, as MosaicML streaming reads them);
// what names the value in the error.
int64_t parse_bytes(const std::string& text, const std::string& what);

// The resolved config as YAML (every key, defaults included); loads back to the same struct.
std::string to_yaml(const TrainConfig& cfg);

}  // namespace anvil
