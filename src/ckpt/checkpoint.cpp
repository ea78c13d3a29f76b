// Checkpoint save (shards into a temporary directory, fsync, rename, then `latest`) and load
// (checksums verified, shards reassembled).
#include "ckpt/checkpoint.h"

#include <unistd.h>

#include <csignal>
#include <cstdlib>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "ckpt/safetensors.h"
#include "config/model_section.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/fs.h"
#include "core/log.h"
#include "core/sha256.h"
#include "model/model.h"

namespace anvil {
namespace fs = std::filesystem;

namespace {

std::string shard_file_name(int rank, int world) { return fmt::format("shard-{:05d}-of-{:05d}.safetensors", rank, world); }
std::string shard_pieces_name(int rank) { return fmt::format("shard-{:05d}.json", rank); }

}  // namespace

std::string checkpoint_temp_dir(const std::string& checkpoints_dir, int64_t step) {
  return fmt::format("{}/.step-{:08d}.tmp", checkpoints_dir, step);  // not a step-* name: never listed
}

void write_checkpoint_shard(const std::string& temp_dir, const ModelConfig& model, const CheckpointShard& shard,
                            int64_t step, std::atomic<int64_t>* bytes_written) {
  ANVIL_CHECK(shard.params.size() == shard.hi - shard.lo && shard.exp_avg.size() == shard.params.size() &&
                  shard.exp_avg_sq.size() == shard.params.size(),
              "checkpoint shard {} holds {} values for the range [{}, {})", shard.rank, shard.params.size(), shard.lo,
              shard.hi);
  // Tensor by tensor from the shard's own buffers, laid out in name order.
  std::map<std::string, std::pair<const float*, size_t>> tensors;
  nlohmann::json pieces = nlohmann::json::array();
  for (const ParamTensor& t : model_param_layout(model)) {
    const size_t a = std::max(shard.lo, t.offset), b = std::min(shard.hi, t.offset + t.numel);
    if (a >= b) continue;
    for (const auto& [prefix, values] : {std::pair<std::string, const std::vector<float>*>{"", &shard.params},
                                         {"exp_avg.", &shard.exp_avg},
                                         {"exp_avg_sq.", &shard.exp_avg_sq}}) {
      const float* data = values->data() + (a - shard.lo);
      tensors[prefix + t.name] = {data, b - a};
      pieces.push_back({{"name", prefix + t.name}, {"offset", a - t.offset}, {"numel", b - a},
                        {"xxh3", hex64(hash64(data, (b - a) * sizeof(float)))}});
    }
  }
  std::vector<SafeTensorsWriter::Declared> declared;
  for (const auto& [name, t] : tensors) declared.push_back({name, "F32", {static_cast<int64_t>(t.second)}});
  SafeTensorsWriter writer(temp_dir + "/" + shard_file_name(shard.rank, shard.world), std::move(declared),
                           {{"range", fmt::format("{}-{}", shard.lo, shard.hi)}});
  for (const auto& [name, t] : tensors) {
    writer.write(name, t.first, t.second * sizeof(float));
    if (bytes_written) *bytes_written += static_cast<int64_t>(t.second * sizeof(float));
  }
  writer.commit();
  // Fault injection for the tests: die here, half-way through writing this step's checkpoint.
  if (const char* kill_at = std::getenv("ANVIL_FAULT_KILL_IN_SAVE"); kill_at && std::atoll(kill_at) == step)
    std::raise(SIGKILL);
  const nlohmann::json entry = {{"file", shard_file_name(shard.rank, shard.world)}, {"lo", shard.lo},
                                {"hi", shard.hi}, {"pieces", pieces}};
  write_file_atomic(temp_dir + "/" + shard_pieces_name(shard.rank), entry.dump() + "\n");
}

std::string finalize_checkpoint(const std::string& checkpoints_dir, int world, const TrainConfig& cfg,
                                const CheckpointInfo& info) {
  const std::string& ckpt_root = checkpoints_dir;
  const std::string name = fmt::format("step-{:08d}", info.step);
  const std::string final_dir = ckpt_root + "/" + name;
  const std::string tmp = checkpoint_temp_dir(checkpoints_dir, info.step);
  nlohmann::json shards = nlohmann::json::array();
  Sha256 weights;  // the parameters in flat order: shard after shard, piece after piece
  for (int r = 0; r < world; r++) {
    const std::string pieces_path = tmp + "/" + shard_pieces_name(r);
    ANVIL_CHECK(fs::is_regular_file(pieces_path), "checkpoint of step {}: rank {} did not write its shard", info.step, r);
    nlohmann::json entry = nlohmann::json::parse(read_file(pieces_path, "checkpoint shard list"));
    const SafeTensorsHeader file = read_safetensors_header(tmp + "/" + entry.at("file").get<std::string>());
    for (const auto& piece : entry.at("pieces")) {
      const std::string piece_name = piece.at("name").get<std::string>();
      if (piece_name.rfind("exp_avg", 0) == 0) continue;
      const SafeTensor st = read_safetensor(file, piece_name);
      weights.update(st.data.data(), st.data.size());
    }
    shards.push_back(std::move(entry));
  }
  nlohmann::json tensors = nlohmann::json::array();
  for (const ParamTensor& t : model_param_layout(cfg.model))
    tensors.push_back({{"name", t.name}, {"shape", t.shape}, {"dtype", "F32"}});
  const std::string config_yaml = to_yaml(cfg);
  const ModelConfig& m = cfg.model;
  nlohmann::json manifest = {
      {"format", "anvil-checkpoint"}, {"version", kCheckpointVersion}, {"step", info.step},
      {"tokens_seen", info.tokens_seen}, {"seed", cfg.seed}, {"data_state", nlohmann::json::parse(info.data_state)},
      {"model", {{"name", choice_name(m.name)}, {"n_layers", m.n_layers}, {"n_heads", m.n_heads},
                 {"d_model", m.d_model},
                 {"vocab_size", m.vocab_size}, {"max_seq_len", m.max_seq_len}}},
      {"config", config_yaml}, {"config_xxh3", hex64(hash64(config_yaml.data(), config_yaml.size()))},
      {"optimizer_steps", info.optimizer_steps}, {"weights_sha256", weights.hex()}, {"tensors", tensors},
      {"world_size", world}, {"shards", shards}};
  if (!info.grad_scales.empty()) manifest["grad_scales"] = info.grad_scales;
  if (!info.loss_scaler.empty()) manifest["loss_scaler"] = nlohmann::json::parse(info.loss_scaler);
  if (m.has_lora()) {
    ANVIL_CHECK(!info.lora_base.path.empty(), "a LoRA checkpoint must name its base");
    manifest["lora_base"] = {{"path", info.lora_base.path}, {"weights_sha256", info.lora_base.weights_sha256}};
  }
  write_file_atomic(tmp + "/manifest.json", manifest.dump(2) + "\n");
  for (int r = 0; r < world; r++) fs::remove(tmp + "/" + shard_pieces_name(r));  // now in the manifest
  fsync_dir(tmp);
  if (fs::exists(final_dir)) fs::remove_all(final_dir);  // a re-save of the same step
  fs::rename(tmp, final_dir);
  fsync_dir(ckpt_root);
  write_file_atomic(ckpt_root + "/latest", name + "\n");
  return final_dir;
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

}  // namespace

namespace {

// One piece of a shard file: `offset`..`offset + numel` of tensor `tensor` (or of its moment).
struct ManifestPiece {
  std::string name;    // the name in the shard file
  std::string tensor;  // the model tensor
  enum Kind { kParam, kExpAvg, kExpAvgSq } kind = kParam;
  size_t offset = 0, numel = 0;
  std::string xxh3;
  size_t shard = 0;  // index into Manifest::files
};

// A checkpoint's manifest, parsed and checked: everything but the tensors' values, and where
// each piece of them lies.
struct Manifest {
  LoadedCheckpoint meta;  // params and moments left empty
  std::vector<std::string> files;  // the shard files, in rank order
  std::vector<ManifestPiece> pieces;
};

Manifest read_manifest(const std::string& path) {
  const std::string dir = resolve_checkpoint_dir(path);
  const std::string manifest_path = dir + "/manifest.json";
  ANVIL_CHECK(fs::is_regular_file(manifest_path), "'{}' is not a checkpoint: no manifest.json (expected a checkpoint "
              "directory or a run directory with checkpoints/latest)", path);
  Manifest out;
  LoadedCheckpoint& meta = out.meta;
  meta.dir = dir;
  try {
    const nlohmann::json manifest = nlohmann::json::parse(read_file(manifest_path, "checkpoint manifest"));
    ANVIL_CHECK(manifest.at("format") == "anvil-checkpoint", "'{}' is not an anvil checkpoint manifest", manifest_path);
    const int version = manifest.at("version").get<int>();
    ANVIL_CHECK(version <= kCheckpointVersion, "checkpoint '{}' has format version {}, newer than this anvil reads ({}); "
                "upgrade anvil", dir, version, kCheckpointVersion);
    ANVIL_CHECK(version == kCheckpointVersion, "checkpoint '{}' has format version {}, from an earlier anvil; this "
                "anvil reads version {} only", dir, version, kCheckpointVersion);
    const auto& m = manifest.at("model");
    const std::string family = m.at("name").get<std::string>();
    ANVIL_CHECK(parse_choice(family, &meta.config.name), "checkpoint '{}' holds a model of family '{}', which this "
                "anvil does not know (it knows {})", dir, family, choice_list<ModelFamily>());
    meta.config.n_layers = m.at("n_layers").get<int>();
    meta.config.n_heads = m.at("n_heads").get<int>();
    meta.config.d_model = m.at("d_model").get<int>();
    meta.config.vocab_size = m.at("vocab_size").get<int>();
    meta.config.max_seq_len = m.at("max_seq_len").get<int>();
    meta.step = manifest.at("step").get<int64_t>();
    meta.tokens_seen = manifest.at("tokens_seen").get<int64_t>();
    meta.data_state = manifest.at("data_state").dump();
    meta.config_yaml = manifest.at("config").get<std::string>();
    // The architecture is the config's model section (the manifest's model entry summarises it).
    {
      YAML::Node root;
      try {
        root = YAML::Load(meta.config_yaml);
      } catch (const YAML::Exception& e) {
        ANVIL_FAIL("checkpoint manifest '{}' holds a config that is not valid YAML: {}", manifest_path, e.msg);
      }
      ANVIL_CHECK(root.IsMap() && root["model"] && root["model"].IsMap(), "checkpoint manifest '{}' holds a config "
                  "without a model section", manifest_path);
      const std::string where = manifest_path + " (its config)";
      MapReader section(root["model"], "model", where);
      ModelConfig from_config;
      read_model_section(section, from_config);
      ANVIL_CHECK(from_config.name == meta.config.name && from_config.n_layers == meta.config.n_layers &&
                      from_config.n_heads == meta.config.n_heads && from_config.d_model == meta.config.d_model &&
                      from_config.vocab_size == meta.config.vocab_size &&
                      from_config.max_seq_len == meta.config.max_seq_len,
                  "checkpoint manifest '{}' is inconsistent: its model entry and its config's model section "
                  "describe different models", manifest_path);
      meta.config = from_config;
    }
    if (manifest.contains("grad_scales")) meta.grad_scales = manifest.at("grad_scales").get<std::vector<int>>();
    if (manifest.contains("loss_scaler")) meta.loss_scaler = manifest.at("loss_scaler").dump();
    if (meta.config.has_lora()) {
      ANVIL_CHECK(manifest.contains("lora_base"), "checkpoint '{}' holds LoRA adapters but does not name their base "
                  "(manifest key lora_base)", dir);
      meta.lora_base.path = manifest.at("lora_base").at("path").get<std::string>();
      meta.lora_base.weights_sha256 = manifest.at("lora_base").at("weights_sha256").get<std::string>();
    }
    meta.optimizer_steps = manifest.at("optimizer_steps").get<int64_t>();
    const nlohmann::json& shards = manifest.at("shards");
    meta.saved_world_size = manifest.at("world_size").get<int>();
    meta.weights_sha256 = manifest.at("weights_sha256").get<std::string>();
    ANVIL_CHECK(shards.size() == static_cast<size_t>(meta.saved_world_size), "checkpoint '{}' lists {} shards, but "
                "was saved by {} ranks (one shard each)", dir, shards.size(), meta.saved_world_size);

    std::map<std::string, const ParamTensor*> by_name;
    const std::vector<ParamTensor> layout = model_param_layout(meta.config);
    for (const ParamTensor& t : layout) by_name[t.name] = &t;
    const size_t n = model_num_params(meta.config);
    // The shards must tile the flat range [0, n) in order.
    size_t covered = 0;
    for (const auto& shard : shards) {
      const std::string file_name = shard.at("file").get<std::string>();
      const size_t lo = shard.at("lo").get<size_t>(), hi = shard.at("hi").get<size_t>();
      ANVIL_CHECK(lo == covered && hi >= lo && hi <= n, "checkpoint '{}': shard '{}' covers [{}, {}), expected it to "
                  "start at {} within {} parameters", dir, file_name, lo, hi, covered, n);
      covered = hi;
      ANVIL_CHECK(fs::is_regular_file(dir + "/" + file_name), "checkpoint '{}' is incomplete: shard file '{}' is "
                  "missing (the manifest lists {} shards)", dir, file_name, shards.size());
      out.files.push_back(dir + "/" + file_name);
      for (const auto& p : shard.at("pieces")) {
        ManifestPiece piece;
        piece.name = p.at("name").get<std::string>();
        const bool avg = piece.name.rfind("exp_avg.", 0) == 0, avg_sq = piece.name.rfind("exp_avg_sq.", 0) == 0;
        piece.kind = avg ? ManifestPiece::kExpAvg : avg_sq ? ManifestPiece::kExpAvgSq : ManifestPiece::kParam;
        piece.tensor = piece.name.substr(avg ? 8 : avg_sq ? 11 : 0);
        const auto t = by_name.find(piece.tensor);
        ANVIL_CHECK(t != by_name.end(), "checkpoint '{}': shard '{}' holds '{}', which the model has no tensor for",
                    dir, file_name, piece.name);
        piece.offset = p.at("offset").get<size_t>();
        piece.numel = p.at("numel").get<size_t>();
        ANVIL_CHECK(piece.offset + piece.numel <= t->second->numel, "checkpoint '{}': piece '{}' of shard '{}' lies "
                    "outside the tensor", dir, piece.name, file_name);
        piece.xxh3 = p.at("xxh3").get<std::string>();
        piece.shard = out.files.size() - 1;
        out.pieces.push_back(std::move(piece));
      }
    }
    ANVIL_CHECK(covered == n, "checkpoint '{}': its shards cover {} of the model's {} parameters", dir, covered, n);
  } catch (const nlohmann::json::exception& e) {
    ANVIL_FAIL("checkpoint manifest '{}' is malformed: {}", manifest_path, e.what());
  }
  return out;
}

// A piece's values read into dest (piece.numel floats), checked against the manifest's checksum.
void read_piece(const Manifest& m, const SafeTensorsHeader& file, const ManifestPiece& piece, float* dest) {
  const std::string& dir = m.meta.dir;
  const std::string file_name = fs::path(file.path).filename().string();
  const auto entry = file.tensors.find(piece.name);
  ANVIL_CHECK(entry != file.tensors.end(), "checkpoint '{}' is incomplete: shard '{}' has no tensor '{}'", dir,
              file_name, piece.name);
  ANVIL_CHECK(entry->second.dtype == "F32" && entry->second.shape == std::vector<int64_t>{static_cast<int64_t>(piece.numel)},
              "checkpoint '{}': tensor '{}' of shard '{}' has the wrong shape or dtype", dir, piece.name, file_name);
  read_safetensor_into(file, piece.name, dest, piece.numel * sizeof(float));
  ANVIL_CHECK(piece.xxh3 == hex64(hash64(dest, piece.numel * sizeof(float))), "checkpoint '{}' is corrupt: tensor "
              "'{}' of shard '{}' does not match its checksum in the manifest", dir, piece.name, file_name);
}

}  // namespace

LoadedCheckpoint load_checkpoint(const std::string& path, bool with_optimizer, bool show_progress) {
  Manifest m = read_manifest(path);
  LoadedCheckpoint out = m.meta;
  std::map<std::string, const ParamTensor*> by_name;
  const std::vector<ParamTensor> layout = model_param_layout(out.config);
  for (const ParamTensor& t : layout) by_name[t.name] = &t;
  const size_t n = model_num_params(out.config);
  out.params.assign(n, 0.0f);
  if (with_optimizer) {
    out.exp_avg.assign(n, 0.0f);
    out.exp_avg_sq.assign(n, 0.0f);
  }
  // Every piece is checked against its checksum and copied to its place in the whole tensor.
  std::vector<std::optional<SafeTensorsHeader>> headers(m.files.size());
  int64_t total = 0, done = 0;
  for (const ManifestPiece& piece : m.pieces)
    if (piece.kind == ManifestPiece::kParam || with_optimizer) total += static_cast<int64_t>(piece.numel * sizeof(float));
  std::optional<Progress> bar;
  if (show_progress) bar.emplace("load", total, "B");
  for (const ManifestPiece& piece : m.pieces) {
    if (piece.kind != ManifestPiece::kParam && !with_optimizer) continue;
    if (!headers[piece.shard]) headers[piece.shard] = read_safetensors_header(m.files[piece.shard]);
    std::vector<float>& whole = piece.kind == ManifestPiece::kExpAvg     ? out.exp_avg
                                : piece.kind == ManifestPiece::kExpAvgSq ? out.exp_avg_sq
                                                                         : out.params;
    read_piece(m, *headers[piece.shard], piece, whole.data() + by_name.at(piece.tensor)->offset + piece.offset);
    done += static_cast<int64_t>(piece.numel * sizeof(float));
    if (bar) bar->update(done, out.dir);
  }
  ANVIL_CHECK(weights_sha256(out.config, out.params.data()) == m.meta.weights_sha256, "checkpoint '{}' is corrupt: the weights "
              "reassembled from its shards do not match the manifest's weights_sha256", out.dir);
  if (bar) bar->finish(out.dir);
  return out;
}

struct CheckpointTensorReader::State {
  Manifest manifest;
  std::vector<std::optional<SafeTensorsHeader>> headers;  // read when first needed
  std::map<std::string, ParamTensor> layout;
};

CheckpointTensorReader::CheckpointTensorReader(const std::string& path) : state_(std::make_unique<State>()) {
  state_->manifest = read_manifest(path);
  state_->headers.resize(state_->manifest.files.size());
  for (const ParamTensor& t : model_param_layout(state_->manifest.meta.config)) state_->layout.emplace(t.name, t);
}

CheckpointTensorReader::~CheckpointTensorReader() = default;

const LoadedCheckpoint& CheckpointTensorReader::info() const { return state_->manifest.meta; }

std::vector<float> CheckpointTensorReader::tensor(const std::string& name) {
  const auto t = state_->layout.find(name);
  ANVIL_CHECK(t != state_->layout.end(), "checkpoint '{}' has no tensor '{}'", info().dir, name);
  std::vector<float> out(t->second.numel);
  size_t filled = 0;
  for (const ManifestPiece& piece : state_->manifest.pieces) {
    if (piece.kind != ManifestPiece::kParam || piece.tensor != name) continue;
    std::optional<SafeTensorsHeader>& header = state_->headers[piece.shard];
    if (!header) header = read_safetensors_header(state_->manifest.files[piece.shard]);
    read_piece(state_->manifest, *header, piece, out.data() + piece.offset);
    filled += piece.numel;
  }
  // The shards tile the flat range, so the pieces of a tensor cover it exactly once.
  ANVIL_CHECK(filled == out.size(), "checkpoint '{}': the pieces of '{}' cover {} of its {} values", info().dir, name,
              filled, out.size());
  return out;
}

std::vector<std::string> list_checkpoints(const std::string& checkpoints_dir) {
  std::vector<std::string> names;
  const fs::path root(checkpoints_dir);
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

void prune_checkpoints(const std::string& checkpoints_dir, int keep) {
  const fs::path root(checkpoints_dir);
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return;
  for (const auto& e : fs::directory_iterator(root, ec))
    if (e.is_directory() && e.path().filename().string().rfind(".step-", 0) == 0) fs::remove_all(e.path(), ec);
  if (keep <= 0) return;
  const std::vector<std::string> all = list_checkpoints(checkpoints_dir);
  for (size_t i = static_cast<size_t>(keep); i < all.size(); i++) fs::remove_all(all[i], ec);
}

std::string weights_sha256(const ModelConfig& cfg, const float* params) {
  Sha256 sha;
  for (const ParamTensor& t : model_param_layout(cfg)) sha.update(params + t.offset, t.numel * sizeof(float));
  return sha.hex();
}

}  // namespace anvil
