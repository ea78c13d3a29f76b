// GPT-2 forward and backward, written once against the ops of src/kernels.
#include "model/gpt2.h"

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

namespace anvil {

std::vector<ParamTensor> gpt2_param_layout(const ModelConfig& cfg) {
  const int64_t L = cfg.n_layers, C = cfg.d_model, V = cfg.vocab_size, P = cfg.max_seq_len;
  const float std_w = 0.02f, std_resid = 0.02f / std::sqrt(2.0f * cfg.n_layers);
  std::vector<ParamTensor> t = {
      {"wte", {V, C}, 0, 0, false, std_w, 0},        {"wpe", {P, C}, 0, 0, false, std_w, 0},
      {"ln1w", {L, C}, 0, 0, false, 0, 1},           {"ln1b", {L, C}, 0, 0, false, 0, 0},
      {"qkvw", {L, 3 * C, C}, 0, 0, true, std_w, 0}, {"qkvb", {L, 3 * C}, 0, 0, false, 0, 0},
      {"attprojw", {L, C, C}, 0, 0, true, std_resid, 0},
      {"attprojb", {L, C}, 0, 0, false, 0, 0},       {"ln2w", {L, C}, 0, 0, false, 0, 1},
      {"ln2b", {L, C}, 0, 0, false, 0, 0},           {"fcw", {L, 4 * C, C}, 0, 0, true, std_w, 0},
      {"fcb", {L, 4 * C}, 0, 0, false, 0, 0},
      {"fcprojw", {L, C, 4 * C}, 0, 0, true, std_resid, 0},
      {"fcprojb", {L, C}, 0, 0, false, 0, 0},        {"lnfw", {C}, 0, 0, false, 0, 1},
      {"lnfb", {C}, 0, 0, false, 0, 0},
  };
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

double gpt2_train_flops_per_token(const ModelConfig& cfg, int seq_len) {
  const double C = cfg.d_model, L = cfg.n_layers;
  const double matmul_params = static_cast<double>(cfg.vocab_size) * C + L * 12.0 * C * C;
  return 6.0 * matmul_params + 12.0 * L * C * seq_len;
}

Gpt2::Params Gpt2::bind(float* base) const {
  float* p[16];
  for (size_t i = 0; i < 16; i++) p[i] = base + layout_[i].offset;
  return {p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11], p[12], p[13],
          p[14], p[15]};
}

Gpt2::Gpt2(const ModelConfig& cfg, int max_batch, int max_seq)
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
  params_.assign(gpt2_num_params(cfg), 0.0f);
  grads_.assign(params_.size(), 0.0f);

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

void Gpt2::init_weights(uint64_t seed) {
  for (size_t k = 0; k < layout_.size(); k++) {
    const ParamTensor& t = layout_[k];
    float* p = params_.data() + t.offset;
    if (t.init_std == 0.0f) {
      std::fill(p, p + t.numel, t.init_value);
      continue;
    }
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < t.numel; i++) p[i] = t.init_std * static_cast<float>(normal_at(seed, k, i));
  }
}

