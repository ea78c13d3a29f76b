#include "config/deepspeed.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <optional>

#include "config/scheduler_config.h"
#include "core/error.h"

namespace anvil {
namespace {

bool is_auto(const YAML::Node& n) { return n && n.IsScalar() && n.Scalar() == "auto"; }

std::string text(const YAML::Node& n) {
  if (!n || n.IsNull()) return "(none)";
  if (n.IsScalar()) return n.Scalar();
  YAML::Emitter e;
  e << YAML::Flow << n;
  return e.c_str();
}

std::vector<std::string> split_key(const std::string& key) {
  std::vector<std::string> parts;
  for (size_t a = 0, b; a <= key.size(); a = b + 1) {
    b = std::min(key.find('.', a), key.size());
    parts.push_back(key.substr(a, b - a));
  }
  return parts;
}

// The ds_config's translated values, written over the config tree. A key the command line set
// (or one under a section it set) keeps the command line's value.
class Layer {
 public:
  Layer(YAML::Node root, std::map<std::string, std::string>& origins, std::string where)
      : root_(root), origins_(origins), where_(std::move(where)) {}

  YAML::Node get(const std::string& key) const {
    YAML::Node node = root_;
    for (const std::string& part : split_key(key)) {
      if (!node.IsMap() || !node[part]) return YAML::Node();
      node.reset(node[part]);
    }
    return node;
  }

  void set(const std::string& key, const YAML::Node& value, const std::string& from) {
    if (overridden(key)) {
      notes_.push_back(fmt::format("{} kept as the command line gives it (the ds_config's {} gives {})", key, from,
                                   text(value)));
      return;
    }
    const YAML::Node old = get(key);
    const std::string was = old && !old.IsNull() && text(old) != text(value) ? ", was " + text(old) : "";
    const std::vector<std::string> parts = split_key(key);
    YAML::Node node = root_;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      if (!node[parts[i]] || !node[parts[i]].IsMap()) node[parts[i]] = YAML::Node(YAML::NodeType::Map);
      node.reset(node[parts[i]]);
    }
    node[parts.back()] = YAML::Clone(value);
    origins_[key] = where_;
    notes_.push_back(fmt::format("{} = {} ({}{})", key, text(value), from, was));
  }
  template <typename T>
  void set_value(const std::string& key, const T& value, const std::string& from) {
    set(key, YAML::Node(value), from);
  }

  // DeepSpeed's default for a key neither the YAML nor the ds_config gives.
  template <typename T>
  void set_default(const std::string& key, const T& value) {
    const YAML::Node old = get(key);
    if (!old || old.IsNull()) set(key, YAML::Node(value), "DeepSpeed's default");
  }

  void remove(const std::string& key, const std::string& why) {
    const YAML::Node old = get(key);
    if (!old || old.IsNull() || overridden(key)) return;
    const std::vector<std::string> parts = split_key(key);
    YAML::Node parent = root_;
    for (size_t i = 0; i + 1 < parts.size(); ++i) parent.reset(parent[parts[i]]);
    parent.remove(parts.back());
    notes_.push_back(fmt::format("{} removed ({}; was {})", key, why, text(old)));
  }

  // Removes the keys of a section that the ds_config replaces as a whole.
  void clear_section(const std::string& section, const std::string& why) {
    const YAML::Node s = get(section);
    if (!s || !s.IsMap()) return;
    std::vector<std::string> keys;
    for (auto it = s.begin(); it != s.end(); ++it) keys.push_back(it->first.as<std::string>());
    for (const std::string& k : keys) remove(section + "." + k, why);
  }

  void note(std::string line) { notes_.push_back(std::move(line)); }
  const std::string& where() const { return where_; }
  std::vector<std::string> notes() const { return notes_; }

 private:
  // Set by the command line (the only origin recorded before the ds_config's).
  bool overridden(const std::string& key) const {
    for (size_t i = 0; i <= key.size(); ++i)
      if (i == key.size() || key[i] == '.')
        if (const auto it = origins_.find(key.substr(0, i)); it != origins_.end() && it->second != where_)
          return true;
    return false;
  }

