// GPT-2 forward and backward, written once against the ops of src/kernels.
#include "model/gpt2.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/rng.h"
#include "kernels/attention.h"
#include "kernels/crossentropy.h"
#include "kernels/encoder.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/residual.h"
#include "kernels/round.h"

namespace anvil {

std::vector<ParamTensor> gpt2_param_layout(const ModelConfig& cfg) {
  const int64_t L = cfg.n_layers, C = cfg.d_model, V = cfg.vocab_size, P = cfg.max_seq_len;
  const float std_w = 0.02f, std_resid = 0.02f / std::sqrt(2.0f * cfg.n_layers);
  std::vector<ParamTensor> t = {{"wte", {V, C}, 0, 0, 0, false, std_w, 0}, {"wpe", {P, C}, 0, 0, 0, false, std_w, 0}};
  for (int l = 0; l < L; l++) {
    const std::string h = fmt::format("h.{}.", l);
    const int u = 1 + l;
    // The order of Gpt2::Block.
    t.insert(t.end(), {{h + "ln1w", {C}, 0, 0, u, false, 0, 1},
                       {h + "ln1b", {C}, 0, 0, u, false, 0, 0},
                       {h + "qkvw", {3 * C, C}, 0, 0, u, true, std_w, 0},
                       {h + "qkvb", {3 * C}, 0, 0, u, false, 0, 0},
                       {h + "attprojw", {C, C}, 0, 0, u, true, std_resid, 0},
                       {h + "attprojb", {C}, 0, 0, u, false, 0, 0},
                       {h + "ln2w", {C}, 0, 0, u, false, 0, 1},
                       {h + "ln2b", {C}, 0, 0, u, false, 0, 0},
                       {h + "fcw", {4 * C, C}, 0, 0, u, true, std_w, 0},
                       {h + "fcb", {4 * C}, 0, 0, u, false, 0, 0},
                       {h + "fcprojw", {C, 4 * C}, 0, 0, u, true, std_resid, 0},
                       {h + "fcprojb", {C}, 0, 0, u, false, 0, 0}});
  }
  const int last = static_cast<int>(L) + 1;
  t.insert(t.end(), {{"lnfw", {C}, 0, 0, last, false, 0, 1}, {"lnfb", {C}, 0, 0, last, false, 0, 0}});
  size_t offset = 0;
  for (auto& p : t) {
    p.numel = 1;
    for (int64_t d : p.shape) p.numel *= static_cast<size_t>(d);
    p.offset = offset;
    offset += p.numel;
  }
  return t;
}

size_t gpt2_num_params(const ModelConfig& cfg) {
  auto t = gpt2_param_layout(cfg);
  return t.back().offset + t.back().numel;
}

std::vector<ParamUnit> gpt2_units(const ModelConfig& cfg) {
  std::vector<ParamUnit> units(static_cast<size_t>(cfg.n_layers) + 2);
  for (const ParamTensor& t : gpt2_param_layout(cfg)) {
    ParamUnit& u = units[t.unit];
    if (u.numel == 0) u.offset = t.offset;
    u.numel = t.offset + t.numel - u.offset;
  }
  return units;
}

double gpt2_train_flops_per_token(const ModelConfig& cfg, int seq_len) {
  const double C = cfg.d_model, L = cfg.n_layers;
  const double matmul_params = static_cast<double>(cfg.vocab_size) * C + L * 12.0 * C * C;
  return 6.0 * matmul_params + 12.0 * L * C * seq_len;
}

Gpt2::Block Gpt2::bind_block(const float* base) const {
  const size_t C = cfg_.d_model;
  // Sizes in the order of Block's members (and of the layout).
  const size_t sizes[12] = {C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C};
  float* p[12];
  float* cursor = const_cast<float*>(base);
  for (int i = 0; i < 12; i++) {
    p[i] = cursor;
    cursor += sizes[i];
  }
  return {p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11]};
}

// The default access: the model's own full arrays, nothing to gather or reduce.
class Gpt2::OwnArrays : public UnitAccess {
 public:
  explicit OwnArrays(Gpt2& m) : m_(m) {}
  const float* acquire_params(int unit, int) override {
    ANVIL_CHECK(!m_.params_.empty(), "the model holds no parameters of its own and has no unit access set");
    return m_.params_.data() + m_.units_[unit].offset;
  }
  void release_params(int) override {}
  void grain_done(int, size_t, size_t) override {}  // contributions accumulate in place
  float* grads(int unit) override {
    ANVIL_CHECK(!m_.grads_.empty(), "the model holds no gradients of its own and has no unit access set");
    return m_.grads_.data() + m_.units_[unit].offset;
  }
  void grads_done(int) override {}

