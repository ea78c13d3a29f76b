// Config loading: defaults, dotted overrides, ${variables.x}, time units, and one clear error
// for each kind of bad input (missing file, malformed YAML, unknown key, wrong type, bad value).
#include <gtest/gtest.h>

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "config/families/family.h"
#include "config/lora_config.h"
#include "config/train_config.h"
#include "config/train_schema.h"
#include "core/error.h"

namespace anvil {
namespace {

class ConfigTest : public ::testing::Test {
 protected:
  std::string write(const std::string& text) {
    const auto dir = std::filesystem::temp_directory_path() / ("anvil_cfg_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const std::string path = (dir / "c.yaml").string();
    std::ofstream(path) << text;
    return path;
  }
  std::string error_of(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
    try {
      load_train_config(write(yaml), overrides);
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  }
  static constexpr const char* kMinimal = R"(
max_seq_len: 64
model: {n_layers: 2, n_heads: 2, d_model: 32}
train_loader: {dataset: {local: data/x}}
global_train_batch_size: 4
max_duration: 10ba
)";
};

TEST_F(ConfigTest, MinimalConfigGetsDefaults) {
  TrainConfig c = load_train_config(write(kMinimal), {});
  EXPECT_EQ(c.model.vocab_size, 50257);
  EXPECT_EQ(c.model.max_seq_len, 64);
  EXPECT_EQ(c.device_train_microbatch_size, 4);
  EXPECT_EQ(c.device_eval_batch_size, 4);
  EXPECT_EQ(c.train_loader.dataset.split, "train");
  EXPECT_EQ(c.optimizer.name, OptimizerKind::kDecoupledAdamW);
  EXPECT_EQ(c.seed, 17u);
  EXPECT_EQ(c.max_duration.unit, Duration::Unit::kBatch);
  EXPECT_EQ(c.run_dir, "runs/c");
}

TEST_F(ConfigTest, OverridesAndVariables) {
  const std::string yaml = std::string(kMinimal) + "variables:\n  lr: 0.002\noptimizer:\n  lr: ${variables.lr}\n";
  TrainConfig c = load_train_config(write(yaml), {"optimizer.betas=[0.8, 0.9]", "model.n_layers=3",
                                                  "max_duration=2ep", "eval_loader.dataset.local=data/y"});
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.002);
  EXPECT_DOUBLE_EQ(c.optimizer.beta1, 0.8);
  EXPECT_EQ(c.model.n_layers, 3);
  EXPECT_EQ(c.max_duration.unit, Duration::Unit::kEpoch);
  EXPECT_TRUE(c.has_eval);
  EXPECT_EQ(c.eval_loader.dataset.split, "val");
  c = load_train_config(write(kMinimal), {"optimizer.lr=1e-3", "optimizer.lr=3e-4"});  // later wins
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-4);
}

// LLM Foundry's older files (mpt-350m.yaml and its siblings): OmegaConf interpolation of top-level
// keys, which are then variables; a chain of them, an override of one, items of a list; FSDP's
// mixed_precision and hints, progress_bar, log_to_console and Composer's monitors accepted.
TEST_F(ConfigTest, FoundrysOlderFilesInterpolateTopLevelKeys) {
  const std::string yaml = R"(
data_local: data/x
data_remote:
global_seed: 23
max_seq_len: 64
beta: 0.97
base_lr: 0.001
lr: ${base_lr}
model:
  n_layers: 2
  n_heads: 2
  d_model: 32
  max_seq_len: ${max_seq_len}
train_loader:
  dataset:
    local: ${data_local}
    remote: ${data_remote}
    shuffle_seed: ${global_seed}
optimizer:
  lr: ${lr}
  betas:
  - 0.9
  - ${beta}
global_train_batch_size: 4
max_duration: 10ba
seed: ${global_seed}
fsdp_config: {sharding_strategy: FULL_SHARD, mixed_precision: PURE, activation_checkpointing_reentrant: false,
              limit_all_gathers: true, activation_cpu_offload: false, verbose: false}
progress_bar: false
log_to_console: true
callbacks: {speed_monitor: {window_size: 10}, lr_monitor: {}, memory_monitor: {}, runtime_estimator: {}}
)";
  TrainConfig c = load_train_config(write(yaml), {"data_local=data/z"});
  EXPECT_EQ(c.train_loader.dataset.local, "data/z");
  EXPECT_EQ(c.train_loader.dataset.remote, "");
  EXPECT_EQ(c.seed, 23u);
  EXPECT_EQ(c.train_loader.dataset.shuffle_seed, 23u);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.001);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.97);
  EXPECT_EQ(c.distributed.zero_stage, 3);
  EXPECT_FALSE(c.progress_bar);
  EXPECT_NE(error_of(std::string(kMinimal) + "seed: ${nowhere.seed}\n").find("refers to nowhere.seed, which is not defined"),
            std::string::npos);
  EXPECT_NE(error_of(std::string(kMinimal) + "a: ${b}\nb: ${a}\nseed: ${a}\n").find("interpolation cycle"),
            std::string::npos);
  EXPECT_NE(error_of(std::string(kMinimal) + "log_to_console: false\n").find("log_to_console = false must be true"),
            std::string::npos);
  EXPECT_NE(error_of(std::string(kMinimal) + "callbacks: {hf_checkpointer: {}}\n").find("unknown key 'callbacks.hf_checkpointer'"),
            std::string::npos);
  EXPECT_NE(error_of(std::string(kMinimal) + "fsdp_config: {activation_cpu_offload: true}\n").find("activation_cpu_offload"),
            std::string::npos);
  // A top-level key nothing refers to is still unknown.
  EXPECT_NE(error_of(std::string(kMinimal) + "data_local: data/x\n").find("unknown key 'data_local'"), std::string::npos);
}

// LLM Foundry's fine-tuning files share a loader's settings through YAML anchors and merge keys,
// and OmegaConf interpolates inside strings too.
TEST_F(ConfigTest, MergeKeysAndInterpolationInsideStrings) {
  const TrainConfig c = load_train_config(write(R"(
variables:
  data: data/x
  name: small
  shared_dataset: &dataset
    local: ${variables.data}
    shuffle: false
max_seq_len: 64
run_dir: runs/${variables.name}-${max_seq_len}
model: {n_layers: 2, n_heads: 2, d_model: 32}
train_loader:
  dataset:
    <<: *dataset
    split: train
eval_loader:
  dataset:
    <<: [*dataset]
    split: val
    shuffle: true
global_train_batch_size: 4
max_duration: 10ba
)"), {});
  EXPECT_EQ(c.train_loader.dataset.local, "data/x");
  EXPECT_FALSE(c.train_loader.dataset.shuffle);
  EXPECT_EQ(c.eval_loader.dataset.local, "data/x");
  EXPECT_TRUE(c.eval_loader.dataset.shuffle);  // the mapping's own key wins over the merged one
  EXPECT_EQ(c.run_dir, "runs/small-64");
  EXPECT_NE(error_of(std::string(kMinimal) + "run_name: a-${variables.nope}\n").find("refers to variables.nope, "
                                                                                     "which is not defined"),
            std::string::npos);
}

// Every key the reader accepts is written back into the resolved config (what the run directory
// and every checkpoint record), so a key added to the reader and forgotten by to_yaml fails
// here. Exempt: other spellings of keys written back, and streams (written when there are some:
// an empty map is not a valid value).
TEST_F(ConfigTest, EveryKeyReadIsWrittenBack) {
  std::set<std::string> keys;
  const TrainConfig c = load_train_config(write(kMinimal), {"eval_loader.dataset.local=data/y"}, &keys);
  const YAML::Node resolved = YAML::Load(to_yaml(c));
  const std::set<std::string> aliases = {
      "variables",                      // ${variables.x} is replaced as the config is read
      "deepspeed_config",               // mapped onto anvil's keys before they are read
      "fsdp_config",                    // sharding_strategy -> distributed.zero_stage, and
      "fsdp_config.sharding_strategy",  // activation_checkpointing -> the top-level key,
      "fsdp_config.activation_checkpointing",  // cpu_offload -> distributed.offload_*
      "fsdp_config.cpu_offload",
      // Accepted from Foundry's files, with nothing to record: FSDP's dtypes and hints, PyTorch's
      // allocator option, console logging (always on), and Composer's monitors of what anvil
      // reports anyway.
      "fsdp_config.mixed_precision", "fsdp_config.activation_checkpointing_reentrant",
      "fsdp_config.limit_all_gathers", "fsdp_config.verbose", "fsdp_config.activation_cpu_offload",
      "fsdp_config.state_dict_type", "fsdp_config.backward_prefetch", "expandable_segments",
      "log_to_console", "callbacks", "callbacks.speed_monitor", "callbacks.speed_monitor.window_size",
      "callbacks.lr_monitor", "callbacks.memory_monitor", "callbacks.runtime_estimator",
      "train_loader.dataset.max_seq_len",  // repetitions of max_seq_len, checked equal to it
      "eval_loader.dataset.max_seq_len",
      "train_loader.dataset.tokenizer_name",  // repetitions of tokenizer.name, checked equal to it
      "eval_loader.dataset.tokenizer_name",
      "tokenizer.kwargs",
      "tokenizer.kwargs.model_max_length",
      "train_loader.dataset.streams",
      "eval_loader.dataset.streams",
      "dataset",  // Foundry's anchor for its loaders' datasets, configuring nothing itself
      // PyTorch DataLoader's worker settings, with no meaning for anvil's decode threads
      "train_loader.pin_memory", "train_loader.persistent_workers", "train_loader.prefetch_factor",
      "train_loader.timeout", "eval_loader.pin_memory", "eval_loader.persistent_workers",
      "eval_loader.prefetch_factor", "eval_loader.timeout",
      "loggers.tensorboard",  // written only when on (TensorBoardLoggerAsComposerSpellsIt)
      "icl_tasks", "eval_gauntlet",  // written only when given (IclTasksAsFoundryTakesThem)
      "model.peft_config",    // written only under LoRA (FamilyConfigTest.LoraPeftConfig)
      "loggers.wandb", "loggers.mlflow", "loggers.comet_ml", "loggers.neptune"};  // refused with a reason
  size_t checked = 0;
  for (const std::string& key : keys) {
    if (aliases.count(key)) continue;
    YAML::Node node = YAML::Clone(resolved);
    std::stringstream parts(key);
    std::string part;
    bool found = true;
    while (found && std::getline(parts, part, '.')) {
      found = node.IsMap() && node[part];
      if (found) node.reset(node[part]);  // reset: Node's = would assign through the reference
    }
    EXPECT_TRUE(found) << key << " is read but not written back by to_yaml";
    checked++;
  }
  EXPECT_GT(checked, 60u);  // the reader's keys were collected
}

TEST_F(ConfigTest, ResolvedYamlLoadsBackToTheSameConfig) {
  TrainConfig c = load_train_config(write(kMinimal), {"eval_loader.dataset.local=data/y", "optimizer.weight_decay=0.1",
                                                      "model.resid_pdrop=0.05"});
  const std::string once = to_yaml(c);
  EXPECT_EQ(to_yaml(load_train_config(write(once), {})), once);
  // Numbers as written, not with 17 digits: doubles (0.95) and floats (0.05) alike.
  for (const char* written : {"betas: [0.9, 0.95]", "weight_decay: 0.1", "resid_pdrop: 0.05", "eps: 1e-08"})
    EXPECT_NE(once.find(written), std::string::npos) << written << " not in:\n" << once;
}

TEST_F(ConfigTest, TensorBoardLoggerAsComposerSpellsIt) {
  TrainConfig c = load_train_config(write(std::string(kMinimal) + "loggers: {tensorboard: {flush_interval: 100}}\n"), {});
  EXPECT_TRUE(c.tensorboard);
  EXPECT_EQ(c.tensorboard_dir, "");
  c = load_train_config(write(std::string(kMinimal) + "loggers: {tensorboard: {log_dir: tb/x}}\n"), {});
  EXPECT_EQ(c.tensorboard_dir, "tb/x");
  EXPECT_EQ(to_yaml(load_train_config(write(to_yaml(c)), {})), to_yaml(c));
  EXPECT_FALSE(load_train_config(write(kMinimal), {}).tensorboard);
  EXPECT_NE(error_of(std::string(kMinimal) + "loggers: {wandb: {project: x}}\n").find("loggers.wandb is not supported"),
            std::string::npos);
  EXPECT_NE(error_of(std::string(kMinimal) + "loggers: {tensorboard: {rank_zero_only: false}}\n").find("rank_zero_only"),
            std::string::npos);
}

// icl_tasks and eval_gauntlet as Foundry's train.py takes them: a file's path or the list / section
// inline, kept as YAML for train/icl_eval.h and written back as given.
TEST_F(ConfigTest, IclTasksAsFoundryTakesThem) {
  TrainConfig c = load_train_config(write(std::string(kMinimal) + "icl_tasks: eval/yamls/tasks_v0.3.yaml\n"
                                          "eval_gauntlet: eval/yamls/eval_gauntlet_v0.3.yaml\nicl_seq_len: 64\n"), {});
  EXPECT_EQ(YAML::Load(c.icl_tasks).Scalar(), "eval/yamls/tasks_v0.3.yaml");
  EXPECT_EQ(YAML::Load(c.eval_gauntlet).Scalar(), "eval/yamls/eval_gauntlet_v0.3.yaml");
  EXPECT_EQ(c.icl_seq_len, 64);
  EXPECT_EQ(to_yaml(load_train_config(write(to_yaml(c)), {})), to_yaml(c));
  c = load_train_config(write(std::string(kMinimal) + "icl_tasks:\n- {label: piqa, dataset_uri: p.jsonl, "
                              "num_fewshot: [0, 5], icl_task_type: multiple_choice}\n"
                              "eval_gauntlet: {weighting: EQUAL, categories: [{name: c, benchmarks: []}]}\n"), {});
  const YAML::Node tasks = YAML::Load(c.icl_tasks);
  ASSERT_TRUE(tasks.IsSequence());
  EXPECT_EQ(tasks[0]["num_fewshot"][1].as<int>(), 5);
  EXPECT_EQ(YAML::Load(c.eval_gauntlet)["weighting"].Scalar(), "EQUAL");
  const TrainConfig again = load_train_config(write(to_yaml(c)), {});
  EXPECT_EQ(again.icl_tasks, c.icl_tasks);
  EXPECT_EQ(again.eval_gauntlet, c.eval_gauntlet);
  EXPECT_TRUE(load_train_config(write(kMinimal), {}).icl_tasks.empty());
  EXPECT_NE(error_of(std::string(kMinimal) + "icl_tasks: {label: piqa}\n")
                .find("icl_tasks must be a file's path or the list itself"), std::string::npos);
  EXPECT_NE(error_of(std::string(kMinimal) + "eval_gauntlet: [a]\n")
                .find("eval_gauntlet must be a file's path or the section itself"), std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"icl_subset_num_batches=0"}).find("icl_subset_num_batches = 0 must be -1 (all) or positive"),
            std::string::npos);
}