  YAML::Node root_;
  std::map<std::string, std::string>& origins_;
  std::string where_;
  std::vector<std::string> notes_;
};

YAML::Node load_json(const std::string& path, const std::string& file) {
  ANVIL_CHECK(std::filesystem::is_regular_file(path), "{}: deepspeed_config file '{}' not found", file, path);
  try {
    return YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    ANVIL_FAIL("{}: malformed JSON at line {}, column {}: {}", path, e.mark.line + 1, e.mark.column + 1, e.msg);
  }
}

// A value of the ds_config, or nothing when it is absent or Hugging Face's "auto" (the rest of
// the configuration decides).
std::optional<YAML::Node> given(MapReader& r, const std::string& key) {
  if (!r.has(key)) return std::nullopt;
  const YAML::Node v = r.raw(key);
  if (is_auto(v)) return std::nullopt;
  return v;
}

template <typename T>
T as(MapReader& r, const std::string& key, const YAML::Node& v, const char* what) {
  try {
    return v.as<T>();
  } catch (const YAML::Exception&) {
    ANVIL_FAIL("{}: {} = {} is not {}", r.file(), r.full(key), text(v), what);
  }
}

// A DeepSpeed setting whose only value in anvil is `allowed`: another is an error saying why.
void require_value(MapReader& r, const Layer& out, const std::string& key, const std::string& allowed,
                   const char* why) {
  const auto v = given(r, key);
  ANVIL_CHECK(!v || text(*v) == allowed, "{}: {} {} is not supported: {}", out.where(), r.full(key), text(*v), why);
}

void read_batch(MapReader& ds, Layer& out) {
  // DeepSpeed's rule: train_batch_size = micro batch x accumulation steps x ranks; any two give
  // the third (checked when the number of ranks is known), one alone takes 1 accumulation step.
  const std::pair<const char*, const char*> keys[] = {
      {"train_batch_size", "global_train_batch_size"},
      {"train_micro_batch_size_per_gpu", "device_train_microbatch_size"},
      {"gradient_accumulation_steps", "gradient_accumulation_steps"}};
  bool defines = false;
  for (const auto& [ds_key, anvil_key] : keys) defines = defines || given(ds, ds_key).has_value();
  if (!defines) {
    for (const auto& [ds_key, anvil_key] : keys) ds.has(ds_key);
    return;
  }
  for (const auto& [ds_key, anvil_key] : keys) {
    if (const auto v = given(ds, ds_key)) {
      const int n = as<int>(ds, ds_key, *v, "an integer");
      ANVIL_CHECK(n > 0, "{}: {} must be positive, got {}", out.where(), ds.full(ds_key), n);
      out.set(anvil_key, *v, ds_key);
    } else if (!ds.has(ds_key)) {
      out.remove(anvil_key, "the ds_config's batch sizes give it");
    }
  }
}

void read_precision(MapReader& ds, Layer& out) {
  std::optional<bool> fp16, bf16;
  if (ds.has("fp16")) {
    MapReader f = ds.sub("fp16");
    if (const auto v = given(f, "enabled")) fp16 = as<bool>(f, "enabled", *v, "true or false");
    // "auto" leaves the precision to the YAML; the block's loss scaler applies if that is fp16.
    const YAML::Node precision = out.get("precision");
    const bool scaled = fp16.value_or(precision && precision.IsScalar() && precision.Scalar() == "amp_fp16");
    // DeepSpeed's fp16 block defines the loss scaler: what it leaves out takes DeepSpeed's defaults.
    if (const auto v = given(f, "loss_scale"))
      ANVIL_CHECK(as<double>(f, "loss_scale", *v, "a number") == 0, "{}: {} {} is a static loss scale, which anvil "
                  "does not have: give 0 (dynamic) and initial_scale_power", out.where(), f.full("loss_scale"),
                  text(*v));
    int power = 16;
    if (const auto v = given(f, "initial_scale_power")) power = as<int>(f, "initial_scale_power", *v, "an integer");
    ANVIL_CHECK(power >= 0 && power <= 60, "{}: {} {} must be in 0..60", out.where(), f.full("initial_scale_power"),
                power);
    if (scaled) out.set_value("loss_scaler.init_scale", std::ldexp(1.0, power), "fp16.initial_scale_power");
    const std::tuple<const char*, const char*, const char*> scaler[] = {
        {"loss_scale_window", "loss_scaler.growth_interval", "1000"},
        {"hysteresis", "loss_scaler.hysteresis", "2"},
        {"consecutive_hysteresis", "loss_scaler.consecutive_hysteresis", "false"},
        {"min_loss_scale", "loss_scaler.min_scale", "1"}};
    for (const auto& [ds_key, anvil_key, ds_default] : scaler) {
      const auto v = given(f, ds_key);
      if (scaled) out.set(anvil_key, v ? *v : YAML::Node(ds_default), std::string("fp16.") + ds_key);
    }
    // fp16 master weights and gradients: anvil keeps both in fp32, at least the precision asked.
    bool master16 = false;
    if (const auto v = given(f, "fp16_master_weights_and_grads"))
      master16 = as<bool>(f, "fp16_master_weights_and_grads", *v, "true or false");
    if (master16 && scaled)
      out.note("fp16.fp16_master_weights_and_grads: anvil keeps fp32 master weights and gradients");
    f.has("auto_cast");  // anvil's amp rounds every matrix product's operands, cast or not
    f.finish();
  }
  for (const char* name : {"bf16", "bfloat16"}) {
    if (!ds.has(name)) continue;
    MapReader b = ds.sub(name);
    if (const auto v = given(b, "enabled")) bf16 = bf16.value_or(false) || as<bool>(b, "enabled", *v, "true or false");
    b.has("immediate_grad_update");  // anvil accumulates gradients in fp32 in every precision
    b.has("check_grad_overflow");    // anvil skips steps under fp16 alone; a run whose loss turns non-finite stops
    // DeepSpeed's bf16 master weights (and gradients) and bf16 Adam moments: fp32 arithmetic, the
    // results rounded to nearest even. anvil's gradient stays its fp32 (or exact) sum.
    bool master = false, states = false;
    if (const auto v = given(b, "bf16_master_weights_and_grads"))
      master = as<bool>(b, "bf16_master_weights_and_grads", *v, "true or false");
    if (const auto v = given(b, "bf16_optimizer_states"))
      states = as<bool>(b, "bf16_optimizer_states", *v, "true or false");
    ANVIL_CHECK(!states || master, "{}: {}: true needs bf16_master_weights_and_grads: true, as DeepSpeed requires",
                out.where(), b.full("bf16_optimizer_states"));
    if (master) {
      const std::string from = std::string(name) + ".bf16_master_weights_and_grads";
      out.set_value("optimizer.master_weights_dtype", std::string("bf16"), from);
      out.note(from + ": the gradient stays anvil's fp32 sum (DeepSpeed rounds it to bf16)");
    }
    if (states)
      out.set_value("optimizer.states_dtype", std::string("bf16"), std::string(name) + ".bf16_optimizer_states");
    b.finish();
  }
  ANVIL_CHECK(!(fp16.value_or(false) && bf16.value_or(false)), "{}: deepspeed_config enables both fp16 and bf16: "
              "enable one", out.where());
  if (fp16.value_or(false)) out.set_value("precision", std::string("amp_fp16"), "fp16.enabled");
  else if (bf16.value_or(false)) out.set_value("precision", std::string("amp_bf16"), "bf16.enabled");
  else if (fp16 || bf16) out.set_value("precision", std::string("fp32"), "fp16 and bf16 disabled");
}

void read_zero(MapReader& ds, Layer& out) {
  if (!ds.has("zero_optimization")) return;
  MapReader z = ds.sub("zero_optimization");
  if (const auto v = given(z, "stage")) {
    const int stage = as<int>(z, "stage", *v, "an integer");
    ANVIL_CHECK(stage >= 0 && stage <= 3, "{}: {} {} must be 0, 1, 2 or 3", out.where(), z.full("stage"), stage);
    out.set("distributed.zero_stage", *v, "zero_optimization.stage");
    out.remove("fsdp_config.sharding_strategy", "the ds_config's zero_optimization.stage sets the sharding");
  }
  // Bucketing, overlap, prefetching and how the shards are grouped are anvil's own (a unit's
  // gradients reduce while the backward pass goes on, in every stage; the shards never change the
  // bits), so these tuning knobs have no effect. Both the stage3_ names and the plain ones.
  for (const char* k : {"contiguous_gradients", "overlap_comm", "reduce_scatter", "reduce_bucket_size",
                        "allgather_partitions", "allgather_bucket_size", "round_robin_gradients", "sub_group_size",
                        "elastic_checkpoint", "ignore_unused_parameters", "load_from_fp32_weights",
                        "use_multi_rank_bucket_allreduce", "memory_efficient_linear", "zero_hpz_partition_size",
                        "mics_shard_size", "mics_hierarchical_params_gather", "pipeline_loading_checkpoint",
                        "override_module_apply", "log_trace_cache_warnings", "enable_sanity_checks",
                        "save_muon_momentum_buffer_in_memory", "leaf_module", "cpu_offload_use_pin_memory",
                        "stage3_gather_fp16_weights_on_model_save"})
    z.has(k);
  for (const std::string k : {"prefetch_bucket_size", "param_persistence_threshold", "model_persistence_threshold",
                              "max_live_parameters", "max_reuse_distance", "gather_16bit_weights_on_model_save",
                              "module_granularity_threshold", "use_all_reduce_for_fetch_params",
                              "allgather_sequential"}) {
    z.has(k);
    z.has("stage3_" + k);
  }
  for (const char* k : {"zero_quantized_weights", "zero_quantized_nontrainable_weights", "zero_quantized_gradients"})
    require_value(z, out, k, "false", "anvil's ZeRO moves fp32 values");
  require_value(z, out, "legacy_stage1", "false", "DeepSpeed's engine refuses it too (its old stage-1 code is gone)");
  for (const char* k : {"zeropp_loco_param", "zenflow"})
    ANVIL_CHECK(!z.has(k), "{}: {} is not supported: anvil's ZeRO moves fp32 values and steps every parameter each "
                "step", out.where(), z.full(k));
  // ZeRO-Offload: where the optimizer states and the parameters live (distributed.offload_*).
  if (const auto v = given(z, "cpu_offload"); v && as<bool>(z, "cpu_offload", *v, "true or false"))
    out.set_value("distributed.offload_optimizer", std::string("cpu"), "zero_optimization.cpu_offload");
  if (const auto v = given(z, "cpu_offload_param"); v && as<bool>(z, "cpu_offload_param", *v, "true or false"))
    out.set_value("distributed.offload_param", std::string("cpu"), "zero_optimization.cpu_offload_param");
  for (const char* k : {"offload_optimizer", "offload_param"}) {
    if (!z.has(k)) continue;
    MapReader o = z.sub(k);
    std::string device = "none";
    o.get("device", device);
    ANVIL_CHECK(device == "none" || device == "cpu", "{}: {}.device '{}' is not supported: anvil offloads to `cpu` "
                "(ZeRO-Infinity's nvme is not built); give cpu or none", out.where(), z.full(k), device);
    // How DeepSpeed stages the copies (pinned buffers, NVMe's pipeline, its CPU Adam's cores): anvil's
    // own. Each section's own keys, as DeepSpeed's models accept them.
    for (const char* tuning : {"pin_memory", "buffer_count", "nvme_path"}) o.has(tuning);
    if (std::string(k) == "offload_param")
      for (const char* tuning : {"buffer_size", "max_in_cpu"}) o.has(tuning);
    else
      for (const char* tuning : {"ratio", "fast_init", "pipeline_read", "pipeline_write", "super_offload",
                                 "cpuadam_cores_perc"})
        o.has(tuning);
    o.finish();
    if (device == "cpu")
      out.set_value(std::string("distributed.") + k, device, std::string("zero_optimization.") + k + ".device");
  }
  z.finish();
}

void read_optimizer(MapReader& ds, Layer& out, UnknownKeys& ignored) {
  if (!ds.has("optimizer")) return;
  MapReader o = ds.sub("optimizer");
  std::string type;
  o.get("type", type);
  o.has("legacy_fusion");  // how DeepSpeed fuses its own Adam kernels
  std::string lower = type;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char ch) { return std::tolower(ch); });
  ANVIL_CHECK(lower == "adamw" || lower == "adam", "{}: deepspeed_config.optimizer type '{}' is not supported: "
              "anvil trains with Adam and AdamW", out.where(), type);
  MapReader p = o.sub("params");
  bool adam_w_mode = true, torch_adam = false, bias_correction = true, amsgrad = false;
  if (const auto v = given(p, "adam_w_mode")) adam_w_mode = as<bool>(p, "adam_w_mode", *v, "true or false");
  if (lower == "adamw") adam_w_mode = true;  // DeepSpeed's AdamW type is Adam with adam_w_mode
  if (const auto v = given(p, "torch_adam")) torch_adam = as<bool>(p, "torch_adam", *v, "true or false");
  if (const auto v = given(p, "bias_correction")) bias_correction = as<bool>(p, "bias_correction", *v, "true or false");
  if (const auto v = given(p, "amsgrad")) amsgrad = as<bool>(p, "amsgrad", *v, "true or false");
  ANVIL_CHECK(!amsgrad, "{}: {}: true is not supported", out.where(), p.full("amsgrad"));
  // The ds_config's optimizer is the whole optimizer: what it leaves out takes DeepSpeed's
  // defaults (FusedAdam's; torch.optim.AdamW's weight decay 0.01 under torch_adam).
  const double default_decay = torch_adam && adam_w_mode ? 0.01 : 0.0;
  double decay = default_decay;
  if (const auto v = given(p, "weight_decay")) decay = as<double>(p, "weight_decay", *v, "a number");
  ANVIL_CHECK(adam_w_mode || decay == 0 || is_auto(p.raw("weight_decay")), "{}: Adam with adam_w_mode false and "
              "weight_decay {} is Adam with L2 regularisation, which anvil does not have: use AdamW (adam_w_mode "
              "true), or weight_decay 0", out.where(), decay);
  out.set_value("optimizer.name", std::string("adamw"), "optimizer.type " + type);  // PyTorch's decay: p -= lr·wd·p
  out.set_value("optimizer.bias_correction", bias_correction,
                p.has("bias_correction") ? "optimizer.params.bias_correction" : "DeepSpeed's default");
  const std::tuple<const char*, YAML::Node> params[] = {
      {"lr", YAML::Node(0.001)},
      {"betas", YAML::Load("[0.9, 0.999]")},
      {"eps", YAML::Node(1e-8)},
      {"weight_decay", YAML::Node(default_decay)}};
  for (const auto& [key, ds_default] : params) {
    if (p.has(key) && is_auto(p.raw(key))) continue;  // the YAML's value
    const auto v = given(p, key);
    out.set(std::string("optimizer.") + key, v ? *v : ds_default,
            v ? std::string("optimizer.params.") + key : std::string("DeepSpeed's default"));
  }
  p.finish();  // DeepSpeed passes the params to the optimizer's constructor: an unknown one is an error there too
  o.finish(&ignored);
}

