// Checkpoint save (temporary directory, fsync, rename, then `latest`) and load (checksums verified).
#include "train/checkpoint.h"

#include <unistd.h>

#include <csignal>
#include <cstdlib>

#include <openssl/evp.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "ckpt/safetensors.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"

namespace anvil {
namespace fs = std::filesystem;

std::string save_checkpoint(const std::string& run_dir, int64_t step, int64_t tokens_seen,
                            const TrainConfig& cfg, const CheckpointState& state, const std::string& data_state) {
  const std::string ckpt_root = run_dir + "/checkpoints";
  make_dirs(ckpt_root);
  const std::string name = fmt::format("step-{:08d}", step);
  const std::string final_dir = ckpt_root + "/" + name;
  const std::string tmp = ckpt_root + "/." + name + ".tmp." + std::to_string(::getpid());  // not a step-* name
  fs::remove_all(tmp);
  make_dirs(tmp);

  SafeTensorsFile weights, optim;
  nlohmann::json tensors = nlohmann::json::array();
  auto add = [&](SafeTensorsFile& file, const std::string& name, const float* data, const std::vector<int64_t>& shape,
                 size_t numel) {
    file.tensors[name] = make_f32(data, shape);
    tensors.push_back({{"name", name}, {"shape", shape}, {"dtype", "F32"},
                       {"xxh3", hex64(hash64(data, numel * sizeof(float)))}});
  };
  for (const ParamTensor& t : gpt2_param_layout(cfg.model)) {
    add(weights, t.name, state.params + t.offset, t.shape, t.numel);
    add(optim, "exp_avg." + t.name, state.exp_avg + t.offset, t.shape, t.numel);
    add(optim, "exp_avg_sq." + t.name, state.exp_avg_sq + t.offset, t.shape, t.numel);
  }
  optim.metadata["steps_taken"] = std::to_string(state.optimizer_steps);
  write_safetensors(tmp + "/model.safetensors", weights);
  // Fault injection for the tests: die here, half-way through writing this step's checkpoint.
  if (const char* kill_at = std::getenv("ANVIL_FAULT_KILL_IN_SAVE"); kill_at && std::atoll(kill_at) == step)
    std::raise(SIGKILL);
  write_safetensors(tmp + "/optimizer.safetensors", optim);
  const std::string config_yaml = to_yaml(cfg);
  const ModelConfig& m = cfg.model;
  nlohmann::json manifest = {
      {"format", "anvil-checkpoint"}, {"version", kCheckpointVersion}, {"step", step},
      {"tokens_seen", tokens_seen}, {"seed", cfg.seed}, {"data_state", nlohmann::json::parse(data_state)},
      {"model", {{"name", m.name}, {"n_layers", m.n_layers}, {"n_heads", m.n_heads}, {"d_model", m.d_model},
                 {"vocab_size", m.vocab_size}, {"max_seq_len", m.max_seq_len}}},
      {"config", config_yaml}, {"config_xxh3", hex64(hash64(config_yaml.data(), config_yaml.size()))},
      {"weights_sha256", weights_sha256(cfg.model, state.params)}, {"tensors", tensors}};
  if (!state.grad_scales.empty()) manifest["grad_scales"] = state.grad_scales;
  write_file_atomic(tmp + "/manifest.json", manifest.dump(2) + "\n");
  fsync_dir(tmp);
  if (fs::exists(final_dir)) fs::remove_all(final_dir);  // a re-save of the same step
  fs::rename(tmp, final_dir);
  fsync_dir(ckpt_root);
  write_file_atomic(ckpt_root + "/latest", name + "\n");
  return final_dir;
}

CheckpointWriter::~CheckpointWriter() {
  if (thread_.joinable()) thread_.join();
}

void CheckpointWriter::save(const std::string& run_dir, int64_t step, int64_t tokens_seen, const TrainConfig& cfg,
                            std::vector<float> params, std::vector<float> exp_avg, std::vector<float> exp_avg_sq,
                            int64_t optimizer_steps, std::vector<int> grad_scales, std::string data_state, int keep) {
  wait();
  thread_ = std::thread([this, run_dir, step, tokens_seen, cfg, params = std::move(params),
                         exp_avg = std::move(exp_avg), exp_avg_sq = std::move(exp_avg_sq), optimizer_steps,
                         grad_scales = std::move(grad_scales), data_state = std::move(data_state), keep] {
    try {
      dir_ = save_checkpoint(run_dir, step, tokens_seen, cfg,
                             {params.data(), exp_avg.data(), exp_avg_sq.data(), optimizer_steps, grad_scales},
                             data_state);
      prune_checkpoints(run_dir, keep);
    } catch (...) {
      error_ = std::current_exception();
    }
  });
}

std::string CheckpointWriter::wait() {
  if (thread_.joinable()) thread_.join();
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
  return dir_;
}

namespace {

std::string resolve_checkpoint_dir(const std::string& path) {
  for (const std::string& root : {path + "/checkpoints", path}) {
    if (fs::is_regular_file(root + "/latest")) {
      std::string name = read_file(root + "/latest", "checkpoint pointer");
      while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
      return root + "/" + name;
    }
  }
  return path;
}

// The tensor's bytes, checked against the manifest's checksum.
const SafeTensor& verified(const SafeTensorsFile& file, const std::string& name, const std::vector<int64_t>& shape,
                           const nlohmann::json& checksums, const std::string& dir) {
  const auto it = file.tensors.find(name);
  ANVIL_CHECK(it != file.tensors.end(), "checkpoint '{}' is incomplete: tensor '{}' is missing", dir, name);
  const SafeTensor& st = it->second;
  ANVIL_CHECK(st.shape == shape, "checkpoint '{}': tensor '{}' has the wrong shape", dir, name);
  const auto want = checksums.find(name);
  ANVIL_CHECK(want != checksums.end() && *want == hex64(hash64(st.data.data(), st.data.size())),
              "checkpoint '{}' is corrupt: tensor '{}' does not match its checksum in the manifest", dir, name);
  return st;
}

}  // namespace

LoadedCheckpoint load_checkpoint(const std::string& path, bool with_optimizer) {
  const std::string dir = resolve_checkpoint_dir(path);
  const std::string manifest_path = dir + "/manifest.json";
  ANVIL_CHECK(fs::is_regular_file(manifest_path), "'{}' is not a checkpoint: no manifest.json (expected a checkpoint "
              "directory or a run directory with checkpoints/latest)", path);
  LoadedCheckpoint out;
  out.dir = dir;
  nlohmann::json manifest;
  std::map<std::string, std::string> checksums;
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
    out.tokens_seen = manifest.at("tokens_seen").get<int64_t>();
    out.data_state = manifest.at("data_state").dump();
    out.config_yaml = manifest.at("config").get<std::string>();
    if (manifest.contains("grad_scales")) out.grad_scales = manifest.at("grad_scales").get<std::vector<int>>();
    for (const auto& entry : manifest.at("tensors"))
      checksums[entry.at("name").get<std::string>()] = entry.at("xxh3").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    ANVIL_FAIL("checkpoint manifest '{}' is malformed: {}", manifest_path, e.what());
  }
  const nlohmann::json sums(checksums);
  const std::vector<ParamTensor> layout = gpt2_param_layout(out.config);
  const size_t n = gpt2_num_params(out.config);
  const SafeTensorsFile weights = read_safetensors(dir + "/model.safetensors");
  out.params.resize(n);
  for (const ParamTensor& t : layout)
    std::copy_n(verified(weights, t.name, t.shape, sums, dir).f32(), t.numel, out.params.data() + t.offset);
  if (!with_optimizer) return out;
  const SafeTensorsFile optim = read_safetensors(dir + "/optimizer.safetensors");
  out.exp_avg.resize(n);
  out.exp_avg_sq.resize(n);
  for (const ParamTensor& t : layout) {
    std::copy_n(verified(optim, "exp_avg." + t.name, t.shape, sums, dir).f32(), t.numel, out.exp_avg.data() + t.offset);
    std::copy_n(verified(optim, "exp_avg_sq." + t.name, t.shape, sums, dir).f32(), t.numel,
                out.exp_avg_sq.data() + t.offset);
  }
  const auto steps = optim.metadata.find("steps_taken");
  ANVIL_CHECK(steps != optim.metadata.end(), "checkpoint '{}': optimizer.safetensors has no steps_taken", dir);
  out.optimizer_steps = std::stoll(steps->second);
  return out;
}