TEST_F(ConfigTest, FoundrysRepeatedTokenizerNameMustAgree) {
  const std::string yaml = std::string(kMinimal) + "tokenizer: {name: gpt2}\n";
  TrainConfig c = load_train_config(write(yaml), {"train_loader.dataset.tokenizer_name=gpt2"});
  EXPECT_EQ(c.tokenizer_name, "gpt2");
  EXPECT_NE(error_of(yaml, {"train_loader.dataset.tokenizer_name=EleutherAI/gpt-neox-20b"})
                .find("train_loader.dataset.tokenizer_name is 'EleutherAI/gpt-neox-20b', but tokenizer.name is 'gpt2'"),
            std::string::npos);
}

TEST_F(ConfigTest, ErrorsNameTheProblem) {
  EXPECT_NE(error_of(std::string(kMinimal) + "modle: {}\n").find("unknown key 'modle'"), std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"model.n_layer=3"}).find("unknown key 'model.n_layer'"), std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"model.n_layers=abc"}).find("model.n_layers = 'abc' is not an integer"), std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"model.d_model=33"}).find("divisible"), std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"max_duration=10xyz"}).find("not a duration"), std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"precision=bf16"}).find("expected fp32, amp_bf16 or amp_fp16"), std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"loss_scaler.init_scale=1000"}).find("powers of two"), std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"loss_scaler.hysteresis=0"}).find("must be positive"), std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"loss_scaler.scale=2"}).find("unknown key 'loss_scaler.scale'"), std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"memory_limit=lots"}).find("memory_limit = 'lots' is not a size"), std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"activation_checkpointing=true", "fsdp_config.activation_checkpointing=false"})
                .find("differ"), std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"optimizer.lr=-1"}).find("optimizer.lr = -1 must be positive"), std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"nokey"}).find("key=value"), std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"distributed.gpu_collectives=mpi"}).find("expected auto, nccl or host"),
            std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"scheduler.name=exponential"})
                .find("scheduler.name 'exponential' is not valid: expected constant, constant_with_warmup, "
                      "cosine_with_warmup, linear_decay_with_warmup, WarmupLR, WarmupDecayLR, WarmupCosineLR or OneCycle"),
            std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"train_loader.dataset.max_seq_len=128"})
                .find("train_loader.dataset.max_seq_len is 128, but max_seq_len is 64: they must agree"),
            std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"model.name=bert"}).find("model.name 'bert' is not valid: expected gpt2"),
            std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"optimizer.name=sgd"}).find("expected decoupled_adamw or adamw"), std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"distributed.all_reduce=tree"}).find("expected auto, ring, recursive_doubling or "
                                                                      "rank_ordered"), std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"kernels=gpu", "deterministic_mode=false", "distributed.grad_compression=bf16"})
                .find("use it with kernels=cpu"), std::string::npos);
  // Pipeline stages: a block each at least, and what the stages' agreement rests on.
  EXPECT_NE(error_of(kMinimal, {"distributed.pipeline_parallel=3"})
                .find("distributed.pipeline_parallel 3 cuts the blocks into stages, and the model has 2"),
            std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"distributed.pipeline_parallel=0"}).find("pipeline_parallel"), std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"distributed.pipeline_parallel=2", "deterministic_mode=false"})
                .find("distributed.pipeline_parallel needs deterministic_mode: true"), std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"distributed.pipeline_parallel=2", "distributed.zero_stage=3"})
                .find("works with distributed.zero_stage 0 or 1"), std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"distributed.pipeline_parallel=2", "kernels=gpu"})
                .find("distributed.pipeline_parallel runs on the CPU"), std::string::npos);
  EXPECT_EQ(load_train_config(write(kMinimal), {"distributed.pipeline_parallel=2", "distributed.zero_stage=1"})
                .distributed.pipeline_parallel, 2);
  // Tensor parallelism: what the shares' agreement rests on, and what it does not combine with yet
  // (the model's shape is checked against the ranks when the run starts: model/tensor_parallel.h).
  EXPECT_EQ(load_train_config(write(kMinimal), {"distributed.tensor_parallel=2"}).distributed.tensor_parallel, 2);
  EXPECT_NE(error_of(kMinimal, {"distributed.tensor_parallel=0"}).find("tensor_parallel"), std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"distributed.tensor_parallel=2", "deterministic_mode=false"})
                .find("distributed.tensor_parallel needs deterministic_mode: true"), std::string::npos);
  EXPECT_EQ(load_train_config(write(kMinimal), {"distributed.tensor_parallel=2", "distributed.zero_stage=3"})
                .distributed.zero_stage, 3);
  EXPECT_NE(error_of(kMinimal, {"distributed.tensor_parallel=2", "kernels=gpu"}).find("runs with kernels=cpu"),
            std::string::npos);
  EXPECT_EQ(load_train_config(write(kMinimal), {"distributed.tensor_parallel=2", "distributed.pipeline_parallel=2"})
                .distributed.tensor_parallel, 2);
  EXPECT_NE(error_of(kMinimal, {"distributed.tensor_parallel=2", "distributed.expert_parallel=2"})
                .find("does not combine with distributed.expert_parallel yet"), std::string::npos);
  EXPECT_NE(error_of("model: [1, 2\n").find("malformed YAML at line"), std::string::npos);
  EXPECT_NE(error_of("max_seq_len: 8\nmodel: {n_layers: 1, n_heads: 1, d_model: 8}\n").find("train_loader is required"),
            std::string::npos);
  try {
    load_train_config("/nonexistent/x.yaml", {});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("config file '/nonexistent/x.yaml' not found"), std::string::npos);
  }
}

// A user learns every unknown key in one run, each with the nearest valid name when one is near,
// and then the error that stopped the reading.
TEST_F(ConfigTest, EveryUnknownKeyIsReportedAtOnce) {
  const std::string all = error_of(std::string(kMinimal) + "callbacks: {speed_monitr: {}}\nsede: 3\n",
                                   {"model.n_layer=3", "optimizer.learning_rate=1"});
  EXPECT_EQ(all.rfind("4 unknown keys:\n", 0), 0u) << all;
  for (const char* want : {"unknown key 'model.n_layer' (did you mean 'model.n_layers'?)",
                           "unknown key 'optimizer.learning_rate' (expected one of: betas, bias_correction, eps, lr, "
                           "master_weights_dtype, name, states_dtype, weight_decay)",
                           "unknown key 'callbacks.speed_monitr' (did you mean 'callbacks.speed_monitor'?)",
                           "unknown key 'sede' (did you mean 'seed'?)"})
    EXPECT_NE(all.find(want), std::string::npos) << want << " not in: " << all;
  const std::string then = error_of(kMinimal, {"model.n_layer=3", "global_train_batch_size=abc"});
  EXPECT_NE(then.find("1 unknown key:\n  "), std::string::npos) << then;
  EXPECT_NE(then.find("\nthen: "), std::string::npos) << then;
  EXPECT_NE(then.find("global_train_batch_size = 'abc' is not an integer"), std::string::npos) << then;
  // In a ds_config section that DeepSpeed checks (its pydantic models), an unknown key is an error
  // there too.
  const std::string ds = error_of(std::string(kMinimal) + "deepspeed_config: {zero_optimization: {stag: 1}}\n"
                                  "modle: {}\n");
  EXPECT_NE(ds.find("unknown key 'deepspeed_config.zero_optimization.stag' (did you mean "
                    "'deepspeed_config.zero_optimization.stage'?)"), std::string::npos) << ds;
  EXPECT_NE(ds.find("unknown key 'modle' (did you mean 'model'?)"), std::string::npos) << ds;
}

// An error names where the value came from: the file, the command line, or the ds_config.
TEST_F(ConfigTest, ErrorsBlameWhereTheValueCameFrom) {
  EXPECT_EQ(error_of(kMinimal, {"model.n_layers=abc"}).rfind("the command line: model.n_layers = 'abc'", 0), 0u);
  EXPECT_EQ(error_of(kMinimal, {"optimizer.lr=-1"}).rfind("the command line: optimizer.lr = -1 must be positive", 0), 0u);
  EXPECT_NE(error_of(kMinimal, {"optimizer.nope=1"}).find("the command line: unknown key 'optimizer.nope'"),
            std::string::npos);
  const std::string from_file = error_of(std::string(kMinimal) + "optimizer: {lr: -1}\n");
  EXPECT_NE(from_file.find("c.yaml: optimizer.lr = -1 must be positive"), std::string::npos) << from_file;
  const auto json = std::filesystem::temp_directory_path() / ("anvil_blame_" + std::to_string(::getpid()) + ".json");
  std::ofstream(json) << R"({"optimizer": {"type": "AdamW", "params": {"lr": -0.001}}})";
  const std::string from_ds = error_of(std::string(kMinimal) + "deepspeed_config: " + json.string() + "\n");
  EXPECT_EQ(from_ds.rfind(json.string() + ": optimizer.lr = -0.001 must be positive", 0), 0u) << from_ds;
  std::filesystem::remove(json);
}