void Gpt2::zero_grad() { std::memset(grads_.data(), 0, grads_.size() * sizeof(float)); }

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
  Params p = bind(params_.data());
  Acts& a = acts_;
  const size_t BT = static_cast<size_t>(max_batch_) * max_seq_;  // per-layer stride

  encoder_forward(a.encoded, tokens, p.wte, p.wpe, B, T, C);
  const float* residual = a.encoded;
  for (int l = 0; l < cfg_.n_layers; l++) {
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

    layernorm_forward(ln1, ln1_mean, ln1_rstd, residual, p.ln1w + l * C, p.ln1b + l * C, N, C);
    matmul_forward(qkv, ln1, p.qkvw + static_cast<size_t>(l) * 3 * C * C, p.qkvb + l * 3 * C, N, C, 3 * C);
    attention_forward(atty, att_lse, qkv, B, T, C, NH);
    matmul_forward(a.scratch, atty, p.attprojw + static_cast<size_t>(l) * C * C, p.attprojb + l * C, N, C, C);
    residual_forward(residual2, residual, a.scratch, static_cast<long>(N) * C);
    layernorm_forward(ln2, ln2_mean, ln2_rstd, residual2, p.ln2w + l * C, p.ln2b + l * C, N, C);
    matmul_forward(fch, ln2, p.fcw + static_cast<size_t>(l) * 4 * C * C, p.fcb + l * 4 * C, N, C, 4 * C);
    gelu_forward(fch_gelu, fch, static_cast<long>(N) * 4 * C);
    matmul_forward(a.scratch, fch_gelu, p.fcprojw + static_cast<size_t>(l) * 4 * C * C, p.fcprojb + l * C, N, 4 * C, C);
    residual_forward(residual3, residual2, a.scratch, static_cast<long>(N) * C);
    residual = residual3;
  }
  layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, residual, p.lnfw, p.lnfb, N, C);
  matmul_forward(a.logits, a.lnf, p.wte, nullptr, N, C, V);  // tied LM head
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
  const int B = B_, T = T_, C = cfg_.d_model, NH = cfg_.n_heads, V = cfg_.vocab_size;
  const int N = B * T;
  Params p = bind(params_.data());
  Params g = bind(grads_.data());
  Acts& a = acts_;
  const size_t BT = static_cast<size_t>(max_batch_) * max_seq_;

  matmul_backward(dsmall_, g.wte, nullptr, a.logits, a.lnf, p.wte, N, C, V);
  std::memset(dresidual_, 0, sizeof(float) * N * C);
  const float* last = cfg_.n_layers > 0 ? a.residual3 + (cfg_.n_layers - 1) * BT * C : a.encoded;
  layernorm_backward(dresidual_, g.lnfw, g.lnfb, dsmall_, last, p.lnfw, a.lnf_mean, a.lnf_rstd, N, C);

  // A residual sum passes its gradient unchanged to both inputs, so dresidual_ stands for the
  // gradient of the block output, of the skip path and of the projection at once; the layer
  // norms then add their input gradients into it. This saves two copies per layer over calling
  // residual_backward.
  for (int l = cfg_.n_layers - 1; l >= 0; l--) {
    const float* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * BT * C;
    const float* ln1 = a.ln1 + l * BT * C;
    const float* qkv = a.qkv + l * BT * 3 * C;
    const float* atty = a.atty + l * BT * C;
    const float* att_lse = a.att_lse + l * BT * NH;
    const float* residual2 = a.residual2 + l * BT * C;
    const float* ln2 = a.ln2 + l * BT * C;
    const float* fch = a.fch + l * BT * 4 * C;
    const float* fch_gelu = a.fch_gelu + l * BT * 4 * C;
    const size_t CC = static_cast<size_t>(C) * C;

    matmul_backward(dbig_, g.fcprojw + l * 4 * CC, g.fcprojb + l * C, dresidual_, fch_gelu,
                    p.fcprojw + l * 4 * CC, N, 4 * C, C);
    gelu_backward(dbig_, fch, dbig_, static_cast<long>(N) * 4 * C);
    matmul_backward(dsmall_, g.fcw + l * 4 * CC, g.fcb + l * 4 * C, dbig_, ln2, p.fcw + l * 4 * CC, N, C, 4 * C);
    layernorm_backward(dresidual_, g.ln2w + l * C, g.ln2b + l * C, dsmall_, residual2, p.ln2w + l * C,
                       a.ln2_mean + l * BT, a.ln2_rstd + l * BT, N, C);
    matmul_backward(dsmall_, g.attprojw + l * CC, g.attprojb + l * C, dresidual_, atty,
                    p.attprojw + l * CC, N, C, C);
    attention_backward(dqkv_, dsmall_, qkv, atty, att_lse, B, T, C, NH);
    matmul_backward(dsmall_, g.qkvw + l * 3 * CC, g.qkvb + l * 3 * C, dqkv_, ln1, p.qkvw + l * 3 * CC, N, C, 3 * C);
    layernorm_backward(dresidual_, g.ln1w + l * C, g.ln1b + l * C, dsmall_, residual, p.ln1w + l * C,
                       a.ln1_mean + l * BT, a.ln1_rstd + l * BT, N, C);
  }
  encoder_backward(g.wte, g.wpe, dresidual_, tokens_, B, T, C);
}

}  // namespace anvil
