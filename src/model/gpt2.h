// GPT-2: learned positions, pre-LayerNorm blocks with biases, GELU MLP, tied input/output
// embeddings. Parameters live in one flat array, layer by layer (embeddings, block 0 .. block L-1,
// final norm), so that each unit the model works through (embeddings, a block, the final norm) is
// one contiguous range: a block's gradient is complete, and can be reduced, while the backward
// pass goes on to the blocks below it, and a sharded run gathers one block at a time. Every
// activation is allocated once, for the largest microbatch (at construction, or by set_max_batch
// before training): a step never allocates. Parameters, gradients and activations are op memory
// (kernels/buffer.h): on the GPU under kernels=gpu; tokens, targets and losses cross to the host.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/train_config.h"
#include "core/dtype.h"
#include "kernels/buffer.h"

namespace anvil {

// One named parameter tensor inside the flat buffer ("wte", "h.3.qkvw", "lnfw").
struct ParamTensor {
  std::string name;
  std::vector<int64_t> shape;
  size_t offset = 0, numel = 0;
  int unit = 0;               // the contiguous unit that holds it (see gpt2_units)
  bool weight_decay = false;  // matmul weights decay; biases, norms and embeddings do not
  float init_std = 0.0f;      // 0: constant init (init_value)
  float init_value = 0.0f;
};

std::vector<ParamTensor> gpt2_param_layout(const ModelConfig& cfg);
size_t gpt2_num_params(const ModelConfig& cfg);

// A contiguous range of the flat parameter array that the model uses as a whole: unit 0 is the
// embeddings (wte, wpe), unit 1 + l is block l, unit L + 1 the final norm.
struct ParamUnit {
  size_t offset = 0, numel = 0;
};
std::vector<ParamUnit> gpt2_units(const ModelConfig& cfg);
// GPT-2 initialisation of the flat range [lo, hi) into out (hi - lo floats): N(0, 0.02), residual
// projections N(0, 0.02/√(2L)), biases 0, norm weights 1. Each value depends only on (seed,
// tensor, index), so a shard initialises itself without the rest.
void gpt2_init_params(const ModelConfig& cfg, uint64_t seed, size_t lo, size_t hi, float* out);

// How the model reaches its parameters and gradients, one unit at a time. The default serves the
// model's own full arrays; data-parallel training substitutes one that gathers sharded
// parameters (ZeRO-3) or hands out working gradient buffers that it reduces as soon as the
// backward pass has finished with them (ZeRO-2/3), or starts reducing full gradients then.
//
// In a microbatch-invariant model (Gpt2Storage, the default) every matrix product whose rows'
// bits depend on the rows beside them (GPU BLAS) runs one sequence at a time, and every parameter
// gradient is formed one sequence at a time: this keeps each sequence's forward pass and gradient
// independent of what else shares its microbatch, the basis of bitwise determinism across
// microbatch sizes. Otherwise the grain below is a whole microbatch.
class UnitAccess {
 public:
  virtual ~UnitAccess() = default;
  // The unit's parameters (layout order), valid until release_params(unit). next_unit: the unit
  // the model will ask for after this one (-1: none), so that it can be fetched ahead.
  virtual const float* acquire_params(int unit, int next_unit) = 0;
  virtual void release_params(int unit) = 0;
  // Where sequences' contributions to [offset, offset + count) of the unit's gradient are added
  // (+=): count floats. A span may share memory with the unit's earlier spans whose
  // contributions were handed over (grain_done), so that deterministic training needs scratch
  // for the largest span only (Gpt2::largest_grads_span), not for the embedding table.
  virtual float* grads(int unit, size_t offset, size_t count) = 0;
  // One sequence's contribution to [offset, offset + count) of the unit's gradient is complete
  // in the span grads() gave for it. The backward pass works one sequence (grain) at a time and
  // says so after each, so that contributions can be summed exactly (deterministic training
  // accumulates them in fixed point and clears the range); parts it did not touch since the last
  // call need not be named.
  virtual void grain_done(int unit, size_t offset, size_t count) = 0;
  // One sequence's contribution to rows of one tensor, as the token embedding rows it touched,
  // held compact in x (op memory): row r of x is for [offset + rows[r]·row_len, + row_len) of
  // the unit. rows: host memory, distinct. x may be cleared.
  virtual void grain_rows(int unit, size_t offset, float* x, const int32_t* rows, size_t n_rows, size_t row_len) = 0;
  // The backward pass has added everything it will to the unit's gradient in this microbatch.
  virtual void grads_done(int unit) = 0;
};
// Training FLOPs per token (forward + backward): 6 per matmul weight (the embedding table counts
// once, as the LM head) plus the attention score and value products, 12·L·C·T.
double gpt2_train_flops_per_token(const ModelConfig& cfg, int seq_len);

// Which full arrays the model allocates for itself. A sharded run leaves out what it shards.
struct Gpt2Storage {
  bool params = true;
  bool grads = true;
  // Activation checkpointing: keep only each block's input and recompute the block's activations
  // in the backward pass (one block's worth of memory instead of L, for one more forward pass).
  // The recomputed values are the same bits, so the gradients do not change.
  bool activation_checkpointing = false;
  // Each sequence's forward pass and parameter gradient independent of its microbatch (see
  // UnitAccess), which deterministic training needs. Off: products and gradients over a whole
  // microbatch at once (larger products, faster, most of all on GPUs), whose rounding then
  // depends on the microbatch size; the blocks' backward holds a microbatch's gradients of the
  // MLP and attention inputs instead of one sequence's.
  bool microbatch_invariant = true;
};

// Bytes of activations (and their gradients) a Gpt2 built with storage holds for microbatches of
// up to max_batch sequences of max_seq tokens: what activation_bytes() will report, known before
// building it.
size_t gpt2_activation_bytes(const ModelConfig& cfg, int max_batch, int max_seq, const Gpt2Storage& storage);

class Gpt2 {
 public:
  // Buffers for microbatches of up to max_batch sequences of up to max_seq tokens.
  Gpt2(const ModelConfig& cfg, int max_batch, int max_seq, Gpt2Storage storage = {});