void read_scheduler(MapReader& ds, Layer& out, UnknownKeys& ignored) {
  if (!ds.has("scheduler")) {
    out.set_default("scheduler.name", std::string("constant"));  // DeepSpeed keeps the optimizer's rate
    return;
  }
  MapReader s = ds.sub("scheduler");
  std::string type;
  s.get("type", type);
  SchedulerKind kind{};
  ANVIL_CHECK(parse_choice(type, &kind) && !scheduler_params(kind).empty(), "{}: deepspeed_config.scheduler type "
              "'{}' is not supported: expected WarmupLR, WarmupDecayLR, WarmupCosineLR or OneCycle", out.where(), type);
  // Hugging Face's "auto" takes the YAML's values, read before the section is replaced.
  const YAML::Node lr = out.get("optimizer.lr");
  const YAML::Node warmup = YAML::Clone(out.get("scheduler.t_warmup"));
  out.clear_section("scheduler", "the ds_config's scheduler replaces it");
  out.set_value("scheduler.name", type, "scheduler.type");
  MapReader p = s.sub("params");
  for (const SchedulerParam& param : scheduler_params(kind)) {
    const std::string key = param.key;
    if (!p.has(key)) continue;
    YAML::Node v = p.raw(key);
    if (is_auto(v)) {
      if (key == "warmup_min_lr") v = YAML::Node(0.0);
      else if (key == "warmup_max_lr" && lr && !lr.IsNull()) v = lr;
      else if (key == "total_num_steps") v = YAML::Node(0);  // the run's length
      else if (key == "warmup_num_steps" && warmup && warmup.IsScalar() && warmup.Scalar().size() > 2 &&
               warmup.Scalar().substr(warmup.Scalar().size() - 2) == "ba")
        v = YAML::Node(warmup.Scalar().substr(0, warmup.Scalar().size() - 2));
      else
        ANVIL_FAIL("{}: {}: \"auto\" has nothing to take its value from (give a number{})", out.where(), p.full(key),
                   key == "warmup_num_steps" ? ", or scheduler.t_warmup in batches in the YAML" : "");
    }
    out.set("scheduler." + key, v, "scheduler.params." + key);
  }
  for (const char* momentum : {"cycle_min_mom", "cycle_max_mom", "decay_mom_rate"})
    if (kind == SchedulerKind::kOneCycle) p.has(momentum);  // used only when the momentum cycles, which anvil refuses
  p.finish();
  s.finish(&ignored);  // DeepSpeed reads type and params by hand; params go to the constructor
}

