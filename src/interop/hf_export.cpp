// Export reads the checkpoint once (verified as every load is), cuts and transposes each
// transformers tensor out of anvil's flat layout (interop/hf_format.h), and writes the files into
// a temporary directory beside the target that is renamed only when everything is written, so an
// interrupted export never leaves a directory that looks complete.
#include "interop/hf_export.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>

#include <fmt/format.h>

#include "ckpt/checkpoint.h"
#include "ckpt/safetensors.h"
#include "config/lora_config.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/progress.h"
#include "data/tokenizer.h"
#include "interop/hf_format.h"
#include "interop/hf_import.h"
#include "model/model.h"

namespace anvil {
namespace {

namespace fs = std::filesystem;

struct StoredType {
  const char* safetensors;  // "F32"
  const char* torch;        // "float32"
  size_t bytes;
};

StoredType stored_type(const std::string& dtype) {
  if (dtype == "fp32") return {"F32", "float32", 4};
  if (dtype == "bf16") return {"BF16", "bfloat16", 2};
  if (dtype == "fp16") return {"F16", "float16", 2};
  throw Error(fmt::format("--dtype '{}' is not valid: expected fp32, bf16 or fp16", dtype));
}

size_t numel(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

// Writes transformers' tensor t, cut from `values` (the whole anvil tensor), in the stored type:
// fp32 rows as they are go to the file straight from `values`; otherwise one buffer of the stored
// bytes is filled (transposed, rounded) without a float copy in between.
void write_tensor(SafeTensorsWriter& file, const HfTensor& t, const ParamTensor& src, const float* values,
                  const StoredType& type) {
  const size_t n = numel(t.shape);
  const int64_t cols = src.shape.size() == 2 ? src.shape[1] : 1;
  const float* base = values + static_cast<size_t>(t.row0) * cols;
  if (type.bytes == 4 && !t.transposed) return file.write(t.name, base, n * sizeof(float));
  // Element i of transformers' tensor: src (rows × cols) stored as (cols × rows) when transposed.
  const int64_t rows = src.shape[0];
  auto value = [&](size_t i) {
    return t.transposed ? base[static_cast<int64_t>(i % rows) * cols + static_cast<int64_t>(i / rows)] : base[i];
  };
  std::string out(n * type.bytes, '\0');
  if (type.bytes == 4) {
    auto* f = reinterpret_cast<float*>(out.data());
    for (size_t i = 0; i < n; i++) f[i] = value(i);
  } else {
    auto* h = reinterpret_cast<uint16_t*>(out.data());
    const bool fp16 = std::strcmp(type.safetensors, "F16") == 0;
    for (size_t i = 0; i < n; i++) {
      const float v = value(i);
      ANVIL_CHECK(!fp16 || std::fabs(v) <= 65504.0f,
                  "{} holds {} at index {}, beyond float16's range (65504); export as bf16 or fp32", t.name, v, i);
      h[i] = fp16 ? float_to_fp16(v) : float_to_bf16(v);
    }
  }
  file.write(t.name, out.data(), out.size());
}


// The whole anvil tensor `name` of the model being exported.
using TensorSource = std::function<std::vector<float>(const std::string& name)>;

// out_dir must not exist: export writes a new directory.
void require_new(const std::string& out_dir) {
  ANVIL_CHECK(!fs::exists(out_dir), "'{}' already exists; export writes a new directory (choose another name or "
              "remove it)", out_dir);
}

// A directory under a temporary name beside out_dir (what an interrupted export left there
// removed), renamed to out_dir by publish once complete.
std::string export_temp_dir(const std::string& out_dir) {
  const fs::path target = fs::absolute(out_dir).lexically_normal();
  const std::string tmp = (target.parent_path() / fmt::format(".{}.export-tmp", target.filename().string())).string();
  fs::remove_all(tmp);
  make_dirs(tmp);
  return tmp;
}
void publish(const std::string& tmp, const std::string& out_dir) {
  const fs::path target = fs::absolute(out_dir).lexically_normal();
  fsync_dir(tmp);
  fs::rename(tmp, target);
  fsync_dir(target.parent_path().string());
}

// The transformers directory of the model cfg, its tensors from tensor_of.
HfExportResult write_hf_dir(const ModelConfig& cfg, const TensorSource& tensor_of, const std::string& tokenizer,
                            const std::string& out_dir, const HfExportOptions& opt) {
  const StoredType type = stored_type(opt.dtype);
  ANVIL_CHECK(opt.max_shard_bytes > 0, "--max-shard-size must be positive");
  const std::unique_ptr<Tokenizer> tok = load_tokenizer(tokenizer);
  ANVIL_CHECK(tok->vocab_size() <= cfg.vocab_size, "the tokenizer {} has {} tokens, more than the model's vocab_size {}",
              tok->files().name, tok->vocab_size(), cfg.vocab_size);
  // GPT-2 has no BOS of its own: transformers' GPT-2 configs name its end-of-text token for both.
  const int bos = tok->bos_id() >= 0 ? tok->bos_id() : tok->eos_id(), eos = tok->eos_id();
  const std::vector<HfTensor> tensors = hf_tensors(cfg);
  std::map<std::string, ParamTensor> layout;
  for (const ParamTensor& t : model_param_layout(cfg)) layout.emplace(t.name, t);

  // Shards as save_pretrained cuts them: tensors in order, a new file when the next tensor would
  // take the current one past the limit (a tensor larger than the limit gets a file of its own).
  std::vector<std::vector<size_t>> shards(1);
  uint64_t in_shard = 0, total = 0;
  for (size_t i = 0; i < tensors.size(); i++) {
    const uint64_t bytes = numel(tensors[i].shape) * type.bytes;
    if (in_shard > 0 && in_shard + bytes > opt.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += bytes;
    total += bytes;
  }
  const int n_files = static_cast<int>(shards.size());
  auto file_name = [&](int i) {
    return n_files == 1 ? std::string("model.safetensors")
                        : fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, n_files);
  };

  const std::string tmp = export_temp_dir(out_dir);
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  Progress progress("export", static_cast<int64_t>(total), "B");
  uint64_t written = 0;
  std::string source_name;  // the anvil tensor last read: consecutive rows (q, k, v) share it
  std::vector<float> source;
  for (int s = 0; s < n_files; s++) {
    std::vector<SafeTensorsWriter::Declared> declared;
    for (size_t i : shards[s]) declared.push_back({tensors[i].name, type.safetensors, tensors[i].shape});
    // transformers refuses safetensors metadata without "format".
    SafeTensorsWriter file(tmp + "/" + file_name(s), std::move(declared), {{"format", "pt"}});
    for (size_t i : shards[s]) {
      const HfTensor& t = tensors[i];
      const auto src = layout.find(t.source);
      ANVIL_CHECK(src != layout.end(), "internal: transformers tensor {} maps to '{}', not in the layout", t.name,
                  t.source);
      if (source_name != t.source) {
        source = tensor_of(t.source);
        source_name = t.source;
      }
      write_tensor(file, t, src->second, source.data(), type);
      written += numel(t.shape) * type.bytes;
      weight_map[t.name] = file_name(s);
      progress.update(static_cast<int64_t>(written));
    }
    file.commit();
  }
  progress.finish();
  if (n_files > 1) {
    const nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_file_atomic(tmp + "/model.safetensors.index.json", index.dump(2) + "\n");
  }
  const nlohmann::ordered_json config = hf_config(cfg, type.torch, bos, eos);
  write_file_atomic(tmp + "/config.json", config.dump(2) + "\n");
  const nlohmann::ordered_json generation = {{"bos_token_id", bos}, {"eos_token_id", eos}};
  write_file_atomic(tmp + "/generation_config.json", generation.dump(2) + "\n");
  tok->write_hf_files(tmp, cfg.max_seq_len);
  publish(tmp, out_dir);

  HfExportResult r;
  r.tensors = tensors.size();
  r.files = n_files;
  r.bytes = total;
  r.architecture = config["architectures"][0].get<std::string>();
  return r;
}

}  // namespace

HfExportResult export_hf(const std::string& checkpoint, const std::string& out_dir, const HfExportOptions& opt) {
  require_new(out_dir);
  // Tensor by tensor: a sharded checkpoint is never gathered whole, and neither is an output file.
  CheckpointTensorReader ckpt(checkpoint);
  const LoadedCheckpoint& info = ckpt.info();
  const std::string tokenizer = opt.tokenizer.empty() ? checkpoint_tokenizer(info.config_yaml) : opt.tokenizer;
  if (!info.config.has_lora()) {
    ANVIL_CHECK(!opt.merge_lora, "--merge-lora: '{}' holds no LoRA adapters (a whole model: export it without the "
                "flag)", info.dir);
    return write_hf_dir(info.config, [&](const std::string& name) { return ckpt.tensor(name); }, tokenizer, out_dir,
                        opt);
  }
  ANVIL_CHECK(opt.merge_lora, "'{}' holds LoRA adapters, not a whole model: export --merge-lora writes the model with "
              "them folded into their base, --adapter writes PEFT's adapter files", info.dir);
  // The base, checked against the digest the adapters recorded, and the adapters folded in.
  const LoadedCheckpoint adapters = load_checkpoint(checkpoint, /*with_optimizer=*/false);
  const LoraBase base = load_lora_base(info.lora_base.path, info.lora_base.weights_sha256,
                                       fmt::format("LoRA checkpoint '{}'", info.dir), /*show_progress=*/true);
  const ModelConfig merged_cfg = info.config.base();
  ANVIL_CHECK(same_architecture(base.config, merged_cfg), "LoRA checkpoint '{}': its base '{}' is another model",
              info.dir, info.lora_base.path);
  const std::vector<float> merged = lora_merged_weights(info.config, base.params, adapters.params);
  std::map<std::string, ParamTensor> layout;
  for (const ParamTensor& t : model_param_layout(merged_cfg)) layout.emplace(t.name, t);
  return write_hf_dir(merged_cfg, [&](const std::string& name) {
    const ParamTensor& t = layout.at(name);
    return std::vector<float>(merged.begin() + static_cast<std::ptrdiff_t>(t.offset),
                              merged.begin() + static_cast<std::ptrdiff_t>(t.offset + t.numel));
  }, tokenizer, out_dir, opt);
}

HfExportResult export_peft_adapter(const std::string& checkpoint, const std::string& out_dir,
                                   const std::string& dtype) {
  const StoredType type = stored_type(dtype);
  require_new(out_dir);
  const LoadedCheckpoint c = load_checkpoint(checkpoint, /*with_optimizer=*/false, /*show_progress=*/true);
  const ModelConfig& cfg = c.config;
  ANVIL_CHECK(cfg.has_lora(), "--adapter: '{}' holds no LoRA adapters (a whole model: export it without the flag)",
              c.dir);
  const LoraConfig& lora = cfg.lora;
  // PEFT's keys: base_model.model.<module path>.lora_A.weight (r, in) and .lora_B.weight (out, r).
  std::vector<HfTensor> tensors;
  std::vector<SafeTensorsWriter::Declared> declared;
  for (const ParamTensor& t : model_param_layout(cfg)) {
    const size_t dot = t.name.find('.', 2);  // "h.L." then the module's path and lora_A / lora_B
    const int l = std::stoi(t.name.substr(2, dot - 2));
    const std::string name = "base_model.model." + hf_block_prefix(cfg, l) + t.name.substr(dot + 1) + ".weight";
    tensors.push_back({name, t.name, t.shape, 0, 0, false});
    declared.push_back({name, type.safetensors, t.shape});
  }
  std::map<std::string, ParamTensor> layout;
  for (const ParamTensor& t : model_param_layout(cfg)) layout.emplace(t.name, t);
  // The modules chosen, by their paths in a block (PEFT matches them as suffixes).
  std::vector<std::string> targets;
  for (const LoraModule& m : lora_targets(cfg)) targets.push_back(m.name);
  const nlohmann::ordered_json config = {
      {"peft_type", "LORA"}, {"task_type", "CAUSAL_LM"}, {"base_model_name_or_path", c.lora_base.path},
      {"r", lora.r}, {"lora_alpha", float_as_written(lora.alpha)}, {"lora_dropout", float_as_written(lora.dropout)},
      {"target_modules", targets}, {"bias", "none"}, {"use_rslora", lora.rslora},
      // Conv1D layers (GPT-2's: weights stored input × output) PEFT marks so.
      {"fan_in_fan_out", family(cfg.name).hf_conv1d}, {"init_lora_weights", true}, {"inference_mode", true},
      {"modules_to_save", nullptr}, {"layers_to_transform", nullptr}, {"layers_pattern", nullptr},
      {"rank_pattern", nlohmann::ordered_json::object()}, {"alpha_pattern", nlohmann::ordered_json::object()},
      {"use_dora", false}, {"revision", nullptr}};

  const std::string tmp = export_temp_dir(out_dir);
  SafeTensorsWriter file(tmp + "/adapter_model.safetensors", std::move(declared), {{"format", "pt"}});
  HfExportResult r;
  for (const HfTensor& t : tensors) {
    const ParamTensor& src = layout.at(t.source);
    write_tensor(file, t, src, c.params.data() + src.offset, type);
    r.bytes += numel(t.shape) * type.bytes;
  }
  file.commit();
  write_file_atomic(tmp + "/adapter_config.json", config.dump(2) + "\n");
  publish(tmp, out_dir);
  r.tensors = tensors.size();
  r.files = 1;
  r.architecture = "PEFT LoRA adapter";
  return r;
}

}  // namespace anvil
