// ZeRO 0-3 over anvil's collectives; see data_parallel.h for what each stage keeps.
#include "dist/data_parallel.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace anvil {

CommThread::CommThread() : thread_([this] { run(); }) {}

CommThread::~CommThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

uint64_t CommThread::submit(std::function<void()> job) {
  std::lock_guard<std::mutex> lock(mu_);
  jobs_.emplace_back(++submitted_, std::move(job));
  cv_.notify_all();
  return submitted_;
}

void CommThread::wait(uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return finished_ >= ticket || error_; });
  if (error_) std::rethrow_exception(error_);
}

void CommThread::wait_all() {
  uint64_t last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last = submitted_;
  }
  wait(last);
}

void CommThread::run() {
  for (;;) {
    std::pair<uint64_t, std::function<void()>> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    bool failed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      failed = error_ != nullptr;
    }
    try {
      if (!failed) job.second();  // after an error, later jobs are skipped: their inputs are wrong
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      finished_ = job.first;
    }
    cv_.notify_all();
  }
}

Gpt2Storage gpt2_storage_for_stage(int zero_stage) { return {zero_stage < 3, zero_stage < 2}; }

namespace {

// The part of [a, a + n) inside each rank's shard, in rank order.
std::vector<size_t> split_by_shards(size_t a, size_t n, const std::vector<size_t>& shard_counts) {
  std::vector<size_t> out(shard_counts.size(), 0);
  size_t shard_lo = 0;
  for (size_t r = 0; r < shard_counts.size(); r++) {
    const size_t shard_hi = shard_lo + shard_counts[r];
    const size_t lo = std::max(a, shard_lo), hi = std::min(a + n, shard_hi);
    out[r] = hi > lo ? hi - lo : 0;
    shard_lo = shard_hi;
  }
  return out;
}

// Rank r's contiguous shard; under stage 0 every rank holds and updates everything.
std::pair<size_t, size_t> owned_range(const std::vector<size_t>& shard_counts, int rank, int zero_stage) {
  size_t lo = 0;
  for (int r = 0; r < rank; r++) lo += shard_counts[r];
  if (zero_stage == 0) {
    size_t n = 0;
    for (size_t c : shard_counts) n += c;
    return {0, n};
  }
  return {lo, lo + shard_counts[rank]};
}

}  // namespace

DataParallel::DataParallel(Communicator& comm, Gpt2& model, const OptimizerConfig& optimizer,
                           DataParallelOptions options)
    : comm_(comm), model_(model), opt_(options), units_(model.units()), n_(model.num_params()),
      shard_counts_(even_counts(n_, comm.size())),
      lo_(owned_range(shard_counts_, comm.rank(), options.zero_stage).first),
      hi_(owned_range(shard_counts_, comm.rank(), options.zero_stage).second),
      optimizer_(optimizer, model.tensors(), lo_, hi_) {
  ANVIL_CHECK(opt_.zero_stage >= 0 && opt_.zero_stage <= 3, "zero_stage {} is not valid: expected 0, 1, 2 or 3",
              opt_.zero_stage);
  ANVIL_CHECK(!opt_.bf16_compression || opt_.zero_stage == 0, "gradient compression (bf16) works with zero_stage 0 "
              "only; zero_stage {} reduce-scatters in fp32", opt_.zero_stage);
  const Gpt2Storage want = gpt2_storage_for_stage(opt_.zero_stage);
  ANVIL_CHECK((model.params() != nullptr) == want.params && (model.grads() != nullptr) == want.grads,
              "the model was not built for zero_stage {} (use gpt2_storage_for_stage)", opt_.zero_stage);
  for (const ParamUnit& u : units_) unit_counts_.push_back(split_by_shards(u.offset, u.numel, shard_counts_));
  size_t largest_other = 0;
  for (size_t u = 1; u < units_.size(); u++) largest_other = std::max(largest_other, units_[u].numel);
  if (opt_.zero_stage >= 2) {
    grad_shard_.assign(hi_ - lo_, 0.0f);
    emb_grads_.buf.assign(units_[0].numel, 0.0f);
    for (Slot& s : block_grads_) s.buf.assign(largest_other, 0.0f);
  }
  if (opt_.zero_stage == 3) {
    param_shard_.assign(hi_ - lo_, 0.0f);
    emb_params_.buf.assign(units_[0].numel, 0.0f);
    for (Slot& s : block_params_) s.buf.assign(largest_other, 0.0f);
  }
  if (opt_.bf16_compression) error_feedback_.assign(n_, 0.0f);
  model_.set_unit_access(this);
}

DataParallel::~DataParallel() { model_.set_unit_access(nullptr); }