 private:
  Gpt2& m_;
};

void Gpt2::set_unit_access(UnitAccess* access) { access_ = access ? access : own_access_.get(); }

Gpt2::Gpt2(const ModelConfig& cfg, int max_batch, int max_seq, Gpt2Storage storage)
    : cfg_(cfg), max_batch_(max_batch), max_seq_(max_seq) {
  ANVIL_CHECK(cfg.n_layers > 0 && cfg.n_heads > 0 && cfg.d_model > 0 && cfg.vocab_size > 0 &&
                  cfg.max_seq_len > 0,
              "model sizes must be positive (n_layers {}, n_heads {}, d_model {}, vocab_size {}, "
              "max_seq_len {})",
              cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.vocab_size, cfg.max_seq_len);
  ANVIL_CHECK(cfg.d_model % cfg.n_heads == 0, "model.d_model ({}) must be divisible by model.n_heads ({})",
              cfg.d_model, cfg.n_heads);
  ANVIL_CHECK(max_seq <= cfg.max_seq_len, "sequence length {} exceeds the model's max_seq_len {}",
              max_seq, cfg.max_seq_len);
  layout_ = gpt2_param_layout(cfg);
  units_ = gpt2_units(cfg);
  num_params_ = gpt2_num_params(cfg);
  if (storage.params) params_.assign(num_params_, 0.0f);
  if (storage.grads) grads_.assign(num_params_, 0.0f);
  own_access_ = std::make_unique<OwnArrays>(*this);
  access_ = own_access_.get();

  const size_t BT = static_cast<size_t>(max_batch) * max_seq, C = cfg.d_model, L = cfg.n_layers,
               V = cfg.vocab_size, NH = cfg.n_heads;
  // Sizes of every activation, in the order of Acts' members.
  const size_t sizes[] = {BT * C,      L * BT * C, L * BT, L * BT,     L * BT * 3 * C, L * BT * C,
                          L * NH * BT, L * BT * C, L * BT * C, L * BT, L * BT,     L * BT * 4 * C,
                          L * BT * 4 * C, L * BT * C, BT * C, BT,    BT,     BT * V,     BT,
                          BT,          BT * C};
  size_t total = 0;
  for (size_t s : sizes) total += s;
  act_memory_.assign(total, 0.0f);
  float** slots = &acts_.encoded;
  float* cursor = act_memory_.data();
  for (size_t i = 0; i < std::size(sizes); i++) {
    slots[i] = cursor;
    cursor += sizes[i];
  }
  grad_act_memory_.assign(BT * C * 2 + BT * 4 * C + BT * 3 * C, 0.0f);
  dresidual_ = grad_act_memory_.data();
  dsmall_ = dresidual_ + BT * C;
  dbig_ = dsmall_ + BT * C;
  dqkv_ = dbig_ + BT * 4 * C;
}

void gpt2_init_params(const ModelConfig& cfg, uint64_t seed, size_t lo, size_t hi, float* out) {
  const std::vector<ParamTensor> layout = gpt2_param_layout(cfg);
  for (size_t k = 0; k < layout.size(); k++) {
    const ParamTensor& t = layout[k];
    const size_t a = std::max(lo, t.offset), b = std::min(hi, t.offset + t.numel);
    if (a >= b) continue;
    float* p = out + (a - lo);
    if (t.init_std == 0.0f) {
      std::fill(p, p + (b - a), t.init_value);
      continue;
    }
    const size_t first = a - t.offset, n = b - a;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) p[i] = t.init_std * static_cast<float>(normal_at(seed, k, first + i));
  }
}

void Gpt2::init_weights(uint64_t seed) {
  ANVIL_CHECK(!params_.empty(), "init_weights needs the model's own parameter array");
  gpt2_init_params(cfg_, seed, 0, num_params_, params_.data());
}

void Gpt2::set_compute_dtype(ComputeDtype dtype) {
  dtype_ = dtype;
  size_t largest = 0;
  for (const ParamUnit& u : units_) largest = std::max(largest, u.numel);
  compute_params_.assign(dtype == ComputeDtype::kFp32 ? 0 : largest, 0.0f);
  // The gradient of the residual stream, rounded for the projections' backward, needs its own
  // sequence-sized buffer.
  rounded_dres_.assign(dtype == ComputeDtype::kFp32 ? 0 : static_cast<size_t>(max_seq_) * cfg_.d_model, 0.0f);
}

