// Import reads config.json into a ModelConfig through the config reader (config/hf_model_config.h),
// reads every safetensors file the directory names, and fills anvil's flat layout through the
// same name map export writes with, so import(export(x)) is x bit for bit in fp32. The key
// variants published checkpoints really have are accepted: GPT-2's original files name tensors
// without the "transformer." prefix and carry attention-mask buffers; older Llama files carry
// rotary inv_freq buffers; a tied head may be stored beside the embedding it equals.
#include "interop/hf_import.h"

#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "ckpt/checkpoint.h"
#include "ckpt/safetensors.h"
#include "config/hf_model_config.h"
#include "config/train_config.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/progress.h"
#include "interop/hf_format.h"
#include "model/model.h"

namespace anvil {
namespace {

namespace fs = std::filesystem;

// A transformers directory's own tokenizer where it holds one (SentencePiece's tokenizer.model, or
// GPT-2 BPE's vocab.json + merges.txt), else GPT-2's.
std::string hf_dir_tokenizer(const std::string& dir) {
  const fs::path d = fs::absolute(dir).lexically_normal();
  const bool has = fs::is_regular_file(d / "tokenizer.model") ||
                   (fs::is_regular_file(d / "vocab.json") && fs::is_regular_file(d / "merges.txt"));
  return has ? d.string() : "gpt2";
}

// Every tensor of the directory by name, and the file each lies in (headers only: a tensor is
// read when it is used, so an import holds the model once, not twice).
struct HfFiles {
  std::vector<SafeTensorsHeader> headers;
  std::map<std::string, const SafeTensorEntry*> tensors;
  std::map<std::string, size_t> file_of;  // index into headers
  std::string file_name(const std::string& tensor) const {
    return fs::path(headers[file_of.at(tensor)].path).filename().string();
  }
  SafeTensor read(const std::string& tensor) const { return read_safetensor(headers[file_of.at(tensor)], tensor); }
};

HfFiles read_hf_files(const std::string& dir) {
  HfFiles out;
  std::vector<std::string> files;
  const std::string index_path = dir + "/model.safetensors.index.json";
  nlohmann::json index;
  if (fs::exists(index_path)) {
    try {
      index = nlohmann::json::parse(read_file(index_path, "safetensors index"));
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("'{}' is not valid JSON: {}", index_path, e.what()));
    }
    ANVIL_CHECK(index.contains("weight_map") && index["weight_map"].is_object(), "'{}' has no weight_map", index_path);
    std::set<std::string> names;
    for (const auto& [name, file] : index["weight_map"].items()) {
      ANVIL_CHECK(file.is_string(), "'{}': weight_map entry '{}' is not a file name", index_path, name);
      names.insert(file.get<std::string>());
    }
    files.assign(names.begin(), names.end());
    for (const std::string& f : files)
      ANVIL_CHECK(f.find('/') == std::string::npos, "'{}': weight_map names '{}', outside the directory", index_path, f);
  } else {
    ANVIL_CHECK(fs::exists(dir + "/model.safetensors"), "'{}' holds neither model.safetensors nor "
                "model.safetensors.index.json", dir);
    files = {"model.safetensors"};
  }
  out.headers.reserve(files.size());
  for (const std::string& f : files) out.headers.push_back(read_safetensors_header(dir + "/" + f));
  for (size_t i = 0; i < files.size(); i++) {
    for (const auto& [name, entry] : out.headers[i].tensors) {
      ANVIL_CHECK(!out.tensors.count(name), "tensor '{}' is in both '{}' and '{}'", name, out.file_name(name), files[i]);
      ANVIL_CHECK(index.is_null() || (index["weight_map"].contains(name) && index["weight_map"][name] == files[i]),
                  "'{}' holds tensor '{}', which the index does not place there", files[i], name);
      out.tensors[name] = &entry;
      out.file_of[name] = i;
    }
  }
  if (!index.is_null())
    for (const auto& [name, file] : index["weight_map"].items())
      ANVIL_CHECK(out.tensors.count(name), "the index places tensor '{}' in '{}', which does not hold it", name,
                  file.get<std::string>());
  return out;
}

// A stored tensor's values as floats.
std::vector<float> to_floats(const std::string& name, const SafeTensor& t) {
  const size_t n = t.numel();
  std::vector<float> v(n);
  if (t.dtype == "F32") {
    std::memcpy(v.data(), t.data.data(), n * sizeof(float));
  } else if (t.dtype == "BF16" || t.dtype == "F16") {
    const auto* h = reinterpret_cast<const uint16_t*>(t.data.data());
    for (size_t i = 0; i < n; i++) v[i] = t.dtype == "BF16" ? bf16_to_float(h[i]) : fp16_to_float(h[i]);
  } else {
    ANVIL_FAIL("tensor '{}' is {}: expected F32, BF16 or F16", name, t.dtype);
  }
  return v;
}

std::string shape_text(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// The name a file uses for one of transformers' keys: the family's original files may leave out
// a prefix (OpenAI's GPT-2 files drop "transformer.").
std::string stored_name(const HfFiles& files, const std::string& name, const std::string& optional_prefix) {
  if (files.tensors.count(name) || optional_prefix.empty() || !name.starts_with(optional_prefix)) return name;
  const std::string bare = name.substr(optional_prefix.size());
  return files.tensors.count(bare) ? bare : name;
}

// Buffers that published files carry beside the weights: GPT-2's causal masks, rotary inverse
// frequencies of older Llama files.
bool is_buffer(const std::string& name) {
  return name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") ||
         name.ends_with(".rotary_emb.inv_freq");
}

}  // namespace

bool is_hf_model_dir(const std::string& path) {
  return fs::exists(path + "/config.json") && !fs::exists(path + "/manifest.json") && !fs::exists(path + "/checkpoints");
}

HfModel read_hf_model(const std::string& hf_dir, const char* progress_label) {
  ANVIL_CHECK(fs::is_directory(hf_dir), "'{}' is not a directory (expected a Hugging Face model directory)", hf_dir);
  const std::string config_path = hf_dir + "/config.json";
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(read_file(config_path, "Hugging Face config"));
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("'{}' is not valid JSON: {}", config_path, e.what()));
  }
  HfModel r;
  r.config = hf_model_config(config, config_path);
  const ModelConfig& cfg = r.config;
  HfFiles files = read_hf_files(hf_dir);

  const std::vector<ParamTensor> layout = model_param_layout(cfg);
  std::map<std::string, const ParamTensor*> by_name;
  for (const ParamTensor& t : layout) by_name[t.name] = &t;
  std::vector<float>& params = r.params;
  params.assign(model_num_params(cfg), 0.0f);
  std::set<std::string> used;
  const std::string optional_prefix = family(cfg.name).hf_optional_prefix;
  const std::vector<HfTensor> wanted = hf_tensors(cfg);
  uint64_t total = 0, read = 0;
  for (const HfTensor& h : wanted) {
    const auto it = files.tensors.find(stored_name(files, h.name, optional_prefix));
    if (it != files.tensors.end()) total += it->second->end - it->second->begin;
  }
  std::optional<Progress> progress;
  if (progress_label) progress.emplace(progress_label, static_cast<int64_t>(total), "B");
  for (const HfTensor& h : wanted) {
    const std::string name = stored_name(files, h.name, optional_prefix);
    const auto it = files.tensors.find(name);
    ANVIL_CHECK(it != files.tensors.end(), "'{}' has no tensor '{}', which its config.json's {} needs", hf_dir, h.name,
                family(cfg.name).title);
    ANVIL_CHECK(it->second->shape == h.shape, "tensor '{}' in '{}' has shape {}, but config.json's model needs {}", name,
                files.file_name(name), shape_text(it->second->shape), shape_text(h.shape));
    const std::vector<float> v = to_floats(name, files.read(name));
    read += it->second->end - it->second->begin;
    if (progress) progress->update(static_cast<int64_t>(read));
    const ParamTensor& src = *by_name.at(h.source);
    const int64_t cols = src.shape.size() == 2 ? src.shape[1] : 1;
    float* dst = params.data() + src.offset + static_cast<size_t>(h.row0) * cols;
    if (h.transposed) {  // stored (cols × rows) for anvil's (rows × cols)
      const int64_t rows = src.shape[0];
      for (int64_t row = 0; row < rows; row++)
        for (int64_t c = 0; c < cols; c++) dst[row * cols + c] = v[static_cast<size_t>(c * rows + row)];
    } else {
      std::memcpy(dst, v.data(), v.size() * sizeof(float));
    }
    used.insert(name);
    r.tensors++;
  }
  for (const auto& [name, entry] : files.tensors) {
    if (used.count(name)) continue;
    if (is_buffer(name)) {
      r.skipped.push_back(name);
      continue;
    }
    if (name == "lm_head.weight" && cfg.tied_embeddings) {
      // save_pretrained leaves a tied head out, but some files store it: it must be the embedding.
      const std::vector<float> head = to_floats(name, files.read(name));
      const ParamTensor& wte = *by_name.at("wte");
      ANVIL_CHECK(entry->shape == wte.shape && std::memcmp(head.data(), params.data() + wte.offset,
                                                       head.size() * sizeof(float)) == 0,
                  "'{}' stores lm_head.weight unlike the embedding, but config.json ties them "
                  "(tie_word_embeddings); the config disagrees with the tensors", hf_dir);
      r.skipped.push_back(name);
      continue;
    }
    ANVIL_FAIL("tensor '{}' in '{}' is not part of config.json's {} model (a config that disagrees with the tensors)",
               name, files.file_name(name), family(cfg.name).title);
  }

  if (progress) progress->finish(fmt::format("{} tensors", r.tensors));
  return r;
}