void read_monitors(MapReader& ds, Layer& out, UnknownKeys& ignored) {
  if (ds.has("tensorboard")) {
    MapReader t = ds.sub("tensorboard");
    bool enabled = false;
    t.get("enabled", enabled);
    std::string dir, job = "DeepSpeedJobName";
    t.get("output_path", dir);
    t.get("job_name", job);
    t.finish();
    if (enabled)
      out.set_value("loggers.tensorboard.log_dir",
                    dir.empty() ? std::string() : (std::filesystem::path(dir) / job).string(), "tensorboard");
  }
  for (const char* name : {"wandb", "csv_monitor", "comet"}) {
    if (!ds.has(name)) continue;
    MapReader m = ds.sub(name);
    bool enabled = false;
    m.get("enabled", enabled);
    for (const char* k : {"output_path", "job_name", "team", "group", "project", "workspace", "api_key",
                          "experiment_name", "experiment_key", "online", "mode", "samples_log_interval"})
      m.has(k);
    m.finish();
    ANVIL_CHECK(!enabled, "{}: deepspeed_config.{}.enabled: true is not supported: anvil writes metrics.jsonl, "
                "train.log and, with tensorboard.enabled, TensorBoard event files", out.where(), name);
  }
  if (ds.has("flops_profiler")) {
    MapReader f = ds.sub("flops_profiler");
    bool enabled = false;
    f.get("enabled", enabled);
    for (const char* k : {"recompute_fwd_factor", "profile_step", "module_depth", "top_modules", "detailed",
                          "output_file"})
      f.has(k);
    f.finish(&ignored);
    ANVIL_CHECK(!enabled, "{}: deepspeed_config.flops_profiler.enabled: true is not supported: anvil logs the "
                "model FLOPs and MFU of every step; `anvil bench train CONFIG --profile` times each op",
                out.where());
  }
}