const float* Gpt2::rounded(const float* x, long n) {
  if (dtype_ == ComputeDtype::kFp32) return x;
  std::memcpy(rounded_dres_.data(), x, n * sizeof(float));
  round_to_dtype(rounded_dres_.data(), n, dtype_);
  return rounded_dres_.data();
}

const float* Gpt2::compute_params(int unit, const float* p) {
  if (dtype_ == ComputeDtype::kFp32) return p;
  float* out = compute_params_.data();
  if (unit == 0) {  // the tied LM head: wte
    const size_t n = static_cast<size_t>(cfg_.vocab_size) * cfg_.d_model;
    std::memcpy(out, p, n * sizeof(float));
    round_to_dtype(out, static_cast<long>(n), dtype_);
    return out;
  }
  const size_t n = units_[unit].numel;
  std::memcpy(out, p, n * sizeof(float));
  // A block holds ln1 | qkv, attproj | ln2 | fc, fcproj: the norms stay fp32.
  const Block b = bind_block(out);
  round_to_dtype(b.qkvw, b.ln2w - b.qkvw, dtype_);
  round_to_dtype(b.fcw, (out + n) - b.fcw, dtype_);
  return out;
}

void Gpt2::zero_grad() { std::fill(grads_.begin(), grads_.end(), 0.0f); }

namespace {
// out (B·T, OC) = inp (B·T, C) · weightᵀ + bias, one sequence per call (see UnitAccess).
void matmul_forward_per_sequence(float* out, const float* inp, const float* weight, const float* bias, int B, int T,
                                 int C, int OC) {
  const size_t rows = static_cast<size_t>(T);
  for (int b = 0; b < B; b++) matmul_forward(out + b * rows * OC, inp + b * rows * C, weight, bias, T, C, OC);
}
}  // namespace

void Gpt2::forward_to_logits(const int32_t* tokens, int B, int T) {
  ANVIL_CHECK(B >= 1 && B <= max_batch_ && T >= 1 && T <= max_seq_,
              "batch {}x{} exceeds the model's buffers ({}x{})", B, T, max_batch_, max_seq_);
  const int C = cfg_.d_model, NH = cfg_.n_heads, V = cfg_.vocab_size;
  const int N = B * T;
  for (int i = 0; i < N; i++)
    ANVIL_CHECK(tokens[i] >= 0 && tokens[i] < V, "token id {} out of range for vocab_size {}", tokens[i], V);
  tokens_ = tokens;
  B_ = B;
  T_ = T;
  Acts& a = acts_;
  const size_t BT = static_cast<size_t>(max_batch_) * max_seq_;  // per-layer stride
  const int L = cfg_.n_layers;
  const size_t wpe_offset = static_cast<size_t>(V) * C;  // inside the embedding unit

  const float* emb = access_->acquire_params(0, 1);
  encoder_forward(a.encoded, tokens, emb, emb + wpe_offset, B, T, C);
  access_->release_params(0);
  const float* residual = a.encoded;
  for (int l = 0; l < L; l++) {
    const Block p = bind_block(compute_params(1 + l, access_->acquire_params(1 + l, 2 + l)));
    float* ln1 = a.ln1 + l * BT * C;
    float* ln1_mean = a.ln1_mean + l * BT;
    float* ln1_rstd = a.ln1_rstd + l * BT;
    float* qkv = a.qkv + l * BT * 3 * C;
    float* atty = a.atty + l * BT * C;
    float* att_lse = a.att_lse + l * BT * NH;
    float* residual2 = a.residual2 + l * BT * C;
    float* ln2 = a.ln2 + l * BT * C;
    float* ln2_mean = a.ln2_mean + l * BT;
    float* ln2_rstd = a.ln2_rstd + l * BT;
    float* fch = a.fch + l * BT * 4 * C;
    float* fch_gelu = a.fch_gelu + l * BT * 4 * C;
    float* residual3 = a.residual3 + l * BT * C;

    // Under amp every matrix product's input and output is rounded to the compute dtype (a
    // no-op in fp32); the residual stream and the norms stay fp32.
    const long NC = static_cast<long>(N) * C;
    layernorm_forward(ln1, ln1_mean, ln1_rstd, residual, p.ln1w, p.ln1b, N, C);
    round_to_dtype(ln1, NC, dtype_);
    matmul_forward_per_sequence(qkv, ln1, p.qkvw, p.qkvb, B, T, C, 3 * C);
    round_to_dtype(qkv, 3 * NC, dtype_);
    attention_forward(atty, att_lse, qkv, B, T, C, NH);
    round_to_dtype(atty, NC, dtype_);
    matmul_forward_per_sequence(a.scratch, atty, p.attprojw, p.attprojb, B, T, C, C);
    round_to_dtype(a.scratch, NC, dtype_);
    residual_forward(residual2, residual, a.scratch, NC);
    layernorm_forward(ln2, ln2_mean, ln2_rstd, residual2, p.ln2w, p.ln2b, N, C);
    round_to_dtype(ln2, NC, dtype_);
    matmul_forward_per_sequence(fch, ln2, p.fcw, p.fcb, B, T, C, 4 * C);
    round_to_dtype(fch, 4 * NC, dtype_);
    gelu_forward(fch_gelu, fch, 4 * NC);
    round_to_dtype(fch_gelu, 4 * NC, dtype_);
    matmul_forward_per_sequence(a.scratch, fch_gelu, p.fcprojw, p.fcprojb, B, T, 4 * C, C);
    round_to_dtype(a.scratch, NC, dtype_);
    residual_forward(residual3, residual2, a.scratch, NC);
    access_->release_params(1 + l);
    residual = residual3;
  }
  const float* lnf = access_->acquire_params(L + 1, 0);
  layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, residual, lnf, lnf + C, N, C);
  round_to_dtype(a.lnf, static_cast<long>(N) * C, dtype_);
  access_->release_params(L + 1);
  emb = compute_params(0, access_->acquire_params(0, -1));
  matmul_forward_per_sequence(a.logits, a.lnf, emb, nullptr, B, T, C, V);  // tied LM head
  round_to_dtype(a.logits, static_cast<long>(N) * V, dtype_);
  access_->release_params(0);
}

