// Export reads the checkpoint once (verified as every load is), cuts and transposes each
// transformers tensor out of anvil's flat layout (interop/hf_format.h), and writes the files into
// a temporary directory beside the target that is renamed only when everything is written, so an
// interrupted export never leaves a directory that looks complete.
#include "interop/hf_export.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>

#include <fmt/format.h>

#include "ckpt/checkpoint.h"
#include "ckpt/safetensors.h"
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

}  // namespace

HfExportResult export_hf(const std::string& checkpoint, const std::string& out_dir, const HfExportOptions& opt) {
  const StoredType type = stored_type(opt.dtype);
  ANVIL_CHECK(opt.max_shard_bytes > 0, "--max-shard-size must be positive");
  ANVIL_CHECK(!fs::exists(out_dir), "'{}' already exists; export writes a new directory (choose another name or "
              "remove it)", out_dir);
  // Tensor by tensor: a sharded checkpoint is never gathered whole, and neither is an output file.
  CheckpointTensorReader ckpt(checkpoint);
  const ModelConfig& cfg = ckpt.info().config;
  const std::unique_ptr<Tokenizer> tok =
      load_tokenizer(opt.tokenizer.empty() ? checkpoint_tokenizer(ckpt.info().config_yaml) : opt.tokenizer);
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

  const fs::path target = fs::absolute(out_dir).lexically_normal();
  const std::string tmp = (target.parent_path() / fmt::format(".{}.export-tmp", target.filename().string())).string();
  fs::remove_all(tmp);  // what an interrupted export left
  make_dirs(tmp);
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
        source = ckpt.tensor(t.source);
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
  fsync_dir(tmp);
  fs::rename(tmp, target);
  fsync_dir(target.parent_path().string());

  HfExportResult r;
  r.tensors = tensors.size();
  r.files = n_files;
  r.bytes = total;
  r.architecture = config["architectures"][0].get<std::string>();
  return r;
}

}  // namespace anvil