std::string checkpoint_tokenizer(const std::string& config_yaml) {
  const YAML::Node cfg = YAML::Load(config_yaml);
  return cfg["tokenizer"] && cfg["tokenizer"]["name"] ? cfg["tokenizer"]["name"].as<std::string>() : "gpt2";
}

LoraBase load_lora_base(const std::string& path, const std::string& want_sha256, const std::string& adapters,
                        bool show_progress) {
  LoraBase b;
  if (is_hf_model_dir(path)) {
    HfModel m = read_hf_model(path, show_progress ? "load base" : nullptr);
    b.config = m.config;
    b.params = std::move(m.params);
  } else {
    ANVIL_CHECK(fs::exists(path), "{}: its base '{}' does not exist (expected a transformers directory or an anvil "
                "checkpoint)", adapters, path);
    // An anvil checkpoint's manifest records its digest: a base that changed is found before reading it.
    const std::string recorded = CheckpointTensorReader(path).info().weights_sha256;
    ANVIL_CHECK(want_sha256.empty() || recorded == want_sha256, "{}: its adapters were trained on a base whose "
                "weights have sha256 {}, but '{}' now holds weights with sha256 {}; adapters belong to the exact "
                "weights they were trained on: restore that base", adapters, want_sha256, path, recorded);
    LoadedCheckpoint c = load_checkpoint(path, /*with_optimizer=*/false, show_progress);
    ANVIL_CHECK(!c.config.has_lora(), "{}: its base '{}' holds LoRA adapters itself; name the model they adapt, or "
                "merge them first (anvil export --merge-lora)", adapters, c.dir);
    b.config = c.config;
    b.params = std::move(c.params);
  }
  b.sha256 = weights_sha256(b.config, b.params.data());
  ANVIL_CHECK(want_sha256.empty() || b.sha256 == want_sha256, "{}: its adapters were trained on a base whose weights "
              "have sha256 {}, but '{}' now holds weights with sha256 {}; adapters belong to the exact weights they "
              "were trained on: restore that base", adapters, want_sha256, path, b.sha256);
  return b;
}