void Gpt2::check_targets(const int32_t* targets, int N) const {
  for (int i = 0; i < N; i++)
    ANVIL_CHECK(targets[i] == kIgnoreIndex || (targets[i] >= 0 && targets[i] < cfg_.vocab_size),
                "target id {} out of range for vocab_size {}", targets[i], cfg_.vocab_size);
}

double Gpt2::sum_losses(const int32_t* targets, int N, int64_t* n_targets) const {
  double sum = 0;
  int64_t count = 0;
  for (int i = 0; i < N; i++) {
    sum += acts_.losses[i];
    count += targets[i] != kIgnoreIndex;
  }
  if (n_targets) *n_targets = count;
  return sum;
}

double Gpt2::forward(const int32_t* tokens, const int32_t* targets, int B, int T, int64_t* n_targets) {
  forward_to_logits(tokens, B, T);
  if (!targets) return 0.0;
  check_targets(targets, B * T);
  crossentropy_forward(acts_.losses, acts_.ce_lse, acts_.logits, targets, B * T, cfg_.vocab_size);
  return sum_losses(targets, B * T, n_targets);
}

double Gpt2::forward_backward(const int32_t* tokens, const int32_t* targets, int B, int T, float dloss,
                              int64_t* n_targets) {
  forward_to_logits(tokens, B, T);
  check_targets(targets, B * T);
  // The logits' gradient replaces the logits, in the same pass that computes the losses.
  crossentropy_forward_backward(acts_.losses, acts_.logits, acts_.logits, targets, dloss, B * T, cfg_.vocab_size);
  const double sum = sum_losses(targets, B * T, n_targets);
  backward_from_dlogits();
  return sum;
}

