// Checkpoints (src/ckpt): what a save of any world size writes, a load reassembles whole and
// verifies, and what a damaged checkpoint does (an error naming what is wrong, never wrong
// weights). The end-to-end resume tests (tests/train, tests/parallel) run these through training.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "config/train_config.h"
#include "core/error.h"
#include "model/model.h"

namespace anvil {
namespace {
namespace fs = std::filesystem;

struct TempDir {
  std::string path;
  TempDir() {
    char name[] = "/tmp/anvil-test-ckpt-XXXXXX";
    path = mkdtemp(name);
  }
  ~TempDir() { fs::remove_all(path); }
};

TrainConfig small_config() {
  TrainConfig c;
  c.max_seq_len = 16;
  c.model = {2, 2, 32, 97, 16};
  return c;
}

// Distinct values per slot, so that a piece put back in the wrong place shows.
std::vector<float> values(size_t n, float base) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = base + 0.001f * static_cast<float>(i);
  return v;
}

struct State {
  std::vector<float> params, exp_avg, exp_avg_sq;
  explicit State(const ModelConfig& m, float base = 0.0f)
      : params(values(model_num_params(m), base)),
        exp_avg(values(params.size(), base + 1.0f)),
        exp_avg_sq(values(params.size(), base + 2.0f)) {}
};

CheckpointInfo info_at(int64_t step) {
  CheckpointInfo info;
  info.step = step;
  info.tokens_seen = 1000 * step;
  info.optimizer_steps = step;
  info.grad_scales = {3, -2};
  info.data_state = R"({"epoch": 1, "sample": 42})";
  return info;
}

// Saves `state` as `world` ranks do (rank r the r-th of world even ranges), as step `step`.
std::string save(const std::string& checkpoints, const TrainConfig& cfg, int world, const State& state, int64_t step) {
  const std::string tmp = checkpoint_temp_dir(checkpoints, step);
  fs::create_directories(tmp);
  const size_t n = state.params.size();
  for (int r = 0; r < world; r++) {
    CheckpointShard shard;
    shard.rank = r, shard.world = world;
    shard.lo = n * r / world, shard.hi = n * (r + 1) / world;
    const auto part = [&](const std::vector<float>& v) {
      return std::vector<float>(v.begin() + static_cast<long>(shard.lo), v.begin() + static_cast<long>(shard.hi));
    };
    shard.params = part(state.params), shard.exp_avg = part(state.exp_avg), shard.exp_avg_sq = part(state.exp_avg_sq);
    write_checkpoint_shard(tmp, cfg.model, shard, step);
  }
  return finalize_checkpoint(checkpoints, world, cfg, info_at(step));
}

// The message of the anvil::Error that loading `path` throws ("" when it loads).
std::string load_error(const std::string& path) {
  try {
    load_checkpoint(path, true);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Checkpoint, AnyWorldSizeLoadsWhole) {
  const TrainConfig cfg = small_config();
  const State state(cfg.model);
  for (int world : {1, 3, 7}) {
    TempDir dir;
    const std::string saved = save(dir.path, cfg, world, state, 5);
    const LoadedCheckpoint c = load_checkpoint(saved, true);
    EXPECT_EQ(c.params, state.params) << world << " ranks";
    EXPECT_EQ(c.exp_avg, state.exp_avg);
    EXPECT_EQ(c.exp_avg_sq, state.exp_avg_sq);
    EXPECT_EQ(c.step, 5);
    EXPECT_EQ(c.tokens_seen, 5000);
    EXPECT_EQ(c.optimizer_steps, 5);
    EXPECT_EQ(c.grad_scales, (std::vector<int>{3, -2}));
    EXPECT_EQ(c.saved_world_size, world);
    EXPECT_EQ(nlohmann::json::parse(c.data_state), nlohmann::json::parse(info_at(5).data_state));
    EXPECT_EQ(c.weights_sha256, weights_sha256(cfg.model, state.params.data()));
    EXPECT_EQ(c.config.n_layers, cfg.model.n_layers);
  }
}

TEST(Checkpoint, TensorReaderReassemblesAcrossShards) {
  const TrainConfig cfg = small_config();
  const State state(cfg.model);
  TempDir dir;
  CheckpointTensorReader reader(save(dir.path, cfg, 3, state, 2));
  for (const ParamTensor& t : model_param_layout(cfg.model)) {
    const auto begin = state.params.begin() + static_cast<long>(t.offset);
    EXPECT_EQ(reader.tensor(t.name), std::vector<float>(begin, begin + static_cast<long>(t.numel))) << t.name;
  }
}

TEST(Checkpoint, LatestIsTheNewestSave) {
  const TrainConfig cfg = small_config();
  TempDir dir;
  save(dir.path, cfg, 2, State(cfg.model, 0.0f), 4);
  save(dir.path, cfg, 1, State(cfg.model, 5.0f), 8);
  const LoadedCheckpoint c = load_checkpoint(dir.path, false);  // the checkpoints directory: `latest`
  EXPECT_EQ(c.step, 8);
  EXPECT_EQ(c.params, State(cfg.model, 5.0f).params);
}

TEST(Checkpoint, CorruptShardIsAnError) {
  const TrainConfig cfg = small_config();
  TempDir dir;
  const std::string saved = save(dir.path, cfg, 2, State(cfg.model), 3);
  const std::string shard = saved + "/shard-00001-of-00002.safetensors";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-6, std::ios::end);
    char byte = 0;
    f.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x10);
    f.seekp(-6, std::ios::end);
    f.write(&byte, 1);
  }
  const std::string error = load_error(saved);
  EXPECT_NE(error.find("corrupt"), std::string::npos) << error;
  EXPECT_NE(error.find("shard-00001-of-00002"), std::string::npos) << error;
}