  const ModelConfig& config() const { return cfg_; }
  const std::vector<ParamTensor>& tensors() const { return layout_; }
  const std::vector<ParamUnit>& units() const { return units_; }
  size_t num_params() const { return num_params_; }
  bool microbatch_invariant() const { return invariant_; }
  // Replaces how units are reached (nullptr: the model's own arrays). Not owned.
  void set_unit_access(UnitAccess* access);
  // The most floats of the unit's gradient the backward pass asks UnitAccess::grads for at once:
  // of a block, its largest op's (the MLP projections' weight and bias); of the embeddings, a
  // chunk of the LM head's rows or a sequence's positions; the final norm whole.
  size_t largest_grads_span(int unit) const;
  size_t activation_bytes() const { return (act_memory_.size() + grad_act_memory_.size()) * sizeof(float); }
  // Reallocates the activations for microbatches of up to max_batch sequences.
  void set_max_batch(int max_batch);
  // The model's own full arrays (op memory): null when Gpt2Storage left them out.
  float* params() { return params_.data(); }
  const float* params() const { return params_.data(); }
  float* grads() { return grads_.data(); }

  // What matrix products compute in. Under bf16 / fp16 every matrix product's operands (weights
  // and biases, activations, the gradients flowing back) and its outputs are rounded to that
  // dtype, as autocast does; layer norms, softmax, attention's sums, the loss and every
  // parameter gradient stay fp32 (docs/precision.md).
  void set_compute_dtype(ComputeDtype dtype);
  ComputeDtype compute_dtype() const { return dtype_; }

  // gpt2_init_params over the model's own parameter array.
  void init_weights(uint64_t seed);
  void zero_grad();

  // Runs tokens (B,T) through the model (eval, generation). With targets (B,T) (kIgnoreIndex
  // allowed) it also computes per-token losses and returns their sum; the count of non-ignored
  // targets goes to *n_targets (may be null). The logits are formed one sequence at a time, so
  // only the last sequence's remain (logits()).
  double forward(const int32_t* tokens, const int32_t* targets, int B, int T, int64_t* n_targets);
  // Training: the forward pass, then adds to grads() the gradient of dloss · (sum of the
  // per-token losses). Returns that sum, as forward() does. The logits are consumed.
  double forward_backward(const int32_t* tokens, const int32_t* targets, int B, int T, float dloss,
                          int64_t* n_targets);

  // (T,V) in op memory: the last sequence of the last forward(), the LM head's fp32 products
  // (under amp, of 16-bit operands; the loss reads them rounded: crossentropy.h).
  const float* logits() const { return acts_.logits; }
  // (B,T) per-token losses of the last forward() with targets or forward_backward(); 0 where
  // ignored. Host memory.
  const float* losses() const { return losses_host_.data(); }

