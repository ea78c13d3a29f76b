// Workers build whole rank batches: step c goes to slot c mod (number of slots), and next() hands
// the slots out in step order, so the result never depends on which worker built what.
#include "data/loader.h"

#include <algorithm>
#include <numeric>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/targets.h"

namespace anvil {

std::string DataState::to_json() const {
  nlohmann::json j = {{"epoch", epoch}, {"sample_in_epoch", sample_in_epoch}, {"global_batch", global_batch},
                      {"shuffle", shuffle}, {"shuffle_algo", algo}, {"shuffle_seed", seed},
                      {"shuffle_block_size", block_size}, {"num_canonical_nodes", canonical_nodes},
                      {"epoch_size", epoch_size}, {"stream_names", stream_names},
                      {"stream_proportions", stream_proportions}, {"stream_samples", stream_samples},
                      {"order_fingerprint", fingerprint}};
  return j.dump();
}

DataState DataState::from_json(const std::string& text, const std::string& where) {
  try {
    const auto j = nlohmann::json::parse(text);
    DataState s;
    s.epoch = j.at("epoch");
    s.sample_in_epoch = j.at("sample_in_epoch");
    s.global_batch = j.at("global_batch");
    s.shuffle = j.at("shuffle");
    s.algo = j.at("shuffle_algo");
    s.seed = j.at("shuffle_seed");
    s.block_size = j.at("shuffle_block_size");
    s.canonical_nodes = j.at("num_canonical_nodes");
    s.epoch_size = j.at("epoch_size");
    s.stream_names = j.at("stream_names").get<std::vector<std::string>>();
    s.stream_proportions = j.at("stream_proportions").get<std::vector<double>>();
    s.stream_samples = j.at("stream_samples").get<std::vector<int64_t>>();
    s.fingerprint = j.at("order_fingerprint");
    return s;
  } catch (const std::exception& e) {
    ANVIL_FAIL("{}: malformed data state ({})", where, e.what());
  }
}

namespace {

void check_vocabulary(const int32_t* ids, size_t n, int vocab_size, int64_t id) {
  if (vocab_size <= 0) return;
  for (size_t i = 0; i < n; i++)
    ANVIL_CHECK(ids[i] >= 0 && ids[i] < vocab_size, "sample {} holds token id {}, outside the model's vocabulary of "
                "{} (was the data prepared with another tokenizer?)", id, ids[i], vocab_size);
}

// Fine-tuning sample `id` stitched, cut to seq_len tokens, its ids checked.
Stitched load_stitched(StreamingDataset& data, int64_t id, int seq_len, int vocab_size,
                       const FinetuningExamples& finetuning) {
  const std::vector<Turn> turns = parse_turns_json(data.sample_json(id), fmt::format("sample {}", id));
  Stitched s = stitch_turns(turns, finetuning.targets, finetuning.eos_id);
  if (s.tokens.size() > static_cast<size_t>(seq_len)) {
    s.tokens.resize(static_cast<size_t>(seq_len));
    s.labels.resize(static_cast<size_t>(seq_len));
  }
  check_vocabulary(s.tokens.data(), s.tokens.size(), vocab_size, id);
  return s;
}

}  // namespace

void load_example(StreamingDataset& data, int64_t id, int seq_len, int vocab_size,
                  const std::optional<FinetuningExamples>& finetuning, int32_t* inputs, int32_t* targets) {
  const int T = seq_len;
  if (data.kind() == MdsSampleKind::kTurns) {
    ANVIL_CHECK(finetuning.has_value(), "the dataset holds fine-tuning examples (prompt and response turns): read "
                "it with a loader named finetuning");
    finetuning_example(load_stitched(data, id, T, vocab_size, *finetuning), T, inputs, targets);
    return;
  }
  ANVIL_CHECK(!finetuning.has_value(), "the dataset holds token sequences (pretraining text), not fine-tuning "
              "examples: read it with a loader named text, or prepare the records with `anvil data prepare "
              "--format finetuning`");
  std::vector<int32_t> scratch(static_cast<size_t>(T) + 1);
  const int64_t len = std::min<int64_t>(data.tokens(id, scratch.data(), T + 1), T + 1);
  ANVIL_CHECK(len >= 2, "sample {} has {} token(s): a training example needs at least 2", id, len);
  check_vocabulary(scratch.data(), static_cast<size_t>(len), vocab_size, id);
  std::fill(scratch.begin() + len, scratch.end(), kIgnoreIndex);
  // Padding's inputs are token 0: no position before them attends to them and their targets are
  // ignored, so their value changes nothing.
  std::transform(scratch.begin(), scratch.begin() + T, inputs, [](int32_t t) { return t == kIgnoreIndex ? 0 : t; });
  std::copy(scratch.begin() + 1, scratch.end(), targets);
}

TokenLoader::TokenLoader(StreamingDataset& data, OrderSpec spec, LoaderOptions opt)
    : data_(data), spec_(std::move(spec)), opt_(opt) {
  validate_order_spec(spec_);
  ANVIL_CHECK(opt_.seq_len > 0, "the loader needs max_seq_len > 0");
  ANVIL_CHECK(opt_.world >= 1 && opt_.rank >= 0 && opt_.rank < opt_.world, "rank {} of world {} is invalid",
              opt_.rank, opt_.world);
  ANVIL_CHECK(opt_.global_batch > 0 && opt_.global_batch % opt_.world == 0,
              "global_train_batch_size {} must be a positive multiple of the world size {}", opt_.global_batch,
              opt_.world);
  ANVIL_CHECK(opt_.num_workers >= 0, "num_workers must be 0 or more, got {}", opt_.num_workers);
  ANVIL_CHECK(opt_.packing_ratio >= 1, "packing_ratio must be at least 1, got {}", opt_.packing_ratio);
  ANVIL_CHECK(!packing() || (opt_.finetuning && data_.kind() == MdsSampleKind::kTurns), "packing_ratio packs "
              "fine-tuning examples; pretraining text is packed already");
  samples_per_step_ = packing() ? std::llround(opt_.packing_ratio * static_cast<double>(opt_.global_batch))
                                : opt_.global_batch;
  const int64_t n = epoch_samples(spec_);
  steps_per_epoch_ = n / samples_per_step_;
  ANVIL_CHECK(steps_per_epoch_ >= 1, "an epoch has {} samples, fewer than one global batch of {}", n,
              samples_per_step_);
  rank_batch_ = opt_.global_batch / opt_.world;
  // Packing reads the whole step's examples on every rank.
  const int64_t per_rank = packing() ? samples_per_step_ : rank_batch_;
  const int64_t predownload = opt_.predownload > 0 ? opt_.predownload : 8 * per_rank;
  lookahead_ = std::max<int64_t>(1, (predownload + per_rank - 1) / per_rank);
  start_workers();
}

TokenLoader::~TokenLoader() { stop_workers(); }

std::shared_ptr<const std::vector<int64_t>> TokenLoader::order_for(int64_t epoch) {
  std::lock_guard lk(order_mu_);
  auto it = orders_.find(epoch);
  if (it != orders_.end()) return it->second;
  auto order = std::make_shared<const std::vector<int64_t>>(epoch_order(spec_, epoch));
  orders_[epoch] = order;
  while (orders_.size() > 2) orders_.erase(orders_.begin());
  return order;
}

void TokenLoader::fill(int64_t step, Batch& b) {
  if (packing()) return fill_packed(step, b);
  const int T = opt_.seq_len;
  auto block = [&](int64_t s, auto&& f) {
    const int64_t a = start_step_ + s;
    const auto order = order_for(start_epoch_ + a / steps_per_epoch_);
    const int64_t first = (a % steps_per_epoch_) * samples_per_step_ + opt_.rank * rank_batch_;
    for (int64_t k = 0; k < rank_batch_; k++) f(k, (*order)[first + k]);
  };
  // Queue the downloads this rank needs lookahead steps from now.
  block(step + lookahead_, [&](int64_t, int64_t id) { data_.prefetch(id); });
  b.inputs.resize(static_cast<size_t>(rank_batch_) * T);
  b.targets.resize(b.inputs.size());
  b.ids.resize(static_cast<size_t>(rank_batch_));
  block(step, [&](int64_t k, int64_t id) {
    b.ids[k] = id;
    load_example(data_, id, T, opt_.vocab_size, opt_.finetuning, b.inputs.data() + k * T, b.targets.data() + k * T);
  });
}

void TokenLoader::fill_packed(int64_t step, Batch& b) {
  const int T = opt_.seq_len;
  const int64_t K = samples_per_step_, GB = opt_.global_batch;
  auto step_ids = [&](int64_t s) {
    const int64_t a = start_step_ + s;
    const auto order = order_for(start_epoch_ + a / steps_per_epoch_);
    const int64_t first = (a % steps_per_epoch_) * K;
    return std::vector<int64_t>(order->begin() + first, order->begin() + first + K);
  };
  for (int64_t id : step_ids(step + lookahead_)) data_.prefetch(id);
  const std::vector<int64_t> ids = step_ids(step);
  std::vector<Stitched> ex;
  ex.reserve(static_cast<size_t>(K));
  for (int64_t id : ids) ex.push_back(load_stitched(data_, id, T, opt_.vocab_size, *opt_.finetuning));
  // First fit, longest first.
  std::vector<int64_t> by_length(static_cast<size_t>(K));
  std::iota(by_length.begin(), by_length.end(), 0);
  std::stable_sort(by_length.begin(), by_length.end(),
                   [&](int64_t x, int64_t y) { return ex[x].tokens.size() > ex[y].tokens.size(); });
  std::vector<int64_t> room(static_cast<size_t>(GB), T);
  std::vector<std::vector<int64_t>> bins(static_cast<size_t>(GB));
  b.packing = {};
  for (int64_t k : by_length) {
    const int64_t len = static_cast<int64_t>(ex[k].tokens.size());
    const auto it = std::find_if(room.begin(), room.end(), [&](int64_t r) { return r >= len; });
    if (it == room.end()) {
      b.packing.dropped++;
      continue;
    }
    *it -= len;
    bins[static_cast<size_t>(it - room.begin())].push_back(k);
    b.packing.examples++;
  }
  b.packing.sequences = GB;
  b.inputs.assign(static_cast<size_t>(rank_batch_) * T, 0);
  b.targets.assign(b.inputs.size(), kIgnoreIndex);
  b.positions.assign(b.inputs.size(), 0);
  b.ids.assign(static_cast<size_t>(rank_batch_), -1);
  for (int64_t j = 0; j < rank_batch_; j++) {
    std::vector<int64_t>& bin = bins[static_cast<size_t>(opt_.rank * rank_batch_ + j)];
    std::sort(bin.begin(), bin.end());
    const size_t row = static_cast<size_t>(j) * T;
    int t = 0;
    for (int64_t k : bin) {
      const int len = static_cast<int>(ex[k].tokens.size());
      finetuning_example(ex[k], len, b.inputs.data() + row + t, b.targets.data() + row + t);
      for (int p = 0; p < len; p++) b.positions[row + t + p] = p;
      t += len;
    }
    // Padding: an example of its own that nothing attends to and that carries no loss.
    for (int p = 0; t + p < T; p++) b.positions[row + t + p] = p;
    if (!bin.empty()) b.ids[j] = ids[bin.front()];
  }
}

void TokenLoader::start_workers() {
  stop_ = false;
  claimed_ = consumed_;
  slots_.assign(static_cast<size_t>(std::max(2, 2 * opt_.num_workers)), Batch{});
  for (int w = 0; w < opt_.num_workers; w++) workers_.emplace_back([this] { worker_loop(); });
}

void TokenLoader::stop_workers() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
}