MemoryReport DataParallel::memory() const {
  const size_t f = sizeof(float), shard = hi_ - lo_;
  MemoryReport m;
  m.params = (opt_.zero_stage == 3 ? shard : n_) * f;
  m.grads = (opt_.zero_stage >= 2 ? shard : n_) * f;
  m.optimizer = 2 * shard * f;
  auto slot_bytes = [&](const Slot& s) { return s.buf.size() * f; };
  m.working = error_feedback_.size() * f + slot_bytes(emb_params_) + slot_bytes(emb_grads_);
  for (int i = 0; i < 2; i++) m.working += slot_bytes(block_params_[i]) + slot_bytes(block_grads_[i]);
  return m;
}

float* DataParallel::owned_params() { return opt_.zero_stage == 3 ? param_shard_.data() : model_.params() + lo_; }
float* DataParallel::owned_grads() { return opt_.zero_stage >= 2 ? grad_shard_.data() : model_.grads() + lo_; }

void DataParallel::init_weights(uint64_t seed) {
  if (opt_.zero_stage == 3) {
    gpt2_init_params(model_.config(), seed, lo_, hi_, param_shard_.data());
    for (Slot* s : {&emb_params_, &block_params_[0], &block_params_[1]}) s->unit = -1;
  } else {
    model_.init_weights(seed);
  }
}

void DataParallel::begin_step() {
  if (opt_.zero_stage >= 2)
    std::fill(grad_shard_.begin(), grad_shard_.end(), 0.0f);
  else
    model_.zero_grad();
}

void DataParallel::begin_microbatch(bool last) { last_microbatch_ = last; }

void DataParallel::finish_backward() { thread_.wait_all(); }

double DataParallel::clip_and_norm(double max_norm) {
  if (opt_.zero_stage == 0) return clip_grad_norm(model_.grads(), n_, max_norm);  // identical on every rank
  const double sq = sum_in_rank_order(comm_, grad_sum_of_squares(owned_grads(), hi_ - lo_));
  const double norm = std::sqrt(sq);
  scale_grads(owned_grads(), hi_ - lo_, clip_coefficient(norm, max_norm));
  return norm;
}

void DataParallel::optimizer_step(double lr) {
  optimizer_.step(owned_params(), owned_grads(), lr);
  if (opt_.zero_stage == 1 || opt_.zero_stage == 2) {
    all_gather(comm_, model_.params(), shard_counts_);
  } else if (opt_.zero_stage == 3) {
    for (Slot* s : {&emb_params_, &block_params_[0], &block_params_[1]}) s->unit = -1;  // stale now
  }
}

void DataParallel::gather_full_state(std::vector<float>& params, std::vector<float>& exp_avg,
                                     std::vector<float>& exp_avg_sq) {
  quiesce();
  params.assign(n_, 0.0f);
  exp_avg.assign(n_, 0.0f);
  exp_avg_sq.assign(n_, 0.0f);
  if (opt_.zero_stage == 3) {
    std::copy(param_shard_.begin(), param_shard_.end(), params.begin() + lo_);
    all_gather(comm_, params.data(), shard_counts_);
  } else {
    std::copy_n(model_.params(), n_, params.begin());
  }
  std::copy(optimizer_.exp_avg().begin(), optimizer_.exp_avg().end(), exp_avg.begin() + lo_);
  std::copy(optimizer_.exp_avg_sq().begin(), optimizer_.exp_avg_sq().end(), exp_avg_sq.begin() + lo_);
  if (opt_.zero_stage > 0) {
    all_gather(comm_, exp_avg.data(), shard_counts_);
    all_gather(comm_, exp_avg_sq.data(), shard_counts_);
  }
}

void DataParallel::load_full_state(const std::vector<float>& params, const std::vector<float>& exp_avg,
                                   const std::vector<float>& exp_avg_sq, int64_t optimizer_steps) {
  ANVIL_CHECK(params.size() == n_ && exp_avg.size() == n_ && exp_avg_sq.size() == n_,
              "training state of {} parameters for a model of {}", params.size(), n_);
  quiesce();
  if (opt_.zero_stage == 3) {
    std::copy(params.begin() + lo_, params.begin() + hi_, param_shard_.begin());
    for (Slot* s : {&emb_params_, &block_params_[0], &block_params_[1]}) s->unit = -1;
  } else {
    std::copy(params.begin(), params.end(), model_.params());
  }
  std::copy(exp_avg.begin() + lo_, exp_avg.begin() + hi_, optimizer_.exp_avg().begin());
  std::copy(exp_avg_sq.begin() + lo_, exp_avg_sq.begin() + hi_, optimizer_.exp_avg_sq().begin());
  optimizer_.set_steps_taken(optimizer_steps);
}

// ---- parameters (ZeRO-3 gathers them; below that they are the model's own)