 private:
  // A block's activations, per layer (or for one layer under activation checkpointing).
  struct BlockActs {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att_lse, *residual2, *ln2, *ln2_mean, *ln2_rstd, *fch;
  };
  struct Acts {
    BlockActs block;  // layer l's at offset l·(its size for one layer)
    float *encoded, *residual3, *lnf, *lnf_mean, *lnf_rstd, *logits, *losses, *ce_lse, *scratch;
    // GELU's output, the MLP projection's input: one layer's, not kept per layer, since the
    // backward pass recomputes it from fch a sequence at a time (the same bits) for less memory.
    float* fch_gelu;
  };
  // One block's tensors inside its unit, in layout order.
  struct Block {
    float *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
  };
  Block bind_block(const float* base) const;
  // A block unit's parameters as matrix products use them: p itself in fp32; otherwise a copy in
  // compute_params_ with the matrix operands rounded.
  const float* compute_params(int unit, const float* p);
  // The LM head (the token embedding p, tied) as the products use it, held by the matmuls
  // (matmul_hold_weight) until matmul_release_weight: p itself in fp32, and where the hold
  // rounds it (lm_head_held_rounded_); otherwise a rounded copy in compute_params_.
  const float* hold_lm_head(const float* p);
  // x (n <= one grain's T·C) rounded to the compute dtype, in rounded_dres_ (x itself in fp32).
  const float* rounded(const float* x, long n);
  // Sequences per grain of the backward pass: 1, or the whole microbatch when not invariant.
  int grain_sequences() const { return invariant_ ? 1 : max_batch_; }
  // rounded_dres_ for the compute dtype and the grain.
  void allocate_rounded_dres();
  class OwnArrays;
  // Layer l's activations (slot 0 for every layer under activation checkpointing).
  BlockActs block_acts(int l) const;
  // Embeddings, blocks and the final norm, up to acts_.lnf.
  void forward_to_lnf(const int32_t* tokens, int B, int T);
  // Block l over the microbatch: its activations in block_acts(l), its output in residual3 of l.
  void block_forward(int l, const Block& p, const float* residual);
  // Sequence b's logits (T,V) into acts_.logits; emb: the LM head (hold_lm_head).
  void lm_head(const float* emb, int b);
  void check_targets(const int32_t* targets, int N) const;
  // Copies the losses to the host and sums them.
  double sum_losses(const int32_t* targets, int N, int64_t* n_targets);
  // The host targets copied where the ops run; returns that copy.
  const int32_t* upload_targets(const int32_t* targets, int N);
  // LM head forward, cross-entropy and the backward pass, after forward_to_lnf; targets_op as
  // upload_targets returned them.
  void backward(const int32_t* targets_op, float dloss);

  ModelConfig cfg_;
  int max_batch_, max_seq_;
  bool checkpointing_, invariant_;
  std::vector<ParamTensor> layout_;
  std::vector<ParamUnit> units_;
  size_t num_params_ = 0;
  OpArray<float> params_, grads_, act_memory_, grad_act_memory_, compute_params_, rounded_dres_;
  OpArray<int32_t> tokens_op_, targets_op_;  // the microbatch's tokens and targets, where the ops run
  std::vector<float> losses_host_;
  ComputeDtype dtype_ = ComputeDtype::kFp32;
  bool lm_head_held_rounded_ = false;  // amp, and matmul_hold_rounds_weight(): no copy of unit 0
  std::unique_ptr<UnitAccess> own_access_;
  UnitAccess* access_ = nullptr;
  Acts acts_{};
  // Gradients of activations: dresidual_ and dsmall_ for the microbatch, dbig_ and dqkv_ for one
  // grain (the blocks' backward works a grain at a time); demb_rows_ the token embedding's
  // gradient for one sequence, a row per distinct token (touched_rows_).
  float *dresidual_ = nullptr, *dbig_ = nullptr, *dqkv_ = nullptr, *dsmall_ = nullptr, *demb_rows_ = nullptr;
  const int32_t* tokens_ = nullptr;  // of the last forward (host), for the embedding's backward
  std::vector<int32_t> touched_rows_;  // one sequence's distinct tokens, ascending (capacity max_seq)
  std::vector<int32_t> compact_tokens_;  // each position's token as its index in touched_rows_
  OpArray<int32_t> compact_tokens_op_;   // the same where the ops run
  int B_ = 0, T_ = 0;
};

}  // namespace anvil