void TokenLoader::worker_loop() {
  const int64_t nslots = static_cast<int64_t>(slots_.size());
  for (;;) {
    int64_t step;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || claimed_ < consumed_ + nslots; });
      if (stop_) return;
      step = claimed_++;
    }
    Batch& b = slots_[static_cast<size_t>(step % nslots)];
    std::string error;
    try {
      fill(step, b);
    } catch (const std::exception& e) {
      error = e.what();
    }
    {
      std::lock_guard lk(mu_);
      b.step = step;
      b.error = std::move(error);
      b.ready = true;
    }
    cv_.notify_all();
  }
}

void TokenLoader::next(int32_t* inputs, int32_t* targets, int64_t* ids, int32_t* positions) {
  ANVIL_CHECK(!packing() || positions, "internal: a packing loader's batches need their positions");
  const auto hand_out = [&](const Batch& b) {
    std::copy(b.inputs.begin(), b.inputs.end(), inputs);
    std::copy(b.targets.begin(), b.targets.end(), targets);
    if (ids) std::copy(b.ids.begin(), b.ids.end(), ids);
    if (packing()) std::copy(b.positions.begin(), b.positions.end(), positions);
    packing_stats_.examples += b.packing.examples;
    packing_stats_.dropped += b.packing.dropped;
    packing_stats_.sequences += b.packing.sequences;
  };
  if (workers_.empty()) {
    Batch& b = slots_[0];
    fill(consumed_, b);
    hand_out(b);
    consumed_++;
    return;
  }
  std::unique_lock lk(mu_);
  Batch& b = slots_[static_cast<size_t>(consumed_ % static_cast<int64_t>(slots_.size()))];
  cv_.wait(lk, [&] { return b.ready && b.step == consumed_; });
  if (!b.error.empty()) throw Error(b.error);
  hand_out(b);
  b.ready = false;
  consumed_++;
  lk.unlock();
  cv_.notify_all();
}