TEST_F(ConfigTest, AutoMicrobatchMemoryLimitAndCheckpointing) {
  TrainConfig c = load_train_config(write(kMinimal), {"device_train_microbatch_size=auto", "memory_limit=2gb",
                                                      "fsdp_config.activation_checkpointing=true"});
  EXPECT_TRUE(c.microbatch_auto);
  EXPECT_EQ(c.device_eval_batch_size, 0);  // the trainer makes it the microbatch it picks
  EXPECT_EQ(c.memory_limit, int64_t{2} << 30);
  EXPECT_TRUE(c.activation_checkpointing);
  const std::string resolved = to_yaml(c);
  EXPECT_NE(resolved.find("device_train_microbatch_size: auto"), std::string::npos);
  EXPECT_EQ(to_yaml(load_train_config(write(resolved), {})), resolved);
  // Hugging Face's "auto" in a ds_config keeps the YAML's value, auto included.
  c = load_train_config(write(std::string(kMinimal) + "device_train_microbatch_size: auto\n"),
                        {"deepspeed_config.train_micro_batch_size_per_gpu=auto"});
  EXPECT_TRUE(c.microbatch_auto);
}

TEST_F(ConfigTest, DuplicateKeysAreAnError) {
  EXPECT_NE(error_of(std::string(kMinimal) + "seed: 1\nseed: 2\n").find("key 'seed' is given twice"), std::string::npos);
}

// DeepSpeed's ds_config (inline or a JSON file) becomes anvil's keys, and the resolved config
// holds those keys only.
TEST_F(ConfigTest, DeepSpeedConfigMapsToAnvilKeys) {
  const std::string fp16 = std::string(kMinimal) + R"(deepspeed_config:
  train_micro_batch_size_per_gpu: 2
  gradient_clipping: 1.0
  steps_per_print: 10
  wall_clock_breakdown: false
  fp16: {enabled: true, loss_scale: 0, initial_scale_power: 12, loss_scale_window: 500, hysteresis: 3,
         consecutive_hysteresis: true, min_loss_scale: 4}
  zero_optimization: {stage: 2, overlap_comm: true, reduce_bucket_size: 5e8, offload_optimizer: {device: none}}
  optimizer: {type: AdamW, params: {lr: 0.001, betas: [0.8, 0.99], eps: 1.0e-6, weight_decay: 0.1}}
)";
  TrainConfig c = load_train_config(write(fp16), {});
  EXPECT_EQ(c.precision, ComputeDtype::kFp16);
  EXPECT_EQ(c.loss_scaler.init_scale, 4096);
  EXPECT_EQ(c.loss_scaler.growth_interval, 500);
  EXPECT_EQ(c.loss_scaler.hysteresis, 3);
  EXPECT_TRUE(c.loss_scaler.consecutive_hysteresis);
  EXPECT_EQ(c.loss_scaler.min_scale, 4);
  // The ds_config's micro batch alone defines the batch (DeepSpeed: one accumulation step), so the
  // YAML's global batch gives way and the number of ranks decides it.
  EXPECT_EQ(c.device_train_microbatch_size, 2);
  EXPECT_EQ(c.global_train_batch_size, 0);
  EXPECT_EQ(c.clipping_threshold, 1.0);
  EXPECT_EQ(c.console_log_interval.value, 10);
  EXPECT_EQ(c.distributed.zero_stage, 2);
  EXPECT_EQ(c.optimizer.name, OptimizerKind::kAdamW);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.001);
  // DeepSpeed's AutoTP cuts the products anvil's tensor parallelism cuts.
  EXPECT_EQ(load_train_config(write(std::string(kMinimal) + "deepspeed_config: {tensor_parallel: {autotp_size: 2}}\n"),
                              {}).distributed.tensor_parallel, 2);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.99);
  EXPECT_DOUBLE_EQ(c.optimizer.eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.1);
  EXPECT_TRUE(c.optimizer.bias_correction);  // DeepSpeed's default
  const std::string resolved = to_yaml(c);
  EXPECT_EQ(resolved.find("deepspeed"), std::string::npos);
  EXPECT_EQ(to_yaml(load_train_config(write(resolved), {})), resolved);

  // The same from a ds_config.json file, and bf16.
  const auto json = std::filesystem::temp_directory_path() / ("anvil_ds_" + std::to_string(::getpid()) + ".json");
  std::ofstream(json) << R"({"train_batch_size": 4, "bf16": {"enabled": true}, "fp16": {"enabled": false,
                              "initial_scale_power": 8}, "zero_optimization": {"stage": 3}})";
  c = load_train_config(write(std::string(kMinimal) + "deepspeed_config: " + json.string() + "\n"), {});
  EXPECT_EQ(c.precision, ComputeDtype::kBf16);
  EXPECT_EQ(c.loss_scaler.init_scale, 65536);  // fp16's keys mean nothing while it is off
  EXPECT_EQ(c.distributed.zero_stage, 3);
  // An anvil key that agrees is fine; the JSON file's errors name the file.
  c = load_train_config(write(std::string(kMinimal) + "deepspeed_config: " + json.string() + "\n"),
                        {"precision=amp_bf16", "global_train_batch_size=4"});
  EXPECT_EQ(c.precision, ComputeDtype::kBf16);
  std::ofstream(json) << R"({"bf16": {"enabled": true}, "fp16": {"enabled": true}})";
  const std::string both = error_of(std::string(kMinimal) + "deepspeed_config: " + json.string() + "\n");
  EXPECT_NE(both.find(json.string() + ": deepspeed_config enables both fp16 and bf16"), std::string::npos) << both;
  std::filesystem::remove(json);
}

