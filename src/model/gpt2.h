// GPT-2: learned positions, pre-LayerNorm blocks with biases, GELU MLP, tied input/output
// embeddings. Parameters live in one contiguous buffer (so the optimizer, clipping and
// checkpoints see one array) and every activation is allocated once, at construction, for the
// largest microbatch: a training step never allocates.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config/train_config.h"

namespace anvil {

// One named parameter tensor inside the flat buffer. Per-layer tensors are stacked on a
// leading L dimension.
struct ParamTensor {
  std::string name;
  std::vector<int64_t> shape;
  size_t offset = 0, numel = 0;
  bool weight_decay = false;  // matmul weights decay; biases, norms and embeddings do not
  float init_std = 0.0f;      // 0: constant init (init_value)
  float init_value = 0.0f;
};

std::vector<ParamTensor> gpt2_param_layout(const ModelConfig& cfg);
size_t gpt2_num_params(const ModelConfig& cfg);
// Training FLOPs per token (forward + backward): 6 per matmul weight (the embedding table counts
// once, as the LM head) plus the attention score and value products, 12·L·C·T.
double gpt2_train_flops_per_token(const ModelConfig& cfg, int seq_len);

class Gpt2 {
 public:
  // Buffers for microbatches of up to max_batch sequences of up to max_seq tokens.
  Gpt2(const ModelConfig& cfg, int max_batch, int max_seq);

  const ModelConfig& config() const { return cfg_; }
  const std::vector<ParamTensor>& tensors() const { return layout_; }
  size_t num_params() const { return params_.size(); }
  float* params() { return params_.data(); }
  const float* params() const { return params_.data(); }
  float* grads() { return grads_.data(); }

  // GPT-2 initialisation from a seed: N(0, 0.02), residual projections N(0, 0.02/√(2L)),
  // biases 0, norm weights 1. Each value depends only on (seed, tensor, index).
  void init_weights(uint64_t seed);
  void zero_grad();

  // Runs tokens (B,T) through the model (eval, generation). With targets (B,T) (kIgnoreIndex
  // allowed) it also computes per-token losses and returns their sum; the count of non-ignored
  // targets goes to *n_targets (may be null). Without targets only the logits are computed.
  double forward(const int32_t* tokens, const int32_t* targets, int B, int T, int64_t* n_targets);
  // Training: the forward pass, then adds to grads() the gradient of dloss · (sum of the
  // per-token losses). Returns that sum, as forward() does. The logits are consumed.
  double forward_backward(const int32_t* tokens, const int32_t* targets, int B, int T, float dloss,
                          int64_t* n_targets);

  const float* logits() const { return acts_.logits; }  // (B,T,V) of the last forward()

 private:
  struct Acts {
    float *encoded, *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att_lse, *residual2, *ln2, *ln2_mean,
        *ln2_rstd, *fch, *fch_gelu, *residual3, *lnf, *lnf_mean, *lnf_rstd, *logits, *losses,
        *ce_lse, *scratch;
  };
  struct Params {
    float *wte, *wpe, *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb,
        *fcprojw, *fcprojb, *lnfw, *lnfb;
  };
  Params bind(float* base) const;
  void forward_to_logits(const int32_t* tokens, int B, int T);
  void check_targets(const int32_t* targets, int N) const;
  double sum_losses(const int32_t* targets, int N, int64_t* n_targets) const;
  void backward_from_dlogits();  // the gradient of the logits is in acts_.logits

  ModelConfig cfg_;
  int max_batch_, max_seq_;
  std::vector<ParamTensor> layout_;
  std::vector<float> params_, grads_, act_memory_, grad_act_memory_;
  Acts acts_{};
  float *dresidual_ = nullptr, *dbig_ = nullptr, *dqkv_ = nullptr, *dsmall_ = nullptr;
  const int32_t* tokens_ = nullptr;  // of the last forward, for the embedding's backward
  int B_ = 0, T_ = 0;
};

}  // namespace anvil