DataParallel::Slot* DataParallel::find_param_slot(int unit) {
  if (unit == 0) return emb_params_.unit == 0 ? &emb_params_ : nullptr;
  for (Slot& s : block_params_)
    if (s.unit == unit) return &s;
  return nullptr;
}

DataParallel::Slot& DataParallel::free_param_slot(int unit) {
  if (unit == 0) {
    ANVIL_CHECK(!emb_params_.in_use, "the embedding unit was acquired twice");
    return emb_params_;
  }
  for (Slot& s : block_params_)
    if (!s.in_use) return s;
  ANVIL_FAIL("more than two blocks' parameters acquired at once");
}

void DataParallel::start_gather(Slot& slot, int unit) {
  slot.unit = unit;
  const ParamUnit u = units_[unit];
  float* buf = slot.buf.data();
  const size_t a = std::max(lo_, u.offset), b = std::min(hi_, u.offset + u.numel);
  const float* shard = param_shard_.data();
  const size_t lo = lo_;
  const std::vector<size_t>* counts = &unit_counts_[unit];
  slot.ticket = thread_.submit([this, buf, a, b, shard, lo, u, counts] {
    if (b > a) std::memcpy(buf + (a - u.offset), shard + (a - lo), (b - a) * sizeof(float));
    all_gather(comm_, buf, *counts);
  });
}

const float* DataParallel::acquire_params(int unit, int next_unit) {
  if (opt_.zero_stage < 3) return model_.params() + units_[unit].offset;
  Slot* s = find_param_slot(unit);
  if (!s) {
    s = &free_param_slot(unit);
    start_gather(*s, unit);
  }
  s->in_use = true;
  if (next_unit >= 0 && !find_param_slot(next_unit) && !(next_unit == 0 && emb_params_.in_use))
    start_gather(free_param_slot(next_unit), next_unit);  // fetched while this unit computes
  thread_.wait(s->ticket);
  return s->buf.data();
}

void DataParallel::release_params(int unit) {
  if (opt_.zero_stage < 3) return;
  Slot* s = find_param_slot(unit);
  ANVIL_CHECK(s && s->in_use, "unit {} released without being acquired", unit);
  s->in_use = false;
}

// ---- gradients

float* DataParallel::grads(int unit) {
  if (opt_.zero_stage < 2) return model_.grads() + units_[unit].offset;
  Slot* s = nullptr;
  if (unit == 0) {
    s = &emb_grads_;
  } else {
    for (Slot& b : block_grads_)
      if (b.in_use && b.unit == unit) s = &b;
    if (!s)
      for (Slot& b : block_grads_)
        if (!b.in_use) {
          s = &b;
          break;
        }
    ANVIL_CHECK(s, "more than two blocks' gradients open at once");
  }
  if (!(s->in_use && s->unit == unit)) {
    thread_.wait(s->ticket);  // the reduce-scatter still reading its last contents
    std::fill_n(s->buf.data(), units_[unit].numel, 0.0f);
    s->unit = unit;
    s->in_use = true;
  }
  return s->buf.data();
}

void DataParallel::grads_done(int unit) {
  const ParamUnit u = units_[unit];
  const std::vector<size_t>* counts = &unit_counts_[unit];
  const AllReduceAlgo algo = opt_.algo;
  if (opt_.zero_stage < 2) {
    if (!last_microbatch_ || comm_.size() == 1) return;  // earlier microbatches accumulate locally
    float* g = model_.grads() + u.offset;
    if (opt_.zero_stage == 0 && opt_.bf16_compression) {
      float* err = error_feedback_.data() + u.offset;
      thread_.submit([this, g, err, u] { all_reduce_bf16(comm_, g, err, u.numel); });
    } else if (opt_.zero_stage == 0) {
      thread_.submit([this, g, u, algo] { all_reduce(comm_, g, u.numel, algo); });
    } else {
      thread_.submit([this, g, counts, algo] { reduce_scatter(comm_, g, *counts, algo); });
    }
    return;
  }
  Slot* s = unit == 0 ? &emb_grads_ : nullptr;
  for (Slot& b : block_grads_)
    if (!s && b.in_use && b.unit == unit) s = &b;
  ANVIL_CHECK(s && s->in_use, "unit {}'s gradient finished without being opened", unit);
  s->in_use = false;
  float* buf = s->buf.data();
  float* shard = grad_shard_.data();
  const size_t a = std::max(lo_, u.offset), b = std::min(hi_, u.offset + u.numel), lo = lo_;
  s->ticket = thread_.submit([this, buf, shard, a, b, lo, u, counts, algo] {
    reduce_scatter(comm_, buf, *counts, algo);
    // Microbatches add their reduced sums into the shard in order.
    for (size_t i = a; i < b; i++) shard[i - lo] += buf[i - u.offset];
  });
}

}  // namespace anvil
