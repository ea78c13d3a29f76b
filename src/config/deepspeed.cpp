#include "config/deepspeed.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <vector>

#include "config/map_reader.h"
#include "core/error.h"

namespace anvil {
namespace {

// Writes one translated value at a dotted anvil key. A value already there (from the file or an
// override) must mean the same thing, or the two are an error naming both.
class Translator {
 public:
  Translator(YAML::Node root, const std::string& file) : root_(root), file_(file) {}

  template <typename T>
  void put(const std::string& anvil_key, const T& value, const std::string& ds_key) {
    YAML::Node node = root_;
    std::vector<std::string> parts;
    for (size_t a = 0, b; a <= anvil_key.size(); a = b + 1) {
      b = std::min(anvil_key.find('.', a), anvil_key.size());
      parts.push_back(anvil_key.substr(a, b - a));
    }
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      if (!node[parts[i]] || !node[parts[i]].IsMap()) node[parts[i]] = YAML::Node(YAML::NodeType::Map);
      node.reset(node[parts[i]]);
    }
    const YAML::Node given = node[parts.back()];
    const YAML::Node wanted = YAML::Clone(YAML::Node(value));
    if (given && !given.IsNull()) {
      ANVIL_CHECK(same(given, wanted), "{}: deepspeed_config.{} means {} = {}, but {} is {}: give one of them", file_,
                  ds_key, anvil_key, text(wanted), anvil_key, text(given));
      return;
    }
    node[parts.back()] = wanted;
  }

 private:
  static std::string text(const YAML::Node& n) {
    if (n.IsScalar()) return n.Scalar();
    YAML::Emitter e;
    e << YAML::Flow << n;
    return e.c_str();
  }
  static bool same(const YAML::Node& x, const YAML::Node& y) {
    if (x.IsSequence() && y.IsSequence() && x.size() == y.size()) {
      for (size_t i = 0; i < x.size(); ++i)
        if (!same(x[i], y[i])) return false;
      return true;
    }
    if (!x.IsScalar() || !y.IsScalar()) return false;
    const std::string &a = x.Scalar(), &b = y.Scalar();
    if (a == b) return true;
    try {
      size_t ea = 0, eb = 0;
      const double x = std::stod(a, &ea), y = std::stod(b, &eb);
      return ea == a.size() && eb == b.size() && x == y;
    } catch (const std::exception&) {
      return false;
    }
  }