std::vector<std::string> list_checkpoints(const std::string& run_dir) {
  std::vector<std::string> names;
  const fs::path root = fs::path(run_dir) / "checkpoints";
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return {};
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name.rfind("step-", 0) == 0) names.push_back(name);
  }
  std::sort(names.rbegin(), names.rend());  // zero-padded steps: newest first
  for (std::string& n : names) n = (root / n).string();
  return names;
}

void prune_checkpoints(const std::string& run_dir, int keep) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return;
  for (const auto& e : fs::directory_iterator(root, ec))
    if (e.is_directory() && e.path().filename().string().rfind(".step-", 0) == 0) fs::remove_all(e.path(), ec);
  if (keep <= 0) return;
  const std::vector<std::string> all = list_checkpoints(run_dir);
  for (size_t i = static_cast<size_t>(keep); i < all.size(); i++) fs::remove_all(all[i], ec);
}

std::string weights_sha256(const ModelConfig& cfg, const float* params) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  for (const ParamTensor& t : gpt2_param_layout(cfg)) EVP_DigestUpdate(ctx, params + t.offset, t.numel * sizeof(float));
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, digest, &len);
  EVP_MD_CTX_free(ctx);
  std::string hex;
  for (unsigned int i = 0; i < len; i++) hex += fmt::format("{:02x}", digest[i]);
  return hex;
}

}  // namespace anvil
