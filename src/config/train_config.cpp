// YAML -> TrainConfig: overrides are applied to the YAML tree first, so a key=value is checked
// exactly like the same key written in the file. The keys themselves are the field tables of
// config/train_schema.cpp; this file reads them and checks what involves more than one key.
#include "config/train_config.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <filesystem>
#include <set>
#include <tuple>

#include "config/deepspeed.h"
#include "config/map_reader.h"
#include "config/train_schema.h"
#include "config/yaml_document.h"
#include "core/error.h"
#include "core/log.h"

namespace anvil {

namespace {
std::string save_folder_of(const TrainConfig& cfg) {
  std::string dir = cfg.save_folder;
  for (size_t at; (at = dir.find("{run_name}")) != std::string::npos;) dir.replace(at, 10, cfg.run_name);
  return dir;
}
}  // namespace

bool is_s3_folder(const std::string& folder) { return folder.rfind("s3://", 0) == 0; }

std::string checkpoints_dir(const TrainConfig& cfg) {
  if (cfg.save_folder.empty() || is_s3_folder(cfg.save_folder)) return cfg.run_dir + "/checkpoints";
  return save_folder_of(cfg);
}

std::string checkpoints_remote(const TrainConfig& cfg) {
  return is_s3_folder(cfg.save_folder) ? save_folder_of(cfg) : "";
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

// The checks that involve more than one key, once every key is read; resolves the sizes that
// default to others (the model's max_seq_len, the microbatch and eval batch). blame: where each
// key's value came from.
void check_values(TrainConfig& c, const MapReader& blame, const std::string& path, bool global_given) {
  if (c.model.max_seq_len == 0) c.model.max_seq_len = c.max_seq_len;  // the model section checked the rest
  ANVIL_CHECK(c.model.max_seq_len >= c.max_seq_len, "{}: model.max_seq_len ({}) must be at least max_seq_len ({})",
              blame.source("model.max_seq_len"), c.model.max_seq_len, c.max_seq_len);
  check_batch_sizes(c, blame, path, global_given);
  auto power_of_two = [](double x) {
    int e = 0;
    return x > 0 && std::frexp(x, &e) == 0.5;
  };
  const LossScalerConfig& ls = c.loss_scaler;
  ANVIL_CHECK(power_of_two(ls.init_scale) && ls.init_scale <= 0x1p60 && power_of_two(ls.min_scale) &&
                  ls.min_scale <= ls.init_scale,
              "{}: loss_scaler.init_scale ({}) and min_scale ({}) must be powers of two, min_scale <= init_scale "
              "<= 2^60", blame.source("loss_scaler.init_scale"), ls.init_scale, ls.min_scale);
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
  const int stages = c.distributed.pipeline_parallel;
  if (stages > 1) {
    const std::string where = blame.source("distributed.pipeline_parallel");
    ANVIL_CHECK(stages <= c.model.n_layers, "{}: distributed.pipeline_parallel {} cuts the blocks into stages, and the "
                "model has {}", where, stages, c.model.n_layers);
    ANVIL_CHECK(c.deterministic_mode, "{}: distributed.pipeline_parallel needs deterministic_mode: true (the stages "
                "agree on the gradient norm and the tied embedding's gradient through the fixed-point sums)", where);
    ANVIL_CHECK(c.distributed.zero_stage <= 1, "{}: distributed.pipeline_parallel works with distributed.zero_stage "
                "0 or 1 (ZeRO-2/3 over a stage's ranks is not built yet), not {}", where, c.distributed.zero_stage);
    ANVIL_CHECK(c.kernels != KernelImpl::kGpu, "{}: distributed.pipeline_parallel runs on the CPU (kernels=cpu) for "
                "now", where);
    ANVIL_CHECK(!c.model.has_lora(), "{}: distributed.pipeline_parallel does not split a LoRA model's adapters into "
                "stages", where);
  }
  const int tensor_ranks = c.distributed.tensor_parallel;
  if (tensor_ranks > 1) {
    const std::string where = blame.source("distributed.tensor_parallel");
    ANVIL_CHECK(c.deterministic_mode, "{}: distributed.tensor_parallel needs deterministic_mode: true (the ranks of a "
                "copy agree on the fixed-point gradient scales and the gradient norm)", where);
    ANVIL_CHECK(c.kernels == KernelImpl::kCpu, "{}: distributed.tensor_parallel chains the ranks' parts of a product "
                "through the CPU's k blocks: it runs with kernels=cpu for now", where);
    ANVIL_CHECK(c.distributed.expert_parallel == 1, "{}: distributed.tensor_parallel does not combine with "
                "distributed.expert_parallel yet", where);
  }
  const int expert_ranks = c.distributed.expert_parallel;
  if (expert_ranks > 1) {
    const std::string where = blame.source("distributed.expert_parallel");
    ANVIL_CHECK(c.model.has_moe(), "{}: distributed.expert_parallel {} shares a mixture of experts' experts among "
                "ranks, and this model's blocks have a dense MLP (ffn_config.ffn_type mb_moe or mb_dmoe makes them "
                "experts)", where, expert_ranks);
    ANVIL_CHECK(c.model.moe.experts % expert_ranks == 0, "{}: distributed.expert_parallel {} must divide the {} "
                "experts, which its ranks share evenly", where, expert_ranks, c.model.moe.experts);
    ANVIL_CHECK(c.kernels != KernelImpl::kGpu, "{}: distributed.expert_parallel exchanges rows through host memory: "
                "it runs on the CPU (kernels=cpu) for now", where);
    ANVIL_CHECK(c.deterministic_mode, "{}: distributed.expert_parallel needs deterministic_mode: true (the ranks "
                "holding different experts sum the rest of the gradient, and agree on its scales and norm, in fixed "
                "point)", where);
  }
  // ZeRO-Offload keeps the optimizer states (and the parameters) in host memory: where a CPU run
  // keeps them anyway.
  const std::tuple<const char*, OffloadDevice, const char*> offloads[] = {
      {"offload_optimizer", c.distributed.offload_optimizer, "the optimizer states in host memory and steps there"},
      {"offload_param", c.distributed.offload_param, "the parameters in host memory"}};
  for (const auto& [key, device, what] : offloads) {
    if (device == OffloadDevice::kNone) continue;
    const std::string field = std::string("distributed.") + key;
    ANVIL_CHECK(c.kernels != KernelImpl::kGpu, "{}: {} cpu under kernels=gpu is not supported yet (a GPU run keeps "
                "its optimizer states and parameters in GPU memory): give {} none, or train with kernels=cpu",
                blame.source(field), field, field);
    c.config_notes.push_back(fmt::format("{} cpu: honoured as it stands: a run with kernels={} keeps {}", field,
                                         choice_name(c.kernels), what));
  }
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
  try {
    c.config_notes = apply_deepspeed_config(root, path, origins, &unknown);
    MapReader top(root, "", path, keys_read, &unknown, &origins);
    for (const std::string& v : variables) top.raw(v);
    read_fields(top, train_config_fields(), c, TopContext{&pretrained_weights});
    top.finish();
  } catch (const Error& e) {
    unknown.raise(e.what());
    throw;
  }
  unknown.raise();
  // hf_causal_lm's pretrained weights are a weights-only load of its directory, unless load_path
  // names a checkpoint to start from instead (Composer loads load_path over the pretrained model).
  if (!pretrained_weights.empty() && c.load_path.empty()) {
    c.load_path = pretrained_weights;
    c.load_weights_only = true;
  }
  MapReader blame(root, "", path, nullptr, nullptr, &origins);
  check_values(c, blame, path, blame.has("global_train_batch_size"));
  if (c.run_dir.empty())
    c.run_dir = "runs/" + (c.run_name.empty() ? std::filesystem::path(path).stem().string() : c.run_name);
  if (c.run_name.empty()) c.run_name = std::filesystem::path(c.run_dir).filename().string();
  return c;
}

std::string to_yaml(const TrainConfig& c) {
  YAML::Emitter e;
  e << YAML::BeginMap;
  write_fields(e, train_config_fields(), c);
  e << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

}  // namespace anvil