TEST(Checkpoint, TruncatedShardIsAnError) {
  const TrainConfig cfg = small_config();
  TempDir dir;
  const std::string saved = save(dir.path, cfg, 2, State(cfg.model), 3);
  const std::string shard = saved + "/shard-00000-of-00002.safetensors";
  fs::resize_file(shard, fs::file_size(shard) / 2);
  const std::string error = load_error(saved);
  EXPECT_NE(error.find("shard-00000-of-00002"), std::string::npos) << error;
}

TEST(Checkpoint, MissingShardIsAnError) {
  const TrainConfig cfg = small_config();
  TempDir dir;
  const std::string saved = save(dir.path, cfg, 2, State(cfg.model), 3);
  fs::remove(saved + "/shard-00001-of-00002.safetensors");
  const std::string error = load_error(saved);
  EXPECT_NE(error.find("incomplete"), std::string::npos) << error;
  EXPECT_NE(error.find("shard-00001-of-00002"), std::string::npos) << error;
}

TEST(Checkpoint, ManifestWeightsDigestIsChecked) {
  const TrainConfig cfg = small_config();
  TempDir dir;
  const std::string saved = save(dir.path, cfg, 1, State(cfg.model), 3);
  const std::string manifest = saved + "/manifest.json";
  std::ifstream in(manifest);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  const size_t at = text.find("\"weights_sha256\": \"") + 19;
  text[at] = text[at] == '0' ? '1' : '0';
  std::ofstream(manifest) << text;
  const std::string error = load_error(saved);
  EXPECT_NE(error.find("corrupt"), std::string::npos) << error;
}

TEST(Checkpoint, ListingSkipsInterruptedSavesAndPruningKeepsTheNewest) {
  const TrainConfig cfg = small_config();
  TempDir dir;
  for (int64_t step : {1, 2, 3}) save(dir.path, cfg, 1, State(cfg.model), step);
  const std::string interrupted = checkpoint_temp_dir(dir.path, 4);
  fs::create_directories(interrupted);
  std::ofstream(interrupted + "/shard-00000.json") << "{}";
  std::vector<std::string> names;
  for (const std::string& c : list_checkpoints(dir.path)) names.push_back(fs::path(c).filename().string());
  EXPECT_EQ(names, (std::vector<std::string>{"step-00000003", "step-00000002", "step-00000001"}));
  prune_checkpoints(dir.path, 2);
  names.clear();
  for (const std::string& c : list_checkpoints(dir.path)) names.push_back(fs::path(c).filename().string());
  EXPECT_EQ(names, (std::vector<std::string>{"step-00000003", "step-00000002"}));
  EXPECT_FALSE(fs::exists(interrupted));
  EXPECT_EQ(load_checkpoint(dir.path, false).step, 3);
}

}  // namespace
}  // namespace anvil