DataState TokenLoader::state() const {
  DataState s;
  const int64_t a = start_step_ + consumed_;
  s.epoch = start_epoch_ + a / steps_per_epoch_;
  s.sample_in_epoch = (a % steps_per_epoch_) * samples_per_step_;
  s.global_batch = samples_per_step_;
  s.shuffle = spec_.shuffle;
  s.algo = spec_.algo;
  s.seed = spec_.seed;
  s.block_size = resolved_block_size(spec_);
  s.canonical_nodes = spec_.canonical_nodes;
  s.epoch_size = epoch_samples(spec_);
  for (int i = 0; i < data_.num_streams(); i++) {
    s.stream_names.push_back(data_.source(i).name);
    s.stream_proportions.push_back(spec_.streams[i].proportion);
    s.stream_samples.push_back(data_.index(i).num_samples());
  }
  s.fingerprint = order_fingerprint(spec_);
  return s;
}

void TokenLoader::restore(const DataState& saved) {
  const DataState now = state();
  auto differs = [](const char* what, const auto& was, const auto& is) {
    ANVIL_FAIL("cannot resume the data order: {} was {} when the run started and is now {}; the order depends on it, "
               "so resuming would not consume the samples the run would have", what, was, is);
  };
  if (saved.global_batch != now.global_batch)
    differs("the samples per step (global_train_batch_size, times packing_ratio when packing)", saved.global_batch,
            now.global_batch);
  if (saved.shuffle != now.shuffle) differs("shuffle", saved.shuffle, now.shuffle);
  if (saved.algo != now.algo) differs("shuffle_algo", saved.algo, now.algo);
  if (saved.seed != now.seed) differs("shuffle_seed", saved.seed, now.seed);
  if (saved.block_size != now.block_size) differs("shuffle_block_size", saved.block_size, now.block_size);
  if (saved.canonical_nodes != now.canonical_nodes)
    differs("num_canonical_nodes", saved.canonical_nodes, now.canonical_nodes);
  if (saved.epoch_size != now.epoch_size) differs("epoch_size", saved.epoch_size, now.epoch_size);
  if (saved.stream_names.size() != now.stream_names.size())
    differs("the number of streams", saved.stream_names.size(), now.stream_names.size());
  for (size_t i = 0; i < now.stream_names.size(); i++) {
    const std::string what = fmt::format("stream {} ('{}')", i, now.stream_names[i]);
    if (saved.stream_names[i] != now.stream_names[i]) differs((what + " name").c_str(), saved.stream_names[i], now.stream_names[i]);
    if (saved.stream_proportions[i] != now.stream_proportions[i])
      differs((what + " proportion").c_str(), saved.stream_proportions[i], now.stream_proportions[i]);
    if (saved.stream_samples[i] != now.stream_samples[i])
      differs((what + " sample count").c_str(), saved.stream_samples[i], now.stream_samples[i]);
  }
  if (saved.fingerprint != now.fingerprint)
    differs("the datasets' shard layout (order fingerprint)", saved.fingerprint, now.fingerprint);
  ANVIL_CHECK(saved.sample_in_epoch % samples_per_step_ == 0 && saved.sample_in_epoch >= 0,
              "cannot resume: sample_in_epoch {} is not a multiple of the global batch {}", saved.sample_in_epoch,
              samples_per_step_);
  stop_workers();
  start_epoch_ = saved.epoch;
  start_step_ = saved.sample_in_epoch / samples_per_step_;
  consumed_ = 0;
  start_workers();
}

}  // namespace anvil