ModelWeights load_model_weights(const std::string& path) {
  if (is_hf_model_dir(path)) {
    HfModel m = read_hf_model(path, "load weights");
    return {m.config, std::move(m.params), hf_dir_tokenizer(path), {}};
  }
  // A LoRA checkpoint's base first: one that no longer fits is found before anything is read.
  const LoadedCheckpoint info = CheckpointTensorReader(path).info();
  std::optional<LoraBase> lora_base;
  if (info.config.has_lora())
    lora_base = load_lora_base(info.lora_base.path, info.lora_base.weights_sha256,
                               fmt::format("LoRA checkpoint '{}'", info.dir), /*show_progress=*/true);
  LoadedCheckpoint c = load_checkpoint(path, /*with_optimizer=*/false, /*show_progress=*/true);
  ModelWeights w{c.config, std::move(c.params), checkpoint_tokenizer(c.config_yaml), {}};
  if (lora_base) {
    LoraBase& base = *lora_base;
    ANVIL_CHECK(same_architecture(base.config, c.config.base()), "LoRA checkpoint '{}': its base '{}' is another "
                "model ({}) than the adapters were trained on ({})", c.dir, c.lora_base.path,
                model_architecture_summary(base.config), model_architecture_summary(c.config));
    w.base = std::move(base.params);
  }
  return w;
}

HfImportResult import_hf(const std::string& hf_dir, const std::string& out_dir) {
  ANVIL_CHECK(fs::is_directory(hf_dir), "'{}' is not a directory (expected a Hugging Face model directory)", hf_dir);
  ANVIL_CHECK(!fs::exists(out_dir), "'{}' already exists; import writes a new run directory (choose another name "
              "or remove it)", out_dir);
  HfModel model = read_hf_model(hf_dir, "import");
  HfImportResult r;
  r.config = model.config;
  r.tensors = model.tensors;
  r.skipped = model.skipped;
  const ModelConfig& cfg = r.config;
  std::vector<float>& params = model.params;

  // The weights as the step-0 checkpoint of a new run directory, with no training state: a run
  // that loads it starts its optimizer and data afresh.
  TrainConfig tc;
  tc.model = cfg;
  tc.max_seq_len = cfg.max_seq_len;
  tc.run_dir = out_dir;
  tc.tokenizer_name = hf_dir_tokenizer(hf_dir);
  CheckpointShard shard;
  shard.hi = params.size();
  shard.params = std::move(params);
  shard.exp_avg.assign(shard.hi, 0.0f);
  shard.exp_avg_sq.assign(shard.hi, 0.0f);
  CheckpointInfo info;
  info.data_state = "null";
  try {
    const std::string tmp = checkpoint_temp_dir(out_dir + "/checkpoints", 0);
    make_dirs(tmp);
    write_checkpoint_shard(tmp, cfg, shard, 0);
    r.checkpoint = finalize_checkpoint(out_dir + "/checkpoints", 1, tc, info);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(out_dir, ec);  // nothing half-written is left behind
    throw;
  }
  return r;
}

}  // namespace anvil