  YAML::Node root_;
  const std::string& file_;
};

YAML::Node load_json(const std::string& path, const std::string& file) {
  ANVIL_CHECK(std::filesystem::is_regular_file(path), "{}: deepspeed_config file '{}' not found", file, path);
  try {
    return YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    ANVIL_FAIL("{}: malformed JSON at line {}, column {}: {}", path, e.mark.line + 1, e.mark.column + 1, e.msg);
  }
}

void read_precision(MapReader& ds, Translator& out, const std::string& where) {
  bool fp16 = false, bf16 = false, any = false;
  if (ds.has("fp16")) {
    any = true;
    MapReader f = ds.sub("fp16");
    f.get("enabled", fp16);
    double static_scale = 0;
    f.get("loss_scale", static_scale);
    bool auto_cast = false;  // anvil's amp always rounds every matrix product's operands
    f.get("auto_cast", auto_cast);
    if (fp16) {
      ANVIL_CHECK(static_scale == 0, "{}: deepspeed_config.fp16.loss_scale {} is a static loss scale, which anvil "
                  "does not have: give 0 (dynamic) and initial_scale_power", where, static_scale);
      if (f.has("initial_scale_power")) {
        int power = 0;
        f.get("initial_scale_power", power);
        ANVIL_CHECK(power >= 0 && power <= 60, "{}: deepspeed_config.fp16.initial_scale_power {} must be in 0..60",
                    where, power);
        out.put("loss_scaler.init_scale", std::ldexp(1.0, power), "fp16.initial_scale_power");
      }
      auto copy = [&](const char* ds_key, const char* anvil_key) {
        if (f.has(ds_key)) out.put(anvil_key, f.raw(ds_key), std::string("fp16.") + ds_key);
      };
      copy("loss_scale_window", "loss_scaler.growth_interval");
      copy("hysteresis", "loss_scaler.hysteresis");
      copy("consecutive_hysteresis", "loss_scaler.consecutive_hysteresis");
      copy("min_loss_scale", "loss_scaler.min_scale");
    } else {
      for (const char* k : {"initial_scale_power", "loss_scale_window", "hysteresis", "consecutive_hysteresis",
                            "min_loss_scale"})
        f.has(k);  // meaningless while fp16 is off, as in DeepSpeed
    }
    f.finish();
  }
  for (const char* name : {"bf16", "bfloat16"}) {
    if (!ds.has(name)) continue;
    any = true;
    MapReader b = ds.sub(name);
    bool enabled = false;
    b.get("enabled", enabled);
    bool immediate = false;  // anvil accumulates gradients in fp32 in every precision
    b.get("immediate_grad_update", immediate);
    b.finish();
    bf16 = bf16 || enabled;
  }
  ANVIL_CHECK(!(fp16 && bf16), "{}: deepspeed_config enables both fp16 and bf16: enable one", where);
  if (any)
    out.put("precision", std::string(fp16 ? "amp_fp16" : bf16 ? "amp_bf16" : "fp32"),
            fp16 ? "fp16.enabled" : bf16 ? "bf16.enabled" : "fp16.enabled and bf16.enabled");
}

void read_zero(MapReader& ds, Translator& out, const std::string& where) {
  if (!ds.has("zero_optimization")) return;
  MapReader z = ds.sub("zero_optimization");
  if (z.has("stage")) {
    int stage = 0;
    z.get("stage", stage);
    out.put("distributed.zero_stage", stage, "zero_optimization.stage");
  }
  // Bucketing and overlap are anvil's own (a unit's gradients reduce while the backward pass goes
  // on, in every stage), so these tuning knobs are accepted and have no effect.
  for (const char* k : {"contiguous_gradients", "overlap_comm", "reduce_scatter", "reduce_bucket_size",
                        "allgather_partitions", "allgather_bucket_size", "round_robin_gradients",
                        "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
                        "stage3_max_live_parameters", "stage3_max_reuse_distance", "sub_group_size",
                        "stage3_gather_16bit_weights_on_model_save"})
    z.has(k);
  for (const char* k : {"offload_optimizer", "offload_param"}) {
    if (!z.has(k)) continue;
    MapReader o = z.sub(k);
    std::string device = "none";
    o.get("device", device);
    for (const char* ignored : {"pin_memory", "buffer_count", "buffer_size", "max_in_cpu", "nvme_path", "ratio"})
      o.has(ignored);
    o.finish();
    ANVIL_CHECK(device == "none", "{}: {}.device '{}' is not supported: anvil does not offload (give device: "
                "none)", where, z.full(k), device);
  }
  z.finish();
}

void read_optimizer(MapReader& ds, Translator& out, const std::string& where) {
  if (!ds.has("optimizer")) return;
  MapReader o = ds.sub("optimizer");
  std::string type;
  o.get("type", type);
  std::string lower = type;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char ch) { return std::tolower(ch); });
  MapReader p = o.sub("params");
  bool adam_w_mode = true;  // DeepSpeed's "Adam" is AdamW unless told otherwise
  p.get("adam_w_mode", adam_w_mode);
  ANVIL_CHECK((lower == "adamw" || lower == "adam") && adam_w_mode, "{}: deepspeed_config.optimizer type '{}'{} is "
              "not supported: anvil trains with AdamW (type AdamW)", where, type,
              adam_w_mode ? "" : " with adam_w_mode false");
  // DeepSpeed's AdamW decays as PyTorch's does: p -= lr·wd·p.
  out.put("optimizer.name", std::string("adamw"), "optimizer.type");
  auto copy = [&](const char* key) {
    if (p.has(key)) out.put(std::string("optimizer.") + key, p.raw(key), std::string("optimizer.params.") + key);
  };
  copy("lr");
  copy("eps");
  copy("weight_decay");
  copy("betas");
  p.has("torch_adam");
  p.finish();
  o.finish();
}

}  // namespace

void apply_deepspeed_config(YAML::Node root, const std::string& file, UnknownKeys* unknown) {
  const YAML::Node given = root["deepspeed_config"];
  if (!given || given.IsNull()) return;
  const YAML::Node ds_node = given.IsScalar() ? load_json(given.Scalar(), file) : given;
  const std::string where = given.IsScalar() ? given.Scalar() : file;
  root.remove("deepspeed_config");
  MapReader ds(ds_node, "deepspeed_config", where, nullptr, unknown);
  Translator out(root, where);
  auto copy = [&](const char* ds_key, const char* anvil_key) {
    if (ds.has(ds_key)) out.put(anvil_key, ds.raw(ds_key), ds_key);
  };
  copy("train_batch_size", "global_train_batch_size");
  copy("train_micro_batch_size_per_gpu", "device_train_microbatch_size");
  ANVIL_CHECK(!ds.has("gradient_accumulation_steps"), "{}: deepspeed_config.gradient_accumulation_steps is not read: "
              "anvil derives it from the batch sizes; give train_batch_size and train_micro_batch_size_per_gpu", where);
  copy("gradient_clipping", "algorithms.gradient_clipping.clipping_threshold");
  if (ds.has("steps_per_print")) {
    int n = 0;
    ds.get("steps_per_print", n);
    ANVIL_CHECK(n > 0, "{}: deepspeed_config.steps_per_print must be positive, got {}", where, n);
    out.put("console_log_interval", std::to_string(n) + "ba", "steps_per_print");
  }
  ds.has("wall_clock_breakdown");  // anvil logs its step timing always
  read_precision(ds, out, where);
  read_zero(ds, out, where);
  read_optimizer(ds, out, where);
  ANVIL_CHECK(!ds.has("scheduler"), "{}: deepspeed_config.scheduler is not read: give anvil's scheduler "
              "(name, t_warmup, t_max, alpha_f; docs/config.md)", where);
  ds.finish();
}

}  // namespace anvil