void read_switches(MapReader& ds, Layer& out, UnknownKeys& ignored) {
  require_value(ds, out, "sparse_gradients", "false", "anvil's gradients are dense");
  require_value(ds, out, "communication_data_type", "fp32", "anvil reduces gradients in fp32 (or exactly, in fixed "
                "point)");
  if (ds.has("amp")) {
    MapReader a = ds.sub("amp");
    bool enabled = false;
    a.get("enabled", enabled);
    a.has("opt_level");
    a.finish();
    ANVIL_CHECK(!enabled, "{}: deepspeed_config.amp (NVIDIA Apex) is not supported: use bf16 or fp16", out.where());
  }
  if (ds.has("data_types")) {
    MapReader d = ds.sub("data_types");
    std::string accumulate = "fp32";
    d.get("grad_accum_dtype", accumulate);
    for (const char* k : {"param_dtype", "buffer_dtype"}) d.has(k);  // anvil's dtypes follow `precision`
    d.finish(&ignored);
    ANVIL_CHECK(accumulate == "fp32", "{}: deepspeed_config.data_types.grad_accum_dtype {} is not supported: anvil "
                "accumulates gradients in fp32", out.where(), accumulate);
  }
  if (ds.has("activation_checkpointing")) {
    // DeepSpeed's checkpointing API, which a model's own code calls (Megatron's); it turns nothing
    // on by itself. anvil's is activation_checkpointing: true.
    MapReader a = ds.sub("activation_checkpointing");
    for (const char* k : {"partition_activations", "contiguous_memory_optimization", "number_checkpoints",
                          "synchronize_checkpoint_boundary", "profile"})
      a.has(k);
    bool to_cpu = false;
    a.get("cpu_checkpointing", to_cpu);
    a.finish(&ignored);
    ANVIL_CHECK(!to_cpu, "{}: deepspeed_config.activation_checkpointing.cpu_checkpointing: true is not supported "
                "(activations stay where the model runs; activation_checkpointing: true saves their memory)",
                out.where());
  }
  // anvil logs its step timing always; averages gradients exactly wherever the division happens
  // (prescale_gradients, gradient_predivide_factor); trains with its own AdamW whatever ZeRO
  // stage (zero_allow_untested_optimizer, zero_force_ds_cpu_optimizer).
  for (const char* k : {"wall_clock_breakdown", "memory_breakdown", "dump_state", "prescale_gradients",
                        "gradient_predivide_factor", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer"})
    ds.has(k);
}

// The first `enabled: true` at or under node (its dotted path), or "".
std::string enabled_within(const YAML::Node& node, const std::string& path) {
  if (!node.IsMap()) return "";
  for (auto it = node.begin(); it != node.end(); ++it) {
    const std::string key = it->first.as<std::string>(), at = path + "." + key;
    if (key == "enabled" && it->second.IsScalar() && (it->second.Scalar() == "true" || it->second.Scalar() == "True"))
      return at;
    if (const std::string found = enabled_within(it->second, at); !found.empty()) return found;
  }
  return "";
}

// DeepSpeed's other keys. Published files often carry its features switched off, which anvil
// accepts; a feature switched on is an error naming it. What only tunes DeepSpeed's own machinery
// (its checkpoint writer, async I/O, log level, timers) means nothing here and is accepted.
void read_features_off(MapReader& ds, Layer& out) {
  const std::string where = out.where();
  // Sections that a feature's `enabled: true` (at any depth) turns on; off by default.
  const std::pair<const char*, const char*> switched[] = {
      {"comms_logger", "anvil's collectives are its own (train.log times the step)"},
      {"hybrid_engine", "anvil has no RLHF inference engine"},
      {"progressive_layer_drop", "anvil trains every layer on every step"},
      {"curriculum_learning", "anvil's sequences keep max_seq_len"},
      {"data_efficiency", "anvil's loaders follow LLM Foundry's and MosaicML streaming's order"},
      {"compression_training", "anvil trains unquantized, unpruned weights"},
      {"quantize_training", "anvil trains unquantized weights"},
      {"elasticity", "anvil's batch is global_train_batch_size on any number of ranks (the same bits)"},
      {"autotuning", "anvil chooses its microbatch itself: device_train_microbatch_size: auto"},
      {"nebula", "anvil writes its own checkpoints (save_folder)"},
      {"torch_autocast", "anvil's amp is `precision` (the ds_config's bf16 or fp16)"},
      {"expert_parallel", "anvil's expert parallelism is distributed.expert_parallel"}};
  for (const auto& [key, why] : switched) {
    if (!ds.has(key)) continue;
    const std::string on = enabled_within(ds.raw(key), ds.full(key));
    ANVIL_CHECK(on.empty(), "{}: {}: true is not supported: {}", where, on, why);
  }
  // Present means on.
  const std::pair<const char*, const char*> present[] = {
      {"sparse_attention", "anvil's attention is dense (flash attention on the CPU and GPU)"},
      {"pipeline", "DeepSpeed's pipeline engine settings; anvil's pipeline stages are distributed.pipeline_parallel"},
      {"weight_quantization", "anvil trains unquantized weights"},
      {"datastates_ckpt", "anvil writes its own checkpoints (save_folder)"}};
  for (const auto& [key, why] : present)
    ANVIL_CHECK(!ds.has(key) || text(ds.raw(key)) == "false", "{}: {} is not supported: {}", where, ds.full(key),
                why);
  // Values that only DeepSpeed's default leaves as anvil trains.
  require_value(ds, out, "managed_gradient_accumulation", "true", "anvil accumulates a step's microbatches itself");
  require_value(ds, out, "disable_allgather", "false", "anvil's ZeRO stages gather the parameters they shard");
  if (const auto v = given(ds, "gradient_allreduce_op")) {
    std::string op = text(*v);
    std::transform(op.begin(), op.end(), op.begin(), [](unsigned char ch) { return std::tolower(ch); });
    ANVIL_CHECK(op == "mean", "{}: {} {} is not supported: anvil averages gradients over the global batch", where,
                ds.full("gradient_allreduce_op"), text(*v));
  }
  require_value(ds, out, "graph_harvesting", "false", "anvil's GPU runs do not capture CUDA graphs yet");
  require_value(ds, out, "sequence_parallel_size", "1", "sequence parallelism is not built yet");
  if (ds.has("tensor_parallel")) {
    // DeepSpeed's AutoTP cuts the same products as anvil's tensor parallelism (0 and 1: none).
    const YAML::Node tp = ds.raw("tensor_parallel");
    const YAML::Node size = tp.IsMap() ? tp["autotp_size"] : YAML::Node();
    if (size && text(size) != "0") out.set("distributed.tensor_parallel", size, "tensor_parallel.autotp_size");
  }
  if (ds.has("compile")) {
    const YAML::Node c = ds.raw("compile");
    const YAML::Node deep = c.IsMap() ? c["deepcompile"] : YAML::Node();
    ANVIL_CHECK(!deep || text(deep) == "false", "{}: {}.deepcompile {} is not supported: anvil's kernels are "
                "compiled ahead", where, ds.full("compile"), text(deep));
  }
  // DeepSpeed's own machinery: its checkpoint files, NVMe I/O, logging and timers, the data-parallel
  // size it infers, its dataloader (anvil's drops a partial last batch always), the layout of MoE
  // parameter groups and sequence parallelism's all-to-all dtype.
  for (const char* k : {"checkpoint", "aio", "log_level", "timers", "vocabulary_size", "data_parallel_size",
                        "dataloader_drop_last", "use_data_before_expert_parallelism",
                        "seq_parallel_communication_data_type"})
    ds.has(k);
}

}  // namespace

std::vector<std::string> apply_deepspeed_config(YAML::Node root, const std::string& file,
                                                std::map<std::string, std::string>& origins, UnknownKeys* unknown) {
  const YAML::Node spec = root["deepspeed_config"];
  if (!spec || spec.IsNull()) return {};
  const YAML::Node ds_node = spec.IsScalar() ? load_json(spec.Scalar(), file) : YAML::Clone(spec);
  const std::string where = spec.IsScalar() ? spec.Scalar() : file;
  root.remove("deepspeed_config");
  MapReader ds(ds_node, "deepspeed_config", where, nullptr, unknown);
  Layer out(root, origins, where);
  read_batch(ds, out);
  if (const auto v = given(ds, "gradient_clipping"))
    out.set("algorithms.gradient_clipping.clipping_threshold", *v, "gradient_clipping");
  if (const auto v = given(ds, "steps_per_print")) {
    const int n = as<int>(ds, "steps_per_print", *v, "an integer");
    ANVIL_CHECK(n > 0, "{}: deepspeed_config.steps_per_print must be positive, got {}", where, n);
    out.set_value("console_log_interval", std::to_string(n) + "ba", "steps_per_print");
  }
  read_precision(ds, out);
  read_zero(ds, out);
  UnknownKeys ignored;  // keys DeepSpeed reads nowhere, where it ignores what it does not read
  read_optimizer(ds, out, ignored);
  read_scheduler(ds, out, ignored);
  read_monitors(ds, out, ignored);
  read_switches(ds, out, ignored);
  read_features_off(ds, out);
  ds.finish(&ignored);
  for (const UnknownKeys::Key& k : ignored.found())
    out.note(fmt::format("warning: {} is not a key DeepSpeed reads: ignored, as DeepSpeed ignores it{}", k.key,
                         k.nearest.empty() ? "" : " (did you mean " + k.nearest + "?)"));
  std::vector<std::string> notes = out.notes();
  for (std::string& n : notes) n = fmt::format("deepspeed_config {}: {}", where, n);
  return notes;
}

}  // namespace anvil