// What DeepSpeed itself ignores (a key it reads nowhere, at the top level or in a section it reads
// by hand) is a warning in the run log with the nearest real key; its features switched off are
// accepted, switched on an error naming them.
TEST_F(ConfigTest, DeepSpeedKeysItIgnoresAreWarnings) {
  TrainConfig c = load_train_config(write(std::string(kMinimal) + R"(deepspeed_config:
  train_batch_size: 4
  steps_per_prin: 5
  cuda_visible_devices: 0
  optimizer: {type: AdamW, legacy_fusion: false, parms: {lr: 0.1}}
  flops_profiler: {enabled: false, profile_stp: 3}
  comms_logger: {enabled: false, verbose: true}
  elasticity: {enabled: false, max_train_batch_size: 8}
  compression_training: {weight_quantization: {shared_parameters: {enabled: false}}}
  checkpoint: {tag_validation: Warn, load_universal: false}
  managed_gradient_accumulation: true
  gradient_allreduce_op: MEAN
  expert_parallel: {enabled: false}
  datastates_ckpt: false
  scheduler: {type: WarmupLR, param: {warmup_num_steps: 3}}
  tensor_parallel: {autotp_size: 1}
  zero_optimization: {stage: 2, stage3_max_live_parameters: 1e9, max_reuse_distance: 1e9, mics_shard_size: -1}
)"), {});
  std::string notes;
  for (const std::string& n : c.config_notes) notes += n + "\n";
  for (const char* want : {"warning: deepspeed_config.steps_per_prin is not a key DeepSpeed reads: ignored, as "
                           "DeepSpeed ignores it (did you mean deepspeed_config.steps_per_print?)",
                           "warning: deepspeed_config.cuda_visible_devices is not a key DeepSpeed reads",
                           "warning: deepspeed_config.optimizer.parms is not a key DeepSpeed reads: ignored, as "
                           "DeepSpeed ignores it (did you mean deepspeed_config.optimizer.params?)",
                           "warning: deepspeed_config.flops_profiler.profile_stp",
                           "warning: deepspeed_config.scheduler.param is not a key DeepSpeed reads"})
    EXPECT_NE(notes.find(want), std::string::npos) << want << " not in: " << notes;
  EXPECT_EQ(c.distributed.zero_stage, 2);
  auto ds = [&](const std::string& body) {
    return error_of(std::string(kMinimal) + "deepspeed_config: " + body + "\n");
  };
  for (const auto& [body, want] : std::vector<std::pair<std::string, std::string>>{
           {"{elasticity: {enabled: true}}", "deepspeed_config.elasticity.enabled: true is not supported"},
           {"{compression_training: {weight_quantization: {shared_parameters: {enabled: true}}}}",
            "deepspeed_config.compression_training.weight_quantization.shared_parameters.enabled: true is not "
            "supported: anvil trains unquantized"},
           {"{sparse_attention: {mode: fixed}}", "deepspeed_config.sparse_attention is not supported"},
           {"{expert_parallel: {enabled: true}}", "deepspeed_config.expert_parallel.enabled: true is not supported"},
           {"{zero_optimization: {legacy_stage1: true}}", "legacy_stage1 true is not supported: DeepSpeed's engine"},
           {"{zero_optimization: {offload_param: {device: cpu, ratio: 0.5}}}",
            "unknown key 'deepspeed_config.zero_optimization.offload_param.ratio'"},
           {"{pipeline: {stages: 2}}", "deepspeed_config.pipeline is not supported"},
           {"{gradient_allreduce_op: sum}", "deepspeed_config.gradient_allreduce_op sum is not supported"},
           {"{zero_optimization: {zero_quantized_weights: true}}",
            "deepspeed_config.zero_optimization.zero_quantized_weights true is not supported"},
           {"{bf16: {enabled: true, bf16_optimizer_states: true}}",
            "deepspeed_config.bf16.bf16_optimizer_states: true needs bf16_master_weights_and_grads: true"},
           {"{fp16: {enabled: true, fp16_master_weight: true}}",
            "unknown key 'deepspeed_config.fp16.fp16_master_weight'"},
           {"{optimizer: {type: AdamW, params: {learning_rate: 0.1}}}",
            "unknown key 'deepspeed_config.optimizer.params.learning_rate'"}})
    EXPECT_NE(ds(body).find(want), std::string::npos) << body << ": " << ds(body);
}

// ZeRO-Offload's keys (DeepSpeed's, the older cpu_offload, Composer's FSDP cpu_offload) are honoured
// on a CPU run, where the states live in host memory already, and the log says so.
TEST_F(ConfigTest, OffloadToTheCpuIsHonouredOnACpuRun) {
  auto notes_of = [](const TrainConfig& c) {
    std::string all;
    for (const std::string& n : c.config_notes) all += n + "\n";
    return all;
  };
  TrainConfig c = load_train_config(write(std::string(kMinimal) + R"(deepspeed_config:
  zero_optimization: {stage: 2, offload_optimizer: {device: cpu, pin_memory: true}}
)"), {});
  EXPECT_EQ(c.distributed.offload_optimizer, OffloadDevice::kCpu);
  EXPECT_EQ(c.distributed.offload_param, OffloadDevice::kNone);
  EXPECT_NE(notes_of(c).find("distributed.offload_optimizer cpu: honoured as it stands: a run with kernels=cpu keeps "
                             "the optimizer states in host memory"), std::string::npos) << notes_of(c);
  EXPECT_NE(to_yaml(c).find("offload_optimizer: cpu"), std::string::npos);
  c = load_train_config(write(std::string(kMinimal) + "deepspeed_config: {zero_optimization: {cpu_offload: true}}\n"),
                        {});
  EXPECT_EQ(c.distributed.offload_optimizer, OffloadDevice::kCpu);
  c = load_train_config(write(std::string(kMinimal) + "fsdp_config: {cpu_offload: true}\n"), {"kernels=ref"});
  EXPECT_EQ(c.distributed.offload_optimizer, OffloadDevice::kCpu);
  EXPECT_EQ(c.distributed.offload_param, OffloadDevice::kCpu);
  EXPECT_NE(notes_of(c).find("distributed.offload_param cpu: honoured as it stands: a run with kernels=ref keeps the "
                             "parameters in host memory"), std::string::npos) << notes_of(c);
  c = load_train_config(write(std::string(kMinimal) + "fsdp_config: {cpu_offload: false}\n"), {});
  EXPECT_EQ(c.distributed.offload_param, OffloadDevice::kNone);
  EXPECT_TRUE(c.config_notes.empty());
  EXPECT_NE(error_of(std::string(kMinimal) + "distributed: {offload_param: cpu}\nfsdp_config: {cpu_offload: false}\n")
                .find("fsdp_config.cpu_offload false and distributed.offload_param/offload_optimizer differ"),
            std::string::npos);
  EXPECT_NE(error_of(std::string(kMinimal) + "distributed: {offload_optimizer: disk}\n").find("offload_optimizer"),
            std::string::npos);
  EXPECT_NE(error_of(std::string(kMinimal) + "fsdp_config: {cpu_offload: true}\n", {"kernels=gpu"})
                .find("distributed.offload_optimizer cpu under kernels=gpu is not supported yet"),
            std::string::npos);
}

TEST_F(ConfigTest, DeepSpeedConfigErrorsNameTheKey) {
  auto ds = [&](const std::string& body, const std::vector<std::string>& overrides = {}) {
    return error_of(std::string(kMinimal) + "deepspeed_config: " + body + "\n", overrides);
  };
  EXPECT_NE(ds("{gradient_accumulation_steps: 2}").find("give global_train_batch_size, or "
                                                        "device_train_microbatch_size and gradient_accumulation_steps"),
            std::string::npos);
  EXPECT_NE(ds("{fp16: {enabled: true, loss_scale: 128}}").find("static loss scale"), std::string::npos);
  EXPECT_NE(ds("{fp16: {enabled: true, initial_scale_power: 70}}").find("must be in 0..60"), std::string::npos);
  EXPECT_NE(ds("{fp16: {enabled: true, min_loss_scale: 3}}").find("powers of two"), std::string::npos);
  EXPECT_NE(ds("{fp16: {enabled: true, fp16_master_weights: true}}").find("unknown key "
            "'deepspeed_config.fp16.fp16_master_weights'"), std::string::npos);
  EXPECT_NE(ds("{zero_optimization: {stage: 3, offload_param: {device: nvme, nvme_path: /nvme}}}")
                .find("offload_param.device 'nvme' is not supported: anvil offloads to `cpu`"),
            std::string::npos);
  EXPECT_NE(ds("{zero_optimization: {offload_optimizer: {device: cpu}}}", {"kernels=gpu"})
                .find("distributed.offload_optimizer cpu under kernels=gpu is not supported yet"),
            std::string::npos);
  EXPECT_NE(ds("{optimizer: {type: Lamb}}").find("optimizer type 'Lamb' is not supported"), std::string::npos);
  EXPECT_NE(ds("{optimizer: {type: Adam, params: {adam_w_mode: false, weight_decay: 0.1}}}")
                .find("Adam with L2 regularisation, which anvil does not have"),
            std::string::npos);
  EXPECT_NE(ds("{scheduler: {type: LRRangeTest}}").find("scheduler type 'LRRangeTest' is not supported"),
            std::string::npos);
  EXPECT_NE(ds("{scheduler: {type: OneCycle, params: {cycle_min_lr: 0.1, cycle_max_lr: 1}}}")
                .find("cycle_momentum true (DeepSpeed's default) is not supported"),
            std::string::npos);
  EXPECT_NE(ds("{scheduler: {type: WarmupLR, params: {warmup_num_steps: auto}}}").find("\"auto\" has nothing"),
            std::string::npos);
  EXPECT_NE(ds("{zero_optimization: {stage: 5}}").find("stage 5 must be 0, 1, 2 or 3"), std::string::npos);
  EXPECT_NE(ds("{wandb: {enabled: true}}").find("wandb.enabled: true is not supported"), std::string::npos);
  EXPECT_NE(ds("{activation_checkpointing: {cpu_checkpointing: true}}").find("cpu_checkpointing: true is not"),
            std::string::npos);
  // Checked once the ranks are known (tests/train/test_batch_sizes.cpp).
  EXPECT_NE(ds("{train_batch_size: 8, train_micro_batch_size_per_gpu: 3, gradient_accumulation_steps: 2}", {})
                .find("(no error)"), std::string::npos);
  EXPECT_NE(ds("/nonexistent/ds.json").find("deepspeed_config file '/nonexistent/ds.json' not found"),
            std::string::npos);
  EXPECT_NE(ds("{train_batch_size: 4, train_batch_size: 8}").find("given twice"), std::string::npos);
}

// A ds_config is a layer: it wins over the YAML, the command line wins over it, and the run log
// says what it set. What it leaves out takes DeepSpeed's defaults, not anvil's.
TEST_F(ConfigTest, DeepSpeedConfigIsALayerWithDeepSpeedsDefaults) {
  const std::string yaml = std::string(kMinimal) + R"(device_train_microbatch_size: 2
optimizer: {name: decoupled_adamw, lr: 6.0e-4, betas: [0.9, 0.95], weight_decay: 0.0}
precision: amp_bf16
deepspeed_config:
  train_batch_size: 16
  gradient_accumulation_steps: 1
  fp16: {enabled: true}
  optimizer: {type: Adam, params: {lr: 1.5e-4}}
  prescale_gradients: false
  zero_allow_untested_optimizer: true
)";
  TrainConfig c = load_train_config(write(yaml), {});
  EXPECT_EQ(c.precision, ComputeDtype::kFp16);                   // the ds_config over the YAML
  EXPECT_EQ(c.global_train_batch_size, 16);
  EXPECT_EQ(c.device_train_microbatch_size, 0);                  // the YAML's gives way to DeepSpeed's rule
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.optimizer.name, OptimizerKind::kAdamW);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1.5e-4);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.999);                    // DeepSpeed's defaults, not the YAML's
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.0);
  EXPECT_EQ(c.loss_scaler.growth_interval, 1000);                // DeepSpeed's loss_scale_window
  EXPECT_EQ(c.scheduler.name, SchedulerKind::kConstant);          // neither names one: DeepSpeed's constant rate
  std::string notes;
  for (const std::string& n : c.config_notes) notes += n + "\n";
  EXPECT_NE(notes.find("precision = amp_fp16 (fp16.enabled, was amp_bf16)"), std::string::npos) << notes;
  EXPECT_NE(notes.find("device_train_microbatch_size removed"), std::string::npos) << notes;
  // Adam without bias correction (DeepSpeed's bias_correction false) is anvil's optimizer.bias_correction.
  c = load_train_config(write(std::string(kMinimal) + "deepspeed_config: {optimizer: {type: Adam, params: "
                              "{bias_correction: false}}}\n"), {});
  EXPECT_FALSE(c.optimizer.bias_correction);
  EXPECT_NE(to_yaml(c).find("bias_correction: false"), std::string::npos);

  // The command line wins over the ds_config.
  c = load_train_config(write(yaml), {"precision=amp_bf16", "optimizer.lr=3e-4"});
  EXPECT_EQ(c.precision, ComputeDtype::kBf16);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-4);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.999);

  // A scheduler the YAML names stays when the ds_config has none.
  c = load_train_config(write(std::string(kMinimal) + "scheduler: {name: linear_decay_with_warmup}\n"
                              "deepspeed_config: {train_batch_size: 4}\n"), {});
  EXPECT_EQ(c.scheduler.name, SchedulerKind::kLinearDecayWithWarmup);

  // A scheduler with Hugging Face's "auto": the rate and warmup come from the YAML.
  c = load_train_config(write(std::string(kMinimal) + R"(optimizer: {lr: 2.0e-4}
scheduler: {name: cosine_with_warmup, t_warmup: 30ba}
deepspeed_config:
  optimizer: {type: AdamW, params: {lr: auto, betas: auto, eps: auto, weight_decay: auto}}
  scheduler: {type: WarmupDecayLR, params: {warmup_min_lr: auto, warmup_max_lr: auto, warmup_num_steps: auto,
              total_num_steps: auto, warmup_type: linear}}
)"), {});
  EXPECT_EQ(c.scheduler.name, SchedulerKind::kWarmupDecayLR);
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_max_lr, 2e-4);
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_min_lr, 0.0);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 30);
  EXPECT_EQ(c.scheduler.total_num_steps, 0);  // the run's length
  EXPECT_EQ(c.scheduler.warmup_type, WarmupType::kLinear);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 2e-4);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.95);  // anvil's own default, as the YAML leaves it
  const std::string resolved = to_yaml(c);
  EXPECT_EQ(to_yaml(load_train_config(write(resolved), {})), resolved);

  // fp16 "auto" (transformers' files): the YAML's precision decides, and the block's loss
  // scaler applies when that is amp_fp16.
  const std::string hf = std::string(kMinimal) + "deepspeed_config: {fp16: {enabled: auto, loss_scale_window: 500}}\n";
  c = load_train_config(write(hf), {"precision=amp_fp16"});
  EXPECT_EQ(c.precision, ComputeDtype::kFp16);
  EXPECT_EQ(c.loss_scaler.growth_interval, 500);
  c = load_train_config(write(hf), {});
  EXPECT_EQ(c.precision, ComputeDtype::kFp32);
  EXPECT_EQ(c.loss_scaler.growth_interval, 2000);  // anvil's, unused in fp32
}

TEST(Duration, UnitsAndConversion) {
  EXPECT_EQ(duration_to_batches(parse_duration("100ba", "k"), 50, 8, 64, -1, "k"), 100);
  EXPECT_EQ(duration_to_batches(parse_duration("2ep", "k"), 50, 8, 64, -1, "k"), 100);
  EXPECT_EQ(duration_to_batches(parse_duration("3", "k"), 50, 8, 64, -1, "k"), 150);
  EXPECT_EQ(duration_to_batches(parse_duration("800sp", "k"), 50, 8, 64, -1, "k"), 100);
  EXPECT_EQ(duration_to_batches(parse_duration("5.12e4tok", "k"), 50, 8, 64, -1, "k"), 100);
  EXPECT_EQ(duration_to_batches(parse_duration("0.25dur", "k"), 50, 8, 64, 400, "k"), 100);
  EXPECT_THROW(parse_duration("1.5ba", "k"), Error);
  EXPECT_THROW(parse_duration("2dur", "k"), Error);
  EXPECT_THROW(parse_duration("-1ba", "k"), Error);
}

}  // namespace
}  // namespace anvil

