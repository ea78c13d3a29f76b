// Checkpoint save (temporary directory, fsync, rename, then `latest`) and load (checksums verified).
#include "train/checkpoint.h"

#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "ckpt/safetensors.h"
#include "core/error.h"
#include "core/fs.h"

namespace anvil {
namespace fs = std::filesystem;

std::string save_checkpoint(const std::string& run_dir, int64_t step, int64_t tokens_seen,
                            const TrainConfig& cfg, const CheckpointState& state, const std::string& data_state) {
  const std::string ckpt_root = run_dir + "/checkpoints";
  make_dirs(ckpt_root);
  const std::string name = fmt::format("step-{:08d}", step);
  const std::string final_dir = ckpt_root + "/" + name;
  const std::string tmp = ckpt_root + "/." + name + ".tmp." + std::to_string(::getpid());
  fs::remove_all(tmp);
  make_dirs(tmp);

  SafeTensorsFile weights, optim;
  nlohmann::json tensors = nlohmann::json::array();
  for (const ParamTensor& t : gpt2_param_layout(cfg.model)) {
    const float* p = state.params + t.offset;
    weights.tensors[t.name] = make_f32(p, t.shape);
    optim.tensors["exp_avg." + t.name] = make_f32(state.exp_avg + t.offset, t.shape);
    optim.tensors["exp_avg_sq." + t.name] = make_f32(state.exp_avg_sq + t.offset, t.shape);
    tensors.push_back({{"name", t.name}, {"shape", t.shape}, {"dtype", "F32"},
                       {"xxh3", hex64(hash64(p, t.numel * sizeof(float)))}});
  }
  optim.metadata["steps_taken"] = std::to_string(state.optimizer_steps);
  write_safetensors(tmp + "/model.safetensors", weights);
  write_safetensors(tmp + "/optimizer.safetensors", optim);
  const std::string config_yaml = to_yaml(cfg);
  const ModelConfig& m = cfg.model;
  nlohmann::json manifest = {
      {"format", "anvil-checkpoint"}, {"version", kCheckpointVersion}, {"step", step},
      {"tokens_seen", tokens_seen}, {"seed", cfg.seed}, {"data_state", nlohmann::json::parse(data_state)},
      {"model", {{"name", m.name}, {"n_layers", m.n_layers}, {"n_heads", m.n_heads}, {"d_model", m.d_model},
                 {"vocab_size", m.vocab_size}, {"max_seq_len", m.max_seq_len}}},
      {"config", config_yaml}, {"config_xxh3", hex64(hash64(config_yaml.data(), config_yaml.size()))},
      {"tensors", tensors}};
  write_file_atomic(tmp + "/manifest.json", manifest.dump(2) + "\n");
  fsync_dir(tmp);
  if (fs::exists(final_dir)) fs::remove_all(final_dir);  // a re-save of the same step
  fs::rename(tmp, final_dir);
  fsync_dir(ckpt_root);
  write_file_atomic(ckpt_root + "/latest", name + "\n");
  return final_dir;
}

LoadedModel load_model_checkpoint(const std::string& path) {
  std::string dir = path;
  for (const std::string& root : {path + "/checkpoints", path}) {
    if (fs::is_regular_file(root + "/latest")) {
      std::string name = read_file(root + "/latest", "checkpoint pointer");
      while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
      dir = root + "/" + name;
      break;
    }
  }
  const std::string manifest_path = dir + "/manifest.json";
  ANVIL_CHECK(fs::is_regular_file(manifest_path), "'{}' is not a checkpoint: no manifest.json (expected a checkpoint "
              "directory or a run directory with checkpoints/latest)", path);
  LoadedModel out;
  out.dir = dir;
  nlohmann::json manifest;
  try {
    manifest = nlohmann::json::parse(read_file(manifest_path, "checkpoint manifest"));
    ANVIL_CHECK(manifest.at("format") == "anvil-checkpoint", "'{}' is not an anvil checkpoint manifest", manifest_path);
    const int version = manifest.at("version").get<int>();
    ANVIL_CHECK(version <= kCheckpointVersion, "checkpoint '{}' has format version {}, newer than this anvil reads ({}); "
                "upgrade anvil", dir, version, kCheckpointVersion);
    ANVIL_CHECK(version == kCheckpointVersion, "checkpoint '{}' has format version {}, which stacked each block's "
                "tensors; this anvil reads version {} only", dir, version, kCheckpointVersion);
    const auto& m = manifest.at("model");
    out.config.name = m.at("name").get<std::string>();
    out.config.n_layers = m.at("n_layers").get<int>();
    out.config.n_heads = m.at("n_heads").get<int>();
    out.config.d_model = m.at("d_model").get<int>();
    out.config.vocab_size = m.at("vocab_size").get<int>();
    out.config.max_seq_len = m.at("max_seq_len").get<int>();
    out.step = manifest.at("step").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    ANVIL_FAIL("checkpoint manifest '{}' is malformed: {}", manifest_path, e.what());
  }
  const SafeTensorsFile weights = read_safetensors(dir + "/model.safetensors");
  const std::vector<ParamTensor> layout = gpt2_param_layout(out.config);
  out.params.resize(gpt2_num_params(out.config));
  for (const ParamTensor& t : layout) {
    const SafeTensor& st = weights.at(t.name);
    ANVIL_CHECK(st.shape == t.shape, "checkpoint '{}': tensor '{}' has the wrong shape", dir, t.name);
    std::string want;
    const auto listed = manifest.find("tensors");
    if (listed != manifest.end() && listed->is_array())
      for (const auto& entry : *listed)
        if (entry.is_object() && entry.value("name", "") == t.name) want = entry.value("xxh3", "");
    ANVIL_CHECK(!want.empty() && want == hex64(hash64(st.data.data(), st.data.size())),
                "checkpoint '{}' is corrupt: tensor '{}' does not match its checksum in the manifest", dir, t.name);
    std::copy_n(st.f32(), t.numel, out.params.data() + t.offset);
  }
  return out;
}

}  // namespace anvil