void Gpt2::backward_from_dlogits() {
  const int B = B_, T = T_, C = cfg_.d_model, NH = cfg_.n_heads, V = cfg_.vocab_size, L = cfg_.n_layers;
  Acts& a = acts_;
  const size_t BT = static_cast<size_t>(max_batch_) * max_seq_;
  const size_t wpe_offset = static_cast<size_t>(V) * C;
  const size_t rows = static_cast<size_t>(T);  // rows of one sequence

  // The embedding unit's gradient stays open for the whole pass: the LM head adds to it first,
  // the token embedding last.
  const float* emb = compute_params(0, access_->acquire_params(0, L + 1));
  float* demb = access_->grads(0);
  const long TC = static_cast<long>(T) * C;
  for (int b = 0; b < B; b++) {
    const size_t r = b * rows;
    // Under amp the gradients entering and leaving each matrix product are rounded to the
    // compute dtype too; parameter gradients accumulate in fp32.
    round_to_dtype(a.logits + r * V, static_cast<long>(T) * V, dtype_);
    matmul_backward(dsmall_ + r * C, demb, nullptr, a.logits + r * V, a.lnf + r * C, emb, T, C, V);
    round_to_dtype(dsmall_ + r * C, TC, dtype_);
    access_->grain_done(0, 0, wpe_offset);
  }
  access_->release_params(0);
  std::memset(dresidual_, 0, sizeof(float) * B * rows * C);
  const float* last = a.residual3 + (L - 1) * BT * C;
  const float* lnf = access_->acquire_params(L + 1, L);
  float* dlnf = access_->grads(L + 1);
  for (int b = 0; b < B; b++) {
    const size_t r = b * rows;
    layernorm_backward(dresidual_ + r * C, dlnf, dlnf + C, dsmall_ + r * C, last + r * C, lnf, a.lnf_mean + r,
                       a.lnf_rstd + r, T, C);
    access_->grain_done(L + 1, 0, 2 * static_cast<size_t>(C));
  }
  access_->release_params(L + 1);
  access_->grads_done(L + 1);

  // A residual sum passes its gradient unchanged to both inputs, so dresidual_ stands for the
  // gradient of the block output, of the skip path and of the projection at once; the layer
  // norms then add their input gradients into it. This saves two copies per layer over calling
  // residual_backward.
  for (int l = L - 1; l >= 0; l--) {
    const size_t at = l * BT;  // this layer's slice of the per-layer activations
    const float* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * BT * C;
    const Block p = bind_block(compute_params(1 + l, access_->acquire_params(1 + l, l == 0 ? -1 : l)));
    const Block g = bind_block(access_->grads(1 + l));
    for (int b = 0; b < B; b++) {
      const size_t r = b * rows;
      float* dres = dresidual_ + r * C;
      float* dsmall = dsmall_ + r * C;
      float* dbig = dbig_ + r * 4 * C;
      float* dqkv = dqkv_ + r * 3 * C;
      const float* fch = a.fch + (at + r) * 4 * C;
      // The residual stream's gradient stays fp32; the projections see it rounded.
      const float* dproj = rounded(dres, TC);
      matmul_backward(dbig, g.fcprojw, g.fcprojb, dproj, a.fch_gelu + (at + r) * 4 * C, p.fcprojw, T, 4 * C, C);
      round_to_dtype(dbig, 4 * TC, dtype_);
      gelu_backward(dbig, fch, dbig, 4 * TC);
      round_to_dtype(dbig, 4 * TC, dtype_);
      matmul_backward(dsmall, g.fcw, g.fcb, dbig, a.ln2 + (at + r) * C, p.fcw, T, C, 4 * C);
      round_to_dtype(dsmall, TC, dtype_);
      layernorm_backward(dres, g.ln2w, g.ln2b, dsmall, a.residual2 + (at + r) * C, p.ln2w, a.ln2_mean + at + r,
                         a.ln2_rstd + at + r, T, C);
      dproj = rounded(dres, TC);
      matmul_backward(dsmall, g.attprojw, g.attprojb, dproj, a.atty + (at + r) * C, p.attprojw, T, C, C);
      round_to_dtype(dsmall, TC, dtype_);
      attention_backward(dqkv, dsmall, a.qkv + (at + r) * 3 * C, a.atty + (at + r) * C, a.att_lse + (at + r) * NH, 1,
                         T, C, NH);
      round_to_dtype(dqkv, 3 * TC, dtype_);
      matmul_backward(dsmall, g.qkvw, g.qkvb, dqkv, a.ln1 + (at + r) * C, p.qkvw, T, C, 3 * C);
      round_to_dtype(dsmall, TC, dtype_);
      layernorm_backward(dres, g.ln1w, g.ln1b, dsmall, residual + r * C, p.ln1w, a.ln1_mean + at + r,
                         a.ln1_rstd + at + r, T, C);
      access_->grain_done(1 + l, 0, units_[1 + l].numel);
    }
    access_->release_params(1 + l);
    access_->grads_done(1 + l);
  }
  for (int b = 0; b < B; b++) {
    const size_t r = b * rows;
    encoder_backward(demb, demb + wpe_offset, dresidual_ + r * C, tokens_ + r, 1, T, C);
    access_->grain_done(0, wpe_offset, rows * C);
    // The token rows this sequence touched (a repeated token's row is empty the second time).
    for (int t = 0; t < T; t++) access_->grain_done(0, static_cast<size_t>(tokens_[r + t]) * C, C);
  }
  access_->grads_done(0);
}

}  // namespace anvil