namespace anvil {
namespace {

// The families' keys: each family's defaults, a Foundry-style MPT and a Llama read into the
// architecture options, written back and read again to the same model, and one error per kind of
// key anvil cannot honour.
class FamilyConfigTest : public ConfigTest {
 protected:
  TrainConfig load_model(const std::string& model_yaml) {
    return load_train_config(write(std::string(R"(
max_seq_len: 64
train_loader: {dataset: {local: data/x}}
global_train_batch_size: 4
max_duration: 10ba
model:
)") + model_yaml), {});
  }
  void expect_round_trip(const TrainConfig& c) {
    const TrainConfig again = load_train_config(write(to_yaml(c)), {});
    EXPECT_TRUE(again.model == c.model) << to_yaml(c);
  }
  std::string model_error(const std::string& model_yaml) {
    try {
      load_model(model_yaml);
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  }
};

TEST_F(FamilyConfigTest, MptReadsFoundrysKeys) {
  // Foundry's defaults: learned positions, biases, LayerNorm, exact GELU of 4·d_model, tied.
  TrainConfig c = load_model("  {name: mpt_causal_lm, n_layers: 2, n_heads: 4, d_model: 32, init_device: meta}\n");
  EXPECT_EQ(c.model.vocab_size, 50368);
  EXPECT_EQ(c.model.positions, PositionKind::kLearned);
  EXPECT_TRUE(c.model.linear_bias && c.model.norm_bias && c.model.tied_embeddings);
  EXPECT_EQ(c.model.mlp, MlpKind::kGeluErf);
  EXPECT_EQ(c.model.mlp_width(), 128);
  EXPECT_EQ(c.model.init, InitScheme::kKaimingNormal);
  expect_round_trip(c);
  // MPT-7B's shape: ALiBi, no biases at all; and grouped-query heads with a SwiGLU MLP.
  c = load_model(R"(  name: mpt_causal_lm
  n_layers: 2
  n_heads: 4
  d_model: 32
  expansion_ratio: 2
  no_bias: true
  attn_config: {attn_impl: flash, alibi: true, alibi_bias_max: 16, attn_type: grouped_query_attention, kv_n_heads: 2,
                qk_ln: true}
  ffn_config: {ffn_type: mptglu, ffn_act_fn: {name: silu}}
)");
  EXPECT_EQ(c.model.qk_norm, QkNorm::kWhole);
  EXPECT_EQ(c.model.positions, PositionKind::kAlibi);
  EXPECT_FLOAT_EQ(c.model.alibi_bias_max, 16.0f);
  EXPECT_FALSE(c.model.linear_bias || c.model.norm_bias);
  EXPECT_EQ(c.model.kv_heads(), 2);
  EXPECT_EQ(c.model.mlp, MlpKind::kSwiglu);
  EXPECT_EQ(c.model.mlp_width(), 64);
  expect_round_trip(c);
  c = load_model("  {name: mpt_causal_lm, n_layers: 2, n_heads: 4, d_model: 32, attn_config: {rope: true, "
                 "rope_theta: 500000}, learned_pos_emb: false, norm_type: rmsnorm, norm_eps: 1.0e-6}\n");
  EXPECT_EQ(c.model.positions, PositionKind::kRope);
  EXPECT_FLOAT_EQ(c.model.rope.theta, 500000.0f);
  EXPECT_EQ(c.model.norm, NormKind::kRmsNorm);
  expect_round_trip(c);
}

// LLM Foundry's MegaBlocks keys: mb_moe with MegaBlocks' defaults (top 1, capacity factor 1, loss
// weight 0.1, weights not normalised, tanh GELU), and mb_dmoe (dropless) with gated experts; the
// keys round trip, and what anvil cannot honour is an error naming the key.
TEST_F(FamilyConfigTest, MptMixtureOfExperts) {
  const std::string base = "  name: mpt_causal_lm\n  n_layers: 2\n  n_heads: 4\n  d_model: 32\n  no_bias: true\n";
  TrainConfig c = load_model(base + "  ffn_config: {ffn_type: mb_moe, moe_num_experts: 8, ffn_hidden_size: 48}\n");
  EXPECT_EQ(c.model.moe, (MoeConfig{8, 1, 1.0f, 0.0f, 0.1f}));
  EXPECT_EQ(c.model.mlp, MlpKind::kGeluTanh);  // MegaBlocks' default activation
  EXPECT_EQ(c.model.mlp_width(), 48);
  expect_round_trip(c);
  c = load_model(base + "  ffn_config: {ffn_type: mb_dmoe, moe_num_experts: 4, moe_top_k: 2, mlp_type: glu, "
                 "ffn_act_fn: {name: silu}, moe_capacity_factor: 1.25, moe_normalize_expert_weights: 1.0, "
                 "moe_loss_weight: 0.01, moe_lbl_in_fp32: true, memory_optimized_mlp: true, mlp_impl: grouped}\n");
  EXPECT_EQ(c.model.moe, (MoeConfig{4, 2, 0.0f, 1.0f, 0.01f}));  // dropless: the capacity factor unused
  EXPECT_EQ(c.model.mlp, MlpKind::kSwiglu);
  expect_round_trip(c);
  const std::string moe = base + "  ffn_config:\n    ffn_type: mb_moe\n    moe_num_experts: 4\n";
  EXPECT_NE(model_error(moe + "    moe_top_k: 5\n").find("model.ffn_config.moe_top_k = 5 must be between 1 and "
                                                        "moe_num_experts (4)"),
            std::string::npos);
  EXPECT_NE(model_error(base + "  ffn_config: {ffn_type: mb_moe}\n").find("moe_num_experts = 0 must be at least 1"),
            std::string::npos);
  EXPECT_NE(model_error(moe + "    moe_capacity_factor: 0\n").find("moe_capacity_factor = 0 must be positive"),
            std::string::npos);
  EXPECT_NE(model_error(moe + "    moe_jitter_eps: 0.01\n").find("moe_jitter_eps is not supported"), std::string::npos);
  EXPECT_NE(model_error(moe + "    moe_expert_model_parallelism: true\n").find("with distributed.expert_parallel"),
            std::string::npos);
  EXPECT_NE(model_error(moe + "    mlp_type: glu\n").find("needs ffn_type mb_dmoe"), std::string::npos);
  EXPECT_NE(model_error(moe + "    moe_world_size: 2\n").find("with distributed.expert_parallel"), std::string::npos);
  EXPECT_NE(model_error("  {name: mpt_causal_lm, n_layers: 2, n_heads: 4, d_model: 32, ffn_config: {ffn_type: mb_dmoe, "
                        "moe_num_experts: 2}}\n").find("no_bias: false is not supported"),
            std::string::npos);
  EXPECT_NE(model_error(moe + "    mlp_type: moe\n").find("expected mlp or glu"), std::string::npos);
  // LoRA: all-linear finds the attention's products and the router (PEFT's view of MegaBlocks'
  // layers: the experts are weights, not linear layers), so the MLP's names are no modules.
  c = load_model(moe + "  peft_config: {peft_type: LORA, r: 4, target_modules: all-linear}\n");
  std::vector<std::string> adapted;
  for (const LoraModule& m : lora_targets(c.model)) adapted.push_back(m.name);
  EXPECT_EQ(adapted, (std::vector<std::string>{"attn.Wqkv", "attn.out_proj", "ffn.router.layer"}));
  EXPECT_NE(model_error(moe + "  peft_config: {peft_type: LORA, r: 4, target_modules: [up_proj]}\n").find("up_proj"),
            std::string::npos);
  // Expert parallelism: experts to share, evenly, on the CPU.
  const std::string run = "max_seq_len: 64\ntrain_loader: {dataset: {local: data/x}}\nglobal_train_batch_size: 4\n"
                          "max_duration: 10ba\nmodel:\n" + moe;
  EXPECT_EQ(load_train_config(write(run), {"distributed.expert_parallel=4"}).distributed.expert_parallel, 4);
  EXPECT_NE(error_of(run, {"distributed.expert_parallel=3"}).find("distributed.expert_parallel 3 must divide the 4 "
                                                                  "experts"), std::string::npos);
  EXPECT_NE(error_of(run, {"distributed.expert_parallel=2", "kernels=gpu"}).find("runs on the CPU"), std::string::npos);
  EXPECT_NE(error_of(run, {"distributed.expert_parallel=0"}).find("expert_parallel"), std::string::npos);
  EXPECT_NE(error_of(run, {"distributed.expert_parallel=2", "deterministic_mode=false"})
                .find("distributed.expert_parallel needs deterministic_mode: true"), std::string::npos);
  // Pipeline stages run the experts, shared among a stage's ranks or not.
  EXPECT_EQ(load_train_config(write(run), {"distributed.pipeline_parallel=2"}).distributed.pipeline_parallel, 2);
  EXPECT_EQ(load_train_config(write(run), {"distributed.pipeline_parallel=2", "distributed.expert_parallel=2"})
                .distributed.expert_parallel, 2);
  EXPECT_NE(error_of(kMinimal, {"distributed.expert_parallel=2"}).find("this model's blocks have a dense MLP"),
            std::string::npos);
}

TEST_F(FamilyConfigTest, LlamaDefaultsAndRoundTrip) {
  TrainConfig c = load_model("  {name: llama, n_layers: 2, n_heads: 8, n_kv_heads: 2, d_model: 64}\n");
  EXPECT_EQ(c.model.vocab_size, 32000);
  EXPECT_EQ(c.model.norm, NormKind::kRmsNorm);
  EXPECT_EQ(c.model.positions, PositionKind::kRope);
  EXPECT_EQ(c.model.mlp, MlpKind::kSwiglu);
  EXPECT_EQ(c.model.mlp_width(), 256);  // 2/3 · 4 · 64 = 170, rounded up to a multiple of 256
  EXPECT_FALSE(c.model.linear_bias || c.model.tied_embeddings);
  EXPECT_EQ(c.model.kv_heads(), 2);
  expect_round_trip(c);
}

// Qwen3: Llama's shape with a head size of its own (head_dim, 128 by default) and an RMSNorm over
// each head's queries and keys; from Qwen3-0.6B's config.json; head_dim on the other Llama-shaped
// families (Mistral-Nemo's 128 over 5120 / 32), written only where d_model / n_heads is not it.
TEST_F(FamilyConfigTest, Qwen3HeadDimAndPerHeadNorms) {
  TrainConfig c = load_model("  {name: qwen3, n_layers: 2, n_heads: 4, n_kv_heads: 2, d_model: 64}\n");
  EXPECT_EQ(c.model.name, ModelFamily::kQwen3);
  EXPECT_EQ(c.model.qk_norm, QkNorm::kPerHead);
  EXPECT_EQ(c.model.head_size(), 128);
  EXPECT_EQ(c.model.q_width(), 512);
  EXPECT_FALSE(c.model.qkv_bias || c.model.linear_bias);
  EXPECT_FLOAT_EQ(c.model.norm_eps, 1e-6f);
  expect_round_trip(c);
  c = load_model("  {name: qwen3, n_layers: 2, n_heads: 4, d_model: 512, head_dim: 128, "
                 "peft_config: {target_modules: [o_proj]}}\n");
  EXPECT_EQ(c.model.head_dim, 0);  // d_model / n_heads: kept as the derived size
  expect_round_trip(c);
  c = load_model("  {name: qwen3, n_layers: 2, n_heads: 4, d_model: 64, head_dim: 32, "
                 "peft_config: {target_modules: [o_proj]}}\n");
  ASSERT_EQ(lora_targets(c.model).size(), 1u);
  EXPECT_EQ(lora_targets(c.model)[0].in, 128);  // o_proj reads the 4 heads of 32
  c = load_model("  {name: mistral, n_layers: 2, n_heads: 32, n_kv_heads: 8, d_model: 5120, head_dim: 128}\n");
  EXPECT_EQ(c.model.q_width(), 4096);
  expect_round_trip(c);
  EXPECT_EQ(load_model("  {name: llama, n_layers: 2, n_heads: 4, d_model: 64}\n").model.qk_norm, QkNorm::kNone);
  EXPECT_NE(model_error("  {name: qwen3, n_layers: 2, n_heads: 4, d_model: 64, head_dim: 15}\n")
                .find("model.head_dim = 15 is odd; RoPE rotates pairs of dimensions"), std::string::npos);
  EXPECT_NE(model_error("  {name: qwen3, n_layers: 2, n_heads: 4, d_model: 64, head_dim: -2}\n")
                .find("model.head_dim = -2 must be a positive number of channels"), std::string::npos);

  const auto dir = std::filesystem::temp_directory_path() / ("anvil_qwen3_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"architectures": ["Qwen3ForCausalLM"], "attention_bias": false,
    "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072, "max_position_embeddings": 40960,
    "max_window_layers": 28, "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
    "sliding_window": null, "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";
  c = load_model("  {name: hf_causal_lm, pretrained: false, pretrained_model_name_or_path: " + dir.string() + "}\n");
  EXPECT_EQ(c.model.name, ModelFamily::kQwen3);
  EXPECT_EQ(c.model.head_size(), 128);
  EXPECT_EQ(c.model.q_width(), 2048);
  EXPECT_EQ(c.model.kv_heads(), 8);
  EXPECT_TRUE(c.model.tied_embeddings);
  EXPECT_EQ(c.model.qk_norm, QkNorm::kPerHead);
  std::filesystem::remove_all(dir);
}

// Llama 3.1's rope_scaling (rope_type llama3) in the model section and from config.json as
// transformers 4 (rope_scaling, or its older `type`) and 5 (rope_parameters, rope_theta inside)
// write it; linear scaling; what rope_config_validation refuses is refused, naming the key.
TEST_F(FamilyConfigTest, LlamaRopeScaling) {
  TrainConfig c = load_model("  {name: llama, n_layers: 2, n_heads: 8, d_model: 64, rope_theta: 500000, rope_scaling: "
                             "{rope_type: llama3, factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, "
                             "original_max_position_embeddings: 8192}}\n");
  const RopeFrequencies llama31{5e5f, RopeScalingKind::kLlama3, 8.0f, 1.0f, 4.0f, 8192};
  EXPECT_EQ(c.model.rope, llama31);
  expect_round_trip(c);
  c = load_model("  {name: qwen2, n_layers: 2, n_heads: 8, d_model: 64, rope_scaling: {type: linear, factor: 4}}\n");
  EXPECT_EQ(c.model.rope, (RopeFrequencies{1e4f, RopeScalingKind::kLinear, 4.0f}));
  expect_round_trip(c);
  const std::string llama = "  {name: llama, n_layers: 2, n_heads: 8, d_model: 64, rope_scaling: ";
  EXPECT_NE(model_error(llama + "{rope_type: dynamic, factor: 2}}\n")
                .find("model.rope_scaling.rope_type 'dynamic' is not valid: expected default, linear or llama3"),
            std::string::npos);
  EXPECT_NE(model_error(llama + "{rope_type: llama3, factor: 8, low_freq_factor: 1, high_freq_factor: 4}}\n")
                .find("model.rope_scaling.original_max_position_embeddings is missing (rope_type llama3 needs it)"),
            std::string::npos);
  EXPECT_NE(model_error(llama + "{rope_type: llama3, factor: 8, low_freq_factor: 4, high_freq_factor: 1, "
                                "original_max_position_embeddings: 8192}}\n")
                .find("model.rope_scaling.high_freq_factor = 1 must be above model.rope_scaling.low_freq_factor = 4"),
            std::string::npos);
  EXPECT_NE(model_error(llama + "{rope_type: linear}}\n").find("model.rope_scaling.factor is missing"), std::string::npos);
  EXPECT_NE(model_error(llama + "{rope_type: linear, factor: 2, attention_factor: 1}}\n")
                .find("unknown key 'model.rope_scaling.attention_factor'"), std::string::npos);
  EXPECT_NE(model_error("  {name: mistral, n_layers: 2, n_heads: 8, d_model: 64, rope_scaling: {rope_type: linear, "
                        "factor: 2}}\n").find("unknown key 'model.rope_scaling'"), std::string::npos);

  // Llama-3.1-8B's config.json, in transformers 4's layout and in 5's.
  const auto dir = std::filesystem::temp_directory_path() / ("anvil_llama31_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string section = "  {name: hf_causal_lm, pretrained: false, pretrained_model_name_or_path: " + dir.string();
  const std::string shape = R"({"architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
      "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
      "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": false,
      "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
      "pretraining_tp": 1, "rms_norm_eps": 1e-05, "tie_word_embeddings": false, "use_cache": true,
      "vocab_size": 128256, )";
  const std::string scaling = R"("factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192, "rope_type": "llama3")";
  for (const std::string& rope :
       {R"("rope_theta": 500000.0, "torch_dtype": "bfloat16", "rope_scaling": {)" + scaling + "}}",
        R"("dtype": "bfloat16", "rope_parameters": {"rope_theta": 500000.0, )" + scaling + "}}"}) {
    std::ofstream(dir / "config.json") << shape << rope;
    c = load_model(section + "}\n");
    EXPECT_EQ(c.model.rope, llama31) << rope;
    EXPECT_EQ(c.model.max_seq_len, 131072);
  }
  // hf-llama-3.1-8B.yaml's earlier config_overrides: {torch_dtype: bfloat16}, said in the run log.
  std::ofstream(dir / "config.json") << shape << R"("rope_theta": 500000.0, "torch_dtype": "bfloat16"})";
  c = load_model(section + ", config_overrides: {torch_dtype: bfloat16}}\n");
  ASSERT_EQ(c.config_notes.size(), 1u);
  EXPECT_NE(c.config_notes[0].find("model.config_overrides.torch_dtype = \"bfloat16\": anvil keeps fp32 master "
                                   "weights"), std::string::npos) << c.config_notes[0];
  std::ofstream(dir / "config.json") << shape << R"("rope_scaling": {"rope_type": "yarn", "factor": 4.0}})";
  EXPECT_NE(model_error(section + "}\n").find("config.json (field 'rope_scaling'): model.rope_scaling.rope_type 'yarn' "
                                               "is not valid"), std::string::npos) << model_error(section + "}\n");
  std::filesystem::remove_all(dir);
}

// Mistral: Llama's shape and keys, and its sliding window, kept through the config and from a
// transformers config.json (v0.1's window of 4096, v0.3's null).
TEST_F(FamilyConfigTest, MistralIsLlamaShapedWithASlidingWindow) {
  TrainConfig c = load_model("  {name: mistral, n_layers: 2, n_heads: 8, n_kv_heads: 2, d_model: 64, "
                             "sliding_window: 4096}\n");
  EXPECT_EQ(c.model.name, ModelFamily::kMistral);
  EXPECT_EQ(c.model.norm, NormKind::kRmsNorm);
  EXPECT_EQ(c.model.positions, PositionKind::kRope);
  EXPECT_EQ(c.model.mlp, MlpKind::kSwiglu);
  EXPECT_EQ(c.model.kv_heads(), 2);
  EXPECT_EQ(c.model.sliding_window, 4096);
  expect_round_trip(c);
  std::vector<std::string> targets;
  for (const LoraModule& m : lora_modules(c.model)) targets.push_back(m.name);
  EXPECT_EQ(targets.front(), "self_attn.q_proj");
  EXPECT_EQ(family(ModelFamily::kMistral).lora_default_targets, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_NE(model_error("  {name: mistral, n_layers: 2, n_heads: 8, d_model: 64, sliding_window: -1}\n")
                .find("model.sliding_window = -1 must be a positive number of keys"), std::string::npos);
  EXPECT_NE(model_error("  {name: llama, n_layers: 2, n_heads: 8, d_model: 64, sliding_window: 8}\n")
                .find("unknown key 'model.sliding_window'"), std::string::npos);

  const auto dir = std::filesystem::temp_directory_path() / ("anvil_mistral_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string section = "  {name: hf_causal_lm, pretrained: false, pretrained_model_name_or_path: " + dir.string();
  for (const char* window : {"4096", "null"}) {
    std::ofstream(dir / "config.json") << R"({"architectures": ["MistralForCausalLM"], "model_type": "mistral",
      "hidden_size": 64, "intermediate_size": 224, "num_hidden_layers": 2, "num_attention_heads": 8,
      "num_key_value_heads": 2, "head_dim": 8, "hidden_act": "silu", "max_position_embeddings": 32768,
      "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": )" << window << R"(,
      "tie_word_embeddings": false, "vocab_size": 32768, "bos_token_id": 1, "eos_token_id": 2})";
    c = load_model(section + "}\n");
    EXPECT_EQ(c.model.name, ModelFamily::kMistral);
    EXPECT_EQ(c.model.sliding_window, std::string(window) == "null" ? 0 : 4096);
    EXPECT_EQ(c.model.max_seq_len, 32768);
    EXPECT_FLOAT_EQ(c.model.rope.theta, 1e6f);
    EXPECT_EQ(c.model.vocab_size, 32768);
  }
  std::filesystem::remove_all(dir);
}

// Mixtral: Mistral's shape with mixtures of SwiGLU experts (MixtralConfig's 8, top 2, weights
// renormalised, dropless, no router loss); from a config.json shaped as Mixtral-8x7B-v0.1's; what
// anvil cannot honour (transformers' router loss, jitter, all-linear over the experts' layers) is
// an error.
TEST_F(FamilyConfigTest, MixtralIsMistralWithExperts) {
  TrainConfig c = load_model("  {name: mixtral, n_layers: 2, n_heads: 8, n_kv_heads: 2, d_model: 64, "
                             "intermediate_size: 96, num_experts_per_tok: 1}\n");
  EXPECT_EQ(c.model.name, ModelFamily::kMixtral);
  EXPECT_EQ(c.model.mlp, MlpKind::kSwiglu);
  EXPECT_EQ(c.model.moe, (MoeConfig{8, 1, 0.0f, 1.0f, 0.0f}));
  EXPECT_FLOAT_EQ(c.model.rope.theta, 1e6f);
  expect_round_trip(c);
  const std::string mixtral = "  {name: mixtral, n_layers: 2, n_heads: 8, d_model: 64, ";
  EXPECT_NE(model_error(mixtral + "output_router_logits: true}\n").find("output_router_logits = true is not supported"),
            std::string::npos);
  EXPECT_NE(model_error(mixtral + "router_jitter_noise: 0.01}\n").find("router_jitter_noise"), std::string::npos);
  EXPECT_NE(model_error(mixtral + "num_experts_per_tok: 9}\n").find("must be between 1 and num_local_experts (8)"),
            std::string::npos);
  EXPECT_NE(model_error(mixtral + "peft_config: {peft_type: LORA, target_modules: all-linear}}\n")
                .find("would adapt the experts' w1, w3 and w2 too"), std::string::npos);
  EXPECT_NE(model_error(mixtral + "peft_config: {peft_type: LORA, target_modules: [w1]}}\n")
                .find("'w1' names no module"), std::string::npos);
  c = load_model(mixtral + "peft_config: {peft_type: LORA, target_modules: [q_proj, v_proj, gate]}}\n");
  std::vector<std::string> adapted;
  for (const LoraModule& m : lora_targets(c.model)) adapted.push_back(m.name);
  EXPECT_EQ(adapted, (std::vector<std::string>{"self_attn.q_proj", "self_attn.v_proj", "block_sparse_moe.gate"}));

  const auto dir = std::filesystem::temp_directory_path() / ("anvil_mixtral_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
    "hidden_size": 64, "intermediate_size": 224, "num_hidden_layers": 2, "num_attention_heads": 8,
    "num_key_value_heads": 2, "hidden_act": "silu", "max_position_embeddings": 32768, "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0, "sliding_window": null, "num_local_experts": 8, "num_experts_per_tok": 2,
    "output_router_logits": false, "router_aux_loss_coef": 0.02, "tie_word_embeddings": false,
    "vocab_size": 32000, "bos_token_id": 1, "eos_token_id": 2})";
  c = load_model("  {name: hf_causal_lm, pretrained: false, pretrained_model_name_or_path: " + dir.string() + "}\n");
  EXPECT_EQ(c.model.name, ModelFamily::kMixtral);
  EXPECT_EQ(c.model.moe, (MoeConfig{8, 2, 0.0f, 1.0f, 0.0f}));
  EXPECT_EQ(c.model.mlp_width(), 224);
  EXPECT_EQ(c.model.sliding_window, 0);
  std::filesystem::remove_all(dir);
}

// Qwen3-MoE: Qwen3's attention with mixtures of SwiGLU experts of moe_intermediate_size
// (Qwen3MoeConfig's 128, top 8, the chosen probabilities as weights unless norm_topk_prob); from a
// config.json shaped as Qwen3-30B-A3B's, its dense intermediate_size read and unused; dense layers
// and transformers' router loss are errors.
TEST_F(FamilyConfigTest, Qwen3MoeIsQwen3WithExperts) {
  TrainConfig c = load_model("  {name: qwen3_moe, n_layers: 2, n_heads: 8, n_kv_heads: 2, d_model: 64, head_dim: 16, "
                             "moe_intermediate_size: 32, num_experts: 4, num_experts_per_tok: 2}\n");
  EXPECT_EQ(c.model.name, ModelFamily::kQwen3Moe);
  EXPECT_EQ(c.model.qk_norm, QkNorm::kPerHead);
  EXPECT_EQ(c.model.vocab_size, 151936);
  EXPECT_EQ(c.model.mlp_width(), 32);
  EXPECT_EQ(c.model.moe, (MoeConfig{4, 2, 0.0f, 0.0f, 0.0f}));
  expect_round_trip(c);
  c = load_model("  {name: qwen3_moe, n_layers: 2, n_heads: 8, d_model: 64, norm_topk_prob: true}\n");
  EXPECT_EQ(c.model.moe, (MoeConfig{128, 8, 0.0f, 1.0f, 0.0f}));
  EXPECT_EQ(c.model.mlp_width(), 768);
  expect_round_trip(c);
  const std::string qwen = "  {name: qwen3_moe, n_layers: 2, n_heads: 8, d_model: 64, ";
  EXPECT_NE(model_error(qwen + "mlp_only_layers: [1]}\n").find("mlp_only_layers is not supported"), std::string::npos);
  EXPECT_NE(model_error(qwen + "decoder_sparse_step: 2}\n").find("decoder_sparse_step = 2 is not supported"),
            std::string::npos);
  EXPECT_NE(model_error(qwen + "output_router_logits: true}\n").find("output_router_logits = true is not supported"),
            std::string::npos);
  EXPECT_NE(model_error(qwen + "peft_config: {peft_type: LORA, target_modules: all-linear}}\n")
                .find("the experts' gate_proj, up_proj and down_proj"), std::string::npos);
  c = load_model(qwen + "peft_config: {peft_type: LORA, target_modules: [q_proj, gate]}}\n");
  std::vector<std::string> adapted;
  for (const LoraModule& m : lora_targets(c.model)) adapted.push_back(m.name);
  EXPECT_EQ(adapted, (std::vector<std::string>{"self_attn.q_proj", "mlp.gate"}));

  const auto dir = std::filesystem::temp_directory_path() / ("anvil_qwen3_moe_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 151643, "decoder_sparse_step": 1,
    "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
    "moe_intermediate_size": 768, "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": false,
    "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
    "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
    "use_sliding_window": false, "vocab_size": 151936})";
  c = load_model("  {name: hf_causal_lm, pretrained: false, pretrained_model_name_or_path: " + dir.string() + "}\n");
  EXPECT_EQ(c.model.name, ModelFamily::kQwen3Moe);
  EXPECT_EQ(c.model.moe, (MoeConfig{128, 8, 0.0f, 1.0f, 0.0f}));
  EXPECT_EQ(c.model.mlp_width(), 768);
  EXPECT_EQ(c.model.head_size(), 128);
  std::filesystem::remove_all(dir);
}

// Qwen2: Llama's shape and keys with biases on q, k and v; from a config.json shaped as
// Qwen2.5-0.5B's (its sliding_window unused: use_sliding_window false).
TEST_F(FamilyConfigTest, Qwen2IsLlamaShapedWithQkvBiases) {
  TrainConfig c = load_model("  {name: qwen2, n_layers: 2, n_heads: 8, n_kv_heads: 2, d_model: 64}\n");
  EXPECT_EQ(c.model.name, ModelFamily::kQwen2);
  EXPECT_EQ(c.model.vocab_size, 151936);
  EXPECT_TRUE(c.model.qkv_bias);
  EXPECT_FALSE(c.model.linear_bias);
  EXPECT_EQ(c.model.norm, NormKind::kRmsNorm);
  EXPECT_EQ(c.model.positions, PositionKind::kRope);
  expect_round_trip(c);
  EXPECT_FALSE(load_model("  {name: llama, n_layers: 2, n_heads: 8, d_model: 64}\n").model.qkv_bias);

  const auto dir = std::filesystem::temp_directory_path() / ("anvil_qwen2_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string section = "  {name: hf_causal_lm, pretrained: false, pretrained_model_name_or_path: " + dir.string();
  for (const char* window : {"false", "true"}) {
    std::ofstream(dir / "config.json") << R"({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
      "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu",
      "hidden_size": 896, "initializer_range": 0.02, "intermediate_size": 4864, "max_position_embeddings": 32768,
      "max_window_layers": 24, "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
      "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true,
      "torch_dtype": "bfloat16", "use_cache": true, "use_sliding_window": )" << window << R"(, "vocab_size": 151936})";
    if (std::string(window) == "true") {
      EXPECT_NE(model_error(section + "}\n").find("field 'use_sliding_window' = true cannot be honoured"),
                std::string::npos);
      continue;
    }
    c = load_model(section + "}\n");
    EXPECT_EQ(c.model.name, ModelFamily::kQwen2);
    EXPECT_TRUE(c.model.qkv_bias && c.model.tied_embeddings);
    EXPECT_EQ(c.model.kv_heads(), 2);
    EXPECT_EQ(c.model.mlp_width(), 4864);
    EXPECT_FLOAT_EQ(c.model.rope.theta, 1e6f);
    EXPECT_FLOAT_EQ(c.model.norm_eps, 1e-6f);
    EXPECT_EQ(c.model.sliding_window, 0);
  }
  std::filesystem::remove_all(dir);
}

// model.peft_config (PEFT's LoraConfig) on each family: PEFT's defaults and module names, and a
// one-line error for each value anvil cannot honour.
TEST_F(FamilyConfigTest, LoraPeftConfig) {
  TrainConfig g = load_model("  {name: gpt2, n_layers: 2, n_heads: 4, d_model: 32, peft_config: {peft_type: LORA}}\n");
  EXPECT_EQ(g.model.lora.r, 8);  // PEFT's defaults: r 8, alpha 8, no dropout, GPT-2's c_attn
  EXPECT_FLOAT_EQ(g.model.lora.scaling(), 1.0f);
  ASSERT_EQ(lora_targets(g.model).size(), 1u);
  EXPECT_EQ(lora_targets(g.model)[0].name, "attn.c_attn");
  expect_round_trip(g);
  // c_proj names attention's and the MLP's output projections; a dotted name just one.
  g = load_model("  {name: gpt2, n_layers: 2, n_heads: 4, d_model: 32, peft_config: {r: 4, lora_alpha: 16, "
                 "use_rslora: true, target_modules: [c_proj]}}\n");
  EXPECT_FLOAT_EQ(g.model.lora.scaling(), 8.0f);  // alpha / sqrt(r)
  EXPECT_EQ(lora_targets(g.model).size(), 2u);
  g = load_model("  {name: gpt2, n_layers: 2, n_heads: 4, d_model: 32, peft_config: {target_modules: [mlp.c_proj]}}\n");
  ASSERT_EQ(lora_targets(g.model).size(), 1u);
  EXPECT_EQ(lora_targets(g.model)[0].product, BlockProduct::kFcProj);
  // Llama's q/k/v are rows of the fused product; its default targets are q_proj and v_proj.
  TrainConfig l = load_model("  {name: llama, n_layers: 2, n_heads: 8, n_kv_heads: 2, d_model: 64, "
                             "peft_config: {r: 2}}\n");
  const std::vector<LoraModule> qv = lora_targets(l.model);
  ASSERT_EQ(qv.size(), 2u);
  EXPECT_EQ(qv[0].row0, 0);
  EXPECT_EQ(qv[0].rows, 64);
  EXPECT_EQ(qv[1].row0, 64 + 16);  // after q (8 heads) and k (2 heads of 8)
  EXPECT_EQ(qv[1].rows, 16);
  TrainConfig m = load_model("  {name: mpt_causal_lm, n_layers: 2, n_heads: 4, d_model: 32, "
                             "peft_config: {target_modules: all-linear}}\n");
  EXPECT_EQ(lora_targets(m.model).size(), 4u);
  expect_round_trip(m);

  const std::string gpt2 = "  {name: gpt2, n_layers: 2, n_heads: 4, d_model: 32, peft_config: ";
  auto expect = [&](const std::string& peft, const std::string& part) {
    const std::string e = model_error(gpt2 + peft + "}\n");
    EXPECT_NE(e.find(part), std::string::npos) << e;
  };
  expect("{r: 0}", "model.peft_config.r = 0 must be a positive rank");
  expect("{r: -4}", "model.peft_config.r = -4 must be a positive rank");
  expect("{target_modules: [c_attn, q_proj]}", "'q_proj' names no module of a GPT-2 block; its modules are attn.c_attn, "
         "attn.c_proj, mlp.c_fc, mlp.c_proj");
  expect("{target_modules: '.*attn.*'}", "a regular expression is not supported");
  expect("{peft_type: PREFIX_TUNING}", "anvil fine-tunes with LORA");
  expect("{lora_dropout: 1.0}", "must be in [0, 1)");
  expect("{bias: all}", "model.peft_config.bias = 'all' is not supported");
  expect("{use_dora: true}", "model.peft_config.use_dora = true is not supported");
  expect("{modules_to_save: [lm_head]}", "model.peft_config.modules_to_save is not supported");
  expect("{rank: 8}", "unknown key 'model.peft_config.rank'");
}

TEST_F(FamilyConfigTest, DropoutKeysOfEveryFamily) {
  TrainConfig g = load_model("  {name: gpt2, n_layers: 2, n_heads: 4, d_model: 32, embd_pdrop: 0.1, attn_pdrop: 0.2, "
                             "resid_pdrop: 0.3}\n");
  EXPECT_FLOAT_EQ(g.model.emb_pdrop, 0.1f);
  EXPECT_FLOAT_EQ(g.model.attn_pdrop, 0.2f);
  EXPECT_FLOAT_EQ(g.model.resid_pdrop, 0.3f);
  expect_round_trip(g);
  TrainConfig m = load_model("  {name: mpt_causal_lm, n_layers: 2, n_heads: 4, d_model: 32, emb_pdrop: 0.1, "
                             "resid_pdrop: 0.3, attn_config: {attn_pdrop: 0.2}}\n");
  EXPECT_FLOAT_EQ(m.model.emb_pdrop, 0.1f);
  EXPECT_FLOAT_EQ(m.model.attn_pdrop, 0.2f);
  EXPECT_FLOAT_EQ(m.model.resid_pdrop, 0.3f);
  expect_round_trip(m);
  TrainConfig l = load_model("  {name: llama, n_layers: 2, n_heads: 4, d_model: 32, attention_dropout: 0.2}\n");
  EXPECT_FLOAT_EQ(l.model.attn_pdrop, 0.2f);
  EXPECT_EQ(l.model.emb_pdrop + l.model.resid_pdrop, 0.0f);
  expect_round_trip(l);
  EXPECT_NE(model_error("  {name: llama, n_layers: 2, n_heads: 4, d_model: 32, resid_pdrop: 0.1}\n")
                .find("unknown key 'model.resid_pdrop'"),
            std::string::npos);
}

TEST_F(FamilyConfigTest, WhatCannotBeHonouredIsAnError) {
  const std::string base = "  name: mpt_causal_lm\n  n_layers: 2\n  n_heads: 4\n  d_model: 32\n";
  EXPECT_NE(model_error("  {n_layers: 2, n_heads: 4, d_model: 32, rope_theta: 10000}\n").find("unknown key 'model.rope_theta'"),
            std::string::npos);
  EXPECT_NE(model_error(base + "  attn_config: {attn_pdrop: 1.0}\n").find("model.attn_config.attn_pdrop = 1 must be in [0, 1)"),
            std::string::npos);
  EXPECT_NE(model_error(base + "  resid_pdrop: -0.1\n").find("model.resid_pdrop = -0.1 must be in [0, 1)"),
            std::string::npos);
  EXPECT_NE(model_error(base + "  attn_config: {alibi: true, rope: true}\n").find("cannot both be true"),
            std::string::npos);
  EXPECT_NE(model_error(base + "  learned_pos_emb: true\n  attn_config: {alibi: true}\n").find("ALiBi"),
            std::string::npos);
  EXPECT_NE(model_error(base + "  ffn_config: {ffn_type: mptglu}\n").find("SwiGLU"), std::string::npos);
  EXPECT_NE(model_error(base + "  attn_config: {qk_gn: true}\n").find("qk_gn"), std::string::npos);
  // A size error names the key as the family spells it.
  EXPECT_NE(model_error(base + "  attn_config: {attn_type: grouped_query_attention, kv_n_heads: 3}\n")
                .find("model.attn_config.kv_n_heads = 3 must be a positive divisor of model.n_heads = 4"),
            std::string::npos);
  EXPECT_NE(model_error("  {name: llama, n_layers: 2, n_heads: 4, d_model: 32, n_kv_heads: 3}\n")
                .find("model.n_kv_heads = 3 must be a positive divisor of model.n_heads = 4"),
            std::string::npos);
  EXPECT_NE(model_error(base + "  init_config: {name: baseline_}\n").find("init_config.name"), std::string::npos);
  EXPECT_NE(model_error(base + "  norm_eps: 1.0e-6\n").find("norm_eps"), std::string::npos);
  EXPECT_NE(model_error("  {name: llama, n_layers: 2, n_heads: 4, d_model: 32, no_bias: true}\n").find("unknown key 'model.no_bias'"),
            std::string::npos);
  EXPECT_NE(model_error("  {name: llama, n_layers: 2, n_heads: 4, d_model: 36}\n").find("odd head size (9); RoPE"),
            std::string::npos);
}

// LLM Foundry's hf_causal_lm: the model of a transformers directory's config.json (or a published
// GPT-2 size), config_overrides as Foundry applies them, and pretrained weights as a weights-only
// load of that directory.
TEST_F(FamilyConfigTest, FoundrysHfCausalLmSection) {
  const auto dir = std::filesystem::temp_directory_path() / ("anvil_hf_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "intermediate_size": 64, "vocab_size": 100, "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0, "tie_word_embeddings": false, "transformers_version": "4.44.0", "use_cache": true})";
  const std::string d = dir.string();
  const std::string section = "  name: hf_causal_lm\n  pretrained_model_name_or_path: " + d + "\n";

  TrainConfig c = load_model(section + "  pretrained: false\n  config_overrides: {num_hidden_layers: 3}\n"
                             "  trust_remote_code: true\n  use_flash_attention_2: true\n  init_device: meta\n");
  EXPECT_EQ(c.model.name, ModelFamily::kLlama);
  EXPECT_EQ(c.model.n_layers, 3);
  EXPECT_EQ(c.model.kv_heads(), 2);
  EXPECT_EQ(c.model.vocab_size, 100);
  EXPECT_FLOAT_EQ(c.model.norm_eps, 1e-6f);
  EXPECT_FALSE(c.model.tied_embeddings);
  EXPECT_TRUE(c.load_path.empty()) << "pretrained: false loads no weights";
  expect_round_trip(c);

  // pretrained (Foundry's default): the directory's weights, weights only; an explicit load_path wins.
  c = load_model(section);
  EXPECT_EQ(c.load_path, std::filesystem::absolute(dir).lexically_normal().string());
  EXPECT_TRUE(c.load_weights_only);
  TrainConfig own = load_train_config(write(R"(
max_seq_len: 64
train_loader: {dataset: {local: data/x}}
global_train_batch_size: 4
max_duration: 10ba
load_path: runs/other
model:
)" + section), {});
  EXPECT_EQ(own.load_path, "runs/other");
  EXPECT_FALSE(own.load_weights_only);

  // A published GPT-2 size: its architecture, dropout included.
  c = load_model("  {name: hf_causal_lm, pretrained_model_name_or_path: gpt2-medium, pretrained: false}\n");
  EXPECT_EQ(c.model.name, ModelFamily::kGpt2);
  EXPECT_EQ(c.model.n_layers, 24);
  EXPECT_EQ(c.model.n_heads, 16);
  EXPECT_EQ(c.model.d_model, 1024);
  EXPECT_EQ(c.model.max_seq_len, 1024);
  EXPECT_FLOAT_EQ(c.model.resid_pdrop, 0.1f);
  c = load_model("  {name: hf_causal_lm, pretrained_model_name_or_path: gpt2, pretrained: false,\n"
                 "   config_overrides: {n_layer: 2, n_embd: 64, n_head: 4, resid_pdrop: 0.0}}\n");
  EXPECT_EQ(c.model.n_layers, 2);
  EXPECT_EQ(c.model.d_model, 64);
  EXPECT_FLOAT_EQ(c.model.resid_pdrop, 0.0f);
  EXPECT_FLOAT_EQ(c.model.attn_pdrop, 0.1f);

  auto expect = [&](const std::string& yaml, const std::string& part) {
    const std::string e = model_error(yaml);
    EXPECT_NE(e.find(part), std::string::npos) << e;
  };
  expect("  {name: hf_causal_lm, pretrained_model_name_or_path: gpt2}\n", "which anvil does not download");
  expect("  {name: hf_causal_lm, pretrained_model_name_or_path: meta-llama/Llama-2-7b-hf}\n",
         "neither a local transformers model directory nor a published architecture");
  expect("  {name: hf_causal_lm}\n", "model.pretrained_model_name_or_path is required");
  expect(section + "  config_overrides: {hidden_sizes: 64}\n", "the config (" + d + "/config.json) has no field 'hidden_sizes'");
  expect(section + "  config_overrides: {rope_scaling: {type: dynamic, factor: 2.0}}\n",
         "(field 'rope_scaling'): model.rope_scaling.type 'dynamic' is not valid");
  // A size error names the config.json field the value came from.
  expect(section + "  config_overrides: {num_key_value_heads: 3}\n", d + "/config.json (field 'num_key_value_heads'): "
         "model.n_kv_heads = 3 must be a positive divisor of model.n_heads = 4");
  expect(section + "  config_overrides: {num_attention_heads: 0}\n", "(field 'num_attention_heads'): model.n_heads = 0 "
         "must be a positive integer");
  // LLM Foundry's LoRA section, as its published YAMLs spell it, on the directory's Llama.
  const TrainConfig lora = load_model(section + "  peft_config:\n    r: 64\n    peft_type: LORA\n"
                                      "    task_type: CAUSAL_LM\n    lora_alpha: 128\n    lora_dropout: 0.05\n"
                                      "    target_modules: [q_proj, k_proj, v_proj, o_proj]\n");
  EXPECT_EQ(lora.model.lora.r, 64);
  EXPECT_FLOAT_EQ(lora.model.lora.scaling(), 2.0f);
  EXPECT_FLOAT_EQ(lora.model.lora.dropout, 0.05f);
  EXPECT_EQ(lora_targets(lora.model).size(), 4u);
  expect_round_trip(lora);
  expect(section + "  pretrained_lora_id_or_path: someone/adapter\n", "model.pretrained_lora_id_or_path is not "
         "supported");
  expect(section + "  init_device: meta\n", "model.init_device = meta cannot hold pretrained weights");
  expect(section + "  load_in_8bit: true\n", "model.load_in_8bit = true is not supported");
  expect(section + "  n_layers: 2\n", "unknown key 'model.n_layers'");
  std::filesystem::remove_all(dir);
}

// docs/config.md's key tables are the schema's rows (config/train_schema.cpp): a key added,
// renamed, re-defaulted or re-documented in the one and not the other fails here.
// ANVIL_UPDATE_DOCS=1 bin/test_config --gtest_filter='ConfigDocs.*' rewrites the tables from the schema.
TEST(ConfigDocs, KeyTablesAreTheSchemas) {
  const char* source_dir = std::getenv("ANVIL_SOURCE_DIR");
  ASSERT_NE(source_dir, nullptr) << "ANVIL_SOURCE_DIR names the source tree (ctest sets it)";
  const std::filesystem::path path = std::filesystem::path(source_dir) / "docs" / "config.md";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const bool update = std::getenv("ANVIL_UPDATE_DOCS") != nullptr;
  for (const std::string& name : key_doc_table_names()) {
    const std::string begin = "<!-- keys: " + name + " (generated from src/config/train_schema.cpp; the tests check it) -->\n";
    const size_t from = text.find(begin);
    ASSERT_NE(from, std::string::npos) << "docs/config.md has no marker line: " << begin;
    const size_t start = from + begin.size();
    const size_t end = text.find("<!-- /keys -->", start);
    ASSERT_NE(end, std::string::npos) << "docs/config.md's '" << name << "' table has no end marker";
    const std::string expected = key_doc_table(name);
    if (update) {
      text.replace(start, end - start, expected);
    } else {
      EXPECT_EQ(text.substr(start, end - start), expected)
          << "docs/config.md's '" << name << "' key table is not the schema's; ANVIL_UPDATE_DOCS=1 "
          << "bin/test_config --gtest_filter='ConfigDocs.*' rewrites it";
    }
  }
  if (update) {
    const std::filesystem::path written = path.string() + ".new";
    std::ofstream(written) << text;
    std::filesystem::rename(written, path);
  }
}

// Every key of the schema is documented: a row of its own, or its section's rows.
TEST(ConfigDocs, EveryKeyHasARow) {
  const std::string main = key_doc_table("main");
  for (const char* key : {"`seed`", "`train_loader.dataset.shuffle_seed`", "`train_loader.dataset.streams.NAME.proportion`",
                          "`optimizer.betas`", "`scheduler.warmup_min_lr`, `warmup_max_lr`", "`loss_scaler.hysteresis`",
                          "`loggers.tensorboard.log_dir`", "`fsdp_config.sharding_strategy`", "`distributed.zero_stage`",
                          "`tokenizer.kwargs.model_max_length`", "`model.name`", "`eval_loader`"})
    EXPECT_NE(main.find("| " + std::string(key)), std::string::npos) << key << " has no row in:\n" << main;
  EXPECT_NE(key_doc_table("finetuning").find("| `packing_ratio` | 1 (off) |"), std::string::npos);
  for (const std::string& table : key_doc_table_names())
    EXPECT_EQ(key_doc_table(table).find("| `` |"), std::string::npos) << "a row with no key in " << table;
}

}  // namespace
}  // namespace anvil
