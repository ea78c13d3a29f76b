// The decoder's forward and backward, written once against the ops of src/kernels for every
// family's options.
#include "model/decoder.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <limits>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/attention.h"
#include "kernels/columns.h"
#include "kernels/crossentropy.h"
#include "kernels/dropout.h"
#include "kernels/encoder.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/lora.h"
#include "kernels/matmul.h"
#include "kernels/moe.h"
#include "kernels/residual.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/round.h"
#include "kernels/swiglu.h"
#include "model/tensor_parallel.h"

namespace anvil {
namespace {
// Vocabulary rows per piece of the LM head's backward (Decoder::lm_head_backward) where the
// products are split (matmul_column_block): a multiple of kMatmulSumBlock, so that the pieces'
// input-gradient sums are one product's.
constexpr int kVocabChunk = 8 * kMatmulSumBlock;
// A tensor-parallel share's vocabulary starts at a multiple of the cross-entropy's sum block
// (model/tensor_parallel.h), and so at one of the pieces.
static_assert(kCrossentropySumBlock % kVocabChunk == 0);
}  // namespace

Decoder::Block Decoder::bind_block(const float* base) const {
  Block b{};
  float** p = &b.ln1w;
  float* cursor = const_cast<float*>(base);
  for (size_t i = 0; i < block_sizes_.size(); i++) {
    p[i] = block_sizes_[i] ? cursor : nullptr;
    cursor += block_sizes_[i];
  }
  return b;
}

size_t Decoder::norm_params(int width) const {
  return static_cast<size_t>(width ? width : cfg_.d_model) * (has_norm_bias(cfg_) ? 2 : 1);
}

AttentionHeads Decoder::attention_heads(int l) const {
  AttentionHeads a{cfg_.n_heads, cfg_.kv_heads(), cfg_.head_size()};
  a.alibi = cfg_.positions == PositionKind::kAlibi;
  a.window = cfg_.sliding_window;
  a.alibi_bias_max = cfg_.alibi_bias_max;
  a.dropout = dropout_site(1 + l, DropoutKind::kAttention, cfg_.attn_pdrop, 0);
  a.operands = dtype();  // amp's q, k, v and their gradients are 16-bit values: docs/precision.md
  if (cfg_.tensor_share()) {
    a.first_head = cfg_.tensor_rank * cfg_.n_heads;
    a.all_heads = cfg_.tensor_ranks * cfg_.n_heads;
  }
  return a;
}

DropoutSite Decoder::dropout_site(int layer, DropoutKind kind, float p, int b0) const {
  if (!training_ || p <= 0.0f) return {};
  const DropoutPosition& at = dropout_position_;
  return {dropout_key(at.seed, at.step, layer, kind), at.first_sample + b0, p};
}

const float* Decoder::branch_grad(const float* dres, int layer, DropoutKind kind, int b0, int n_seq) {
  const long n = static_cast<long>(n_seq) * T_ * cfg_.d_model;
  const DropoutSite site = dropout_site(layer, kind, cfg_.resid_pdrop, b0);
  if (!site.active()) return rounded(dres, n);
  dropout_apply(kernels(), rounded_dres_.data(), dres, n_seq, static_cast<long>(T_) * cfg_.d_model, site);
  round_to_dtype(kernels(), rounded_dres_.data(), n, dtype());
  return rounded_dres_.data();
}

Decoder::Decoder(const ModelConfig& cfg, int max_batch, int max_seq, const ModelStorage& storage)
    : Model(cfg, max_seq, storage), max_batch_(max_batch), matmul_(storage.kernels) {
  const std::vector<BlockTensor> block = block_tensors(cfg);
  for (size_t i = 0; i < block_sizes_.size(); i++) block_sizes_[i] = numel_of(block[i].shape);
  base_units_ = model_units(model_param_layout(cfg.base()));
  if (cfg.has_lora()) {
    lora_ = lora_targets(cfg);
    size_t offset = 0;
    for (const LoraModule& m : lora_) {
      lora_offset_.push_back(offset);
      offset += static_cast<size_t>(cfg.lora.r) * (m.in + m.rows);
    }
    frozen_dnorm_.assign_zeros(kernels(), norm_params(std::max(cfg_.d_model, cfg_.q_width())));
  }
  if (frozen()) {
    for (int l = 0; l < cfg.n_layers; l++) stage_units_.push_back(l);
  } else {
    const std::vector<ParamTensor> whole = model_param_layout(cfg);
    stage_units_.assign(static_cast<size_t>(cfg.n_layers) + 2, -1);
    for (const ParamTensor& t : tensors()) stage_units_[whole[t.index].unit] = t.unit;
  }
  set_max_batch(max_batch);
}

int Decoder::stage_unit(int unit) const {
  ANVIL_CHECK(unit >= 0 && static_cast<size_t>(unit) < stage_units_.size() && stage_units_[unit] >= 0,
              "unit {} of the model is not in the pipeline stage of blocks [{}, {})", unit, stage().first_layer,
              stage().end_layer);
  return stage_units_[unit];
}

void Decoder::set_max_batch(int max_batch) {
  ANVIL_CHECK(max_batch >= 1, "a microbatch must hold at least one sequence, got {}", max_batch);
  max_batch_ = max_batch;
  const ActivationSizes sizes = activation_sizes(cfg_, max_batch, max_seq_, storage_);
  // Freed first, so that growing never holds the old and the new buffers at once.
  act_memory_.reset();
  grad_act_memory_.reset();
  act_memory_.assign_zeros(kernels(), sizes.total() - sizes.grads);
  float* cursor = act_memory_.data();
  float** block = &acts_.block.ln1;
  for (size_t i = 0; i < std::size(sizes.block); i++) {
    block[i] = cursor;
    cursor += sizes.block_layers * sizes.block[i];
  }
  float** rest = &acts_.encoded;
  for (size_t i = 0; i < std::size(sizes.rest); i++) {
    rest[i] = cursor;
    cursor += sizes.rest[i];
  }
  float** lora[] = {&lora_u_, &lora_v_, &lora_du_, &lora_x_, &lora_dx_};
  for (size_t i = 0; i < std::size(sizes.lora); i++) {
    *lora[i] = cursor;
    cursor += sizes.lora[i];
  }
  const size_t BT = static_cast<size_t>(max_batch) * max_seq_, T = max_seq_, C = cfg_.d_model;
  grad_act_memory_.assign_zeros(kernels(), sizes.grads);
  tokens_op_.assign_zeros(kernels(), BT);
  targets_op_.assign_zeros(kernels(), BT);
  touched_rows_.reserve(BT);
  touched_offsets_.reserve(static_cast<size_t>(max_batch) + 1);
  compact_tokens_.resize(BT);
  compact_tokens_op_.assign_zeros(kernels(), BT);
  touched_rows_op_.assign_zeros(kernels(), BT);
  positions_op_.assign_zeros(kernels(), BT);
  losses_host_.assign(BT, 0.0f);
  dresidual_ = grad_act_memory_.data();
  dsmall_ = dresidual_ + held_capacity() * C;
  dbig_ = dsmall_ + BT * Widths(cfg_).dsmall;
  const size_t GT = static_cast<size_t>(grain_sequences()) * T;
  const Widths w(cfg_);
  const size_t GK = GT * w.slots;  // a grain's rows of the MLP's products
  const bool swiglu = cfg_.mlp == MlpKind::kSwiglu;
  dfc_ = swiglu ? dbig_ + GK * w.hidden : dbig_;  // GELU's backward runs in place
  dqkv_ = dbig_ + GK * w.hidden + (swiglu ? GK * w.fc : 0);
  demb_rows_ = dqkv_ + BT * w.qkv;
  gathered_ = cfg_.tensor_share() ? demb_rows_ + T * C : nullptr;
  const bool rms_chain = cfg_.tensor_share() && cfg_.norm == NormKind::kRmsNorm;
  rms_weight_sums_.assign(rms_chain ? std::max<size_t>(C, cfg_.head_size()) : 0, 0.0);
  holders_.reserve(static_cast<size_t>(cfg_.tensor_ranks));
  all_ranks_.resize(static_cast<size_t>(cfg_.tensor_ranks));
  std::iota(all_ranks_.begin(), all_ranks_.end(), 0);
  dqk_ = demb_rows_ + T * C + (cfg_.tensor_share() ? GT * C : 0);
  if (cfg_.has_moe()) {
    dexpert_out_ = dqk_ + (cfg_.qk_norm != QkNorm::kNone ? GT * w.q : 0);
    dexpert_in_ = dexpert_out_ + GK * C;
    drouter_ = dexpert_in_ + GK * C;
    droute_weights_ = drouter_ + GT * w.experts;
    dprobs_ = droute_weights_ + GK;
    const size_t layers = sizes.moe_routes / (7 * BT * w.slots);
    moe_routes_memory_.reset();
    moe_routes_memory_.assign_zeros(kernels(), sizes.moe_routes);
    moe_host_.assign(layers, {});
    expert_rows_.clear();
    expert_rows_.resize(layers);
    moe_scratch_.resize(7 * BT * w.slots);
    moe_probs_host_.resize(BT * w.experts);
    moe_dprobs_host_.resize(GT * w.experts);
  }
  allocate_rounded_dres();
}

size_t Decoder::largest_grads_span(int stage_unit) const {
  ANVIL_CHECK(stage_unit >= 0 && static_cast<size_t>(stage_unit) < units().size(), "no unit {} in a model of {}",
              stage_unit, units().size());
  const int unit = static_cast<int>(std::find(stage_units_.begin(), stage_units_.end(), stage_unit) -
                                    stage_units_.begin());
  if (frozen()) {
    size_t largest = 0;
    for (const LoraModule& m : lora_) largest = std::max(largest, static_cast<size_t>(cfg_.lora.r) * (m.in + m.rows));
    return largest;
  }
  const size_t C = cfg_.d_model,
               head_chunk = static_cast<size_t>(matmul_column_block(kernels(), cfg_.vocab_size, kVocabChunk)) * C,
               head_spans = sequence_spans_extent(head_chunk, head_grain_sequences(cfg_, max_batch_, storage_));
  const bool learned = cfg_.positions == PositionKind::kLearned;
  if (unit == 0)
    return std::max(cfg_.tied_embeddings ? head_spans : 0, learned ? static_cast<size_t>(max_seq_) * C : 0);
  if (unit == cfg_.n_layers + 1) return std::max(norm_params(), cfg_.tied_embeddings ? 0 : head_spans);
  return block_grads_span(cfg_, max_batch_, storage_);
}

Decoder::BlockActs Decoder::block_acts(int l) const {
  const ActivationSizes sizes = activation_sizes(cfg_, max_batch_, max_seq_, storage_);
  const size_t slot = layer_slot(l);
  BlockActs x = acts_.block;
  float** p = &x.ln1;
  for (size_t i = 0; i < std::size(sizes.block); i++) p[i] += slot * sizes.block[i];
  return x;
}

void Decoder::set_compute_dtype(ComputeDtype dtype) {
  matmul_.set_operand_dtype(dtype);  // every matmul operand below is rounded to it
  lm_head_held_rounded_ = dtype != ComputeDtype::kFp32 && matmul_.hold_rounds_weight();
  // Room for a block's rounded copy, and for the LM head's (on the last stage) unless the hold
  // rounds it.
  size_t largest = lm_head_held_rounded_ || !last_stage() ? 0 : static_cast<size_t>(cfg_.vocab_size) * cfg_.d_model;
  for (int l = 0; l < cfg_.n_layers; l++) largest = std::max(largest, base_units_[1 + l].numel);
  compute_params_.assign_zeros(kernels(), dtype == ComputeDtype::kFp32 ? 0 : largest);
  adapters_rounded_.assign_zeros(kernels(), dtype == ComputeDtype::kFp32 || !frozen() ? 0 : units()[0].numel);
  allocate_rounded_dres();
}

void Decoder::set_base_weights(const std::vector<float>& base, bool held_in_bf16) {
  ANVIL_CHECK(frozen(), "only a LoRA model holds a frozen base");
  const size_t n = model_num_params(cfg_.base());
  ANVIL_CHECK(base.size() == n, "the base model has {} parameters, {} were given", n, base.size());
  for (OpArray<float>* a : {&base_, &base_norms_, &base_block_}) a->reset();
  base_bf16_.reset();
  if (!held_in_bf16) {
    base_.assign_zeros(kernels(), n);
    op_copy_from_host(kernels(), base_.data(), base.data(), n * sizeof(float));
    return;
  }
  const int L = cfg_.n_layers;
  const size_t lo = base_units_[1].offset, hi = base_units_[L].offset + base_units_[L].numel;
  std::vector<float> outside(base.begin(), base.begin() + static_cast<std::ptrdiff_t>(lo));
  outside.insert(outside.end(), base.begin() + static_cast<std::ptrdiff_t>(hi), base.end());
  std::vector<uint16_t> blocks(hi - lo);
  for (size_t i = 0; i < blocks.size(); i++) blocks[i] = float_to_bf16(base[lo + i]);
  std::vector<float> norms;
  size_t largest = 0;
  for (int l = 0; l < L; l++) {
    const Block b = bind_block(base.data() + base_units_[1 + l].offset);
    norms.insert(norms.end(), b.ln1w, b.qkvw);
    norms.insert(norms.end(), b.ln2w, b.fcw);
    largest = std::max(largest, base_units_[1 + l].numel);
  }
  base_.assign_zeros(kernels(), outside.size());
  op_copy_from_host(kernels(), base_.data(), outside.data(), outside.size() * sizeof(float));
  base_bf16_.assign_zeros(kernels(), blocks.size());
  op_copy_from_host(kernels(), base_bf16_.data(), blocks.data(), blocks.size() * sizeof(uint16_t));
  base_norms_.assign_zeros(kernels(), norms.size());
  op_copy_from_host(kernels(), base_norms_.data(), norms.data(), norms.size() * sizeof(float));
  base_block_.assign_zeros(kernels(), largest);
}

size_t Decoder::base_bytes() const {
  return (base_.size() + base_norms_.size() + base_block_.size()) * sizeof(float) +
         base_bf16_.size() * sizeof(uint16_t);
}

const float* Decoder::acquire_base(int unit, int next_unit) {
  if (!frozen()) return units_in_stage_.acquire_params(unit, next_unit);
  ANVIL_CHECK(!base_.empty(), "a LoRA model needs its base's weights (Model::set_base_weights) before a pass");
  if (base_bf16_.empty()) return base_.data() + base_units_[unit].offset;
  ANVIL_CHECK(dtype() == ComputeDtype::kBf16, "the frozen base is held in bf16, which only amp_bf16's products read");
  const int L = cfg_.n_layers;
  if (unit == 0) return base_.data();
  if (unit == L + 1) return base_.data() + base_units_[0].numel;  // after the embeddings
  const ParamUnit& u = base_units_[unit];
  widen_bf16(kernels(), base_block_.data(), base_bf16_.data() + (u.offset - base_units_[1].offset),
             static_cast<long>(u.numel));
  // A block's norms: those before qkv (ln1's, and the QK norms'), then ln2's.
  const Block b = bind_block(base_block_.data());
  const size_t first = b.qkvw - b.ln1w, second = b.fcw - b.ln2w;
  const float* norms = base_norms_.data() + static_cast<size_t>(unit - 1) * (first + second);
  op_copy(kernels(), b.ln1w, norms, first * sizeof(float));
  op_copy(kernels(), b.ln2w, norms + first, second * sizeof(float));
  return base_block_.data();
}

void Decoder::release_base(int unit) {
  if (!frozen()) units_in_stage_.release_params(unit);
}

const float* Decoder::acquire_adapters(int l, int next_l) {
  if (!frozen()) return nullptr;
  const float* p = units_in_stage_.acquire_params(l, next_l);
  if (dtype() == ComputeDtype::kFp32) return p;
  // Every adapter tensor is a matrix operand.
  const size_t n = units()[l].numel;
  op_copy(kernels(), adapters_rounded_.data(), p, n * sizeof(float));
  round_to_dtype(kernels(), adapters_rounded_.data(), static_cast<long>(n), dtype());
  return adapters_rounded_.data();
}

void Decoder::release_adapters(int l) {
  if (frozen()) units_in_stage_.release_params(l);
}

float* Decoder::lora_u(int l, int k) const {
  const size_t slot = storage_.activation_checkpointing ? 0 : static_cast<size_t>(l);
  const size_t BT = static_cast<size_t>(max_batch_) * max_seq_;
  return lora_u_ + ((slot * lora_.size() + k) * BT) * cfg_.lora.r;
}

DropoutSite Decoder::lora_dropout_site(int l, int k, int b0) const {
  return dropout_site(1 + l, lora_dropout_kind(k), cfg_.lora.dropout, b0);
}

void Decoder::allocate_rounded_dres() {
  // The gradient of the residual stream, rounded (or masked by residual dropout) for the
  // projections' backward, needs its own grain-sized buffer.
  const size_t n = static_cast<size_t>(grain_sequences()) * max_seq_ * cfg_.d_model;
  rounded_dres_.assign_zeros(kernels(), dtype() == ComputeDtype::kFp32 && cfg_.resid_pdrop == 0 ? 0 : n);
}

const float* Decoder::rounded(const float* x, long n) {
  if (dtype() == ComputeDtype::kFp32) return x;
  op_copy(kernels(), rounded_dres_.data(), x, n * sizeof(float));
  round_to_dtype(kernels(), rounded_dres_.data(), n, dtype());
  return rounded_dres_.data();
}

const float* Decoder::hold_lm_head(const float* p) {
  if (dtype() == ComputeDtype::kFp32) return p;
  const int V = cfg_.vocab_size, C = cfg_.d_model;
  if (matmul_.hold_rounds_weight()) {
    matmul_.hold_weight(p, V, C);
    return p;
  }
  float* out = compute_params_.data();
  op_copy(kernels(), out, p, static_cast<size_t>(V) * C * sizeof(float));
  round_to_dtype(kernels(), out, static_cast<long>(V) * C, dtype());
  matmul_.hold_weight(out, V, C);
  return out;
}

const float* Decoder::compute_params(int unit, const float* p) {
  if (dtype() == ComputeDtype::kFp32) return p;
  float* out = compute_params_.data();
  const size_t n = base_units_[unit].numel;
  op_copy(kernels(), out, p, n * sizeof(float));
  // A block holds ln1 | qkv, attproj | ln2 | fc, fcproj (each with its bias, if any): the norms
  // stay fp32.
  const Block b = bind_block(out);
  round_to_dtype(kernels(), b.qkvw, b.ln2w - b.qkvw, dtype());
  round_to_dtype(kernels(), b.fcw, (out + n) - b.fcw, dtype());
  return out;
}

void Decoder::norm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                           int N, int width) {
  if (cfg_.norm == NormKind::kRmsNorm) return rmsnorm_forward(kernels(), out, rstd, inp, w, cfg_.norm_eps, N, width);
  layernorm_forward(kernels(), out, mean, rstd, inp, w, b, N, width);
}

void Decoder::norm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                            const float* mean, const float* rstd, int N, int width) {
  if (cfg_.norm == NormKind::kRmsNorm) return rmsnorm_backward(kernels(), dinp, dw, dout, inp, w, rstd, N, width);
  layernorm_backward(kernels(), dinp, dw, has_norm_bias(cfg_) ? dw + width : nullptr, dout, inp, w, mean, rstd, N,
                     width);
}

void Decoder::mlp_activation(float* out, const float* fch, int N) {
  const int F = cfg_.mlp_width();
  if (cfg_.mlp == MlpKind::kSwiglu) return swiglu_forward(kernels(), out, fch, N, F, dtype());
  gelu_forward(kernels(), out, fch, static_cast<long>(N) * F,
               cfg_.mlp == MlpKind::kGeluErf ? GeluForm::kErf : GeluForm::kTanh, dtype());
}

void Decoder::mlp_activation_backward(float* dfc, const float* fch, const float* dout, int N) {
  const int F = cfg_.mlp_width();
  if (cfg_.mlp == MlpKind::kSwiglu) return swiglu_backward(kernels(), dfc, fch, dout, N, F, dtype());
  gelu_backward(kernels(), dfc, fch, dout, static_cast<long>(N) * F,
                cfg_.mlp == MlpKind::kGeluErf ? GeluForm::kErf : GeluForm::kTanh, dtype());
}

void matmul_forward_microbatch(MatmulContext& ctx, bool invariant, float* out, const float* inp, const float* weight,
                               const float* bias, int B, int T, int C, int OC) {
  if (invariant) return matmul_forward_sequences(ctx, out, inp, weight, bias, B, T, C, OC);
  matmul_forward(ctx, out, inp, weight, bias, B * T, C, OC);
}

void Decoder::forward_to_lnf(const int32_t* tokens, const int32_t* positions, const float* input, int B, int T) {
  ANVIL_CHECK(B >= 1 && B <= max_batch_ && T >= 1 && T <= max_seq_,
              "batch {}x{} exceeds the model's buffers ({}x{})", B, T, max_batch_, max_seq_);
  ANVIL_CHECK(!cfg_.tensor_share() || tensor_exchange_, "a tensor-parallel share of {} ranks runs with the other "
              "ranks: set_tensor_exchange first", cfg_.tensor_ranks);
  const int C = cfg_.d_model, V = cfg_.whole_vocab(), L = cfg_.n_layers;
  const int N = B * T;
  ANVIL_CHECK(first_stage() ? tokens != nullptr : input != nullptr, "the pipeline stage of blocks [{}, {}) starts "
              "from {}", stage().first_layer, stage().end_layer,
              first_stage() ? "tokens" : "the previous stage's output");
  if (first_stage()) {
    for (int i = 0; i < N; i++)
      ANVIL_CHECK(tokens[i] >= 0 && tokens[i] < V, "token id {} out of range for vocab_size {}", tokens[i], V);
    tokens_ = tokens;
    op_copy_from_host(kernels(), tokens_op_.data(), tokens, static_cast<size_t>(N) * sizeof(int32_t));
  }
  packed_ = positions != nullptr;
  if (packed_) {
    // Positions count from each example's start (kernels/positions.h), which the attention
    // kernels rely on: a query's first key never comes before the previous query's. (After a
    // kept prefix they count on from it, and attention sees whole sequences: attend().)
    for (int i = 0; i < N && !prefix_.after; i++)
      ANVIL_CHECK(positions[i] == 0 || (i % T > 0 && positions[i] == positions[i - 1] + 1), "position {} of token {} "
                  "of its sequence is neither 0 (an example's start) nor one more than the position before it",
                  positions[i], i % T);
    op_copy_from_host(kernels(), positions_op_.data(), positions, static_cast<size_t>(N) * sizeof(int32_t));
  }
  B_ = B;
  T_ = T;
  moe_stats_ = {};
  if (training_ && cfg_.has_moe())
    moe_stats_.balance.assign(static_cast<size_t>(stage().end_layer - stage().first_layer) * B, 0.0);
  Acts& a = acts_;
  const size_t wpe_offset = static_cast<size_t>(cfg_.vocab_size) * C;  // inside the embedding unit
  const bool learned = cfg_.positions == PositionKind::kLearned;

  const HeldRows held = held_rows(N);
  const size_t held_floats = static_cast<size_t>(held.n) * C;
  if (first_stage()) {
    // A tensor-parallel share forms every row (its tokens' from its vocabulary, the others' from
    // their ranks) and keeps the rows it holds.
    float* encoded = cfg_.tensor_share() ? a.scratch : a.encoded;
    const float* emb = acquire_base(0, 1);
    if (cfg_.tensor_share())
      vocab_parallel_embedding(encoded, emb, learned ? emb + wpe_offset : nullptr);
    else
      encoder_forward(kernels(), encoded, tokens_op_.data(), positions_op(0), emb,
                      learned ? emb + wpe_offset : nullptr, B, T, C);
    release_base(0);
    const DropoutSite emb_drop = dropout_site(0, DropoutKind::kEmbedding, cfg_.emb_pdrop, 0);
    if (emb_drop.active()) dropout_apply(kernels(), encoded, encoded, B, static_cast<long>(T) * C, emb_drop);
    if (cfg_.tensor_share())
      op_copy(kernels(), a.encoded, encoded + static_cast<size_t>(held.first) * C, held_floats * sizeof(float));
  } else {
    op_copy_from_host(kernels(), a.encoded, input, held_floats * sizeof(float));
  }
  for (int l = stage().first_layer; l < stage().end_layer; l++) {
    const Block p = bind_block(compute_params(1 + l, acquire_base(1 + l, 2 + l)));
    const float* adapters = acquire_adapters(l, l + 1 < L ? l + 1 : -1);
    block_forward(l, p, adapters, block_input(l));
    if (prefix_.keeping) {
      const size_t rows = static_cast<size_t>(T) * Widths(cfg_).qkv;
      op_copy(kernels(), prefix_.qkv.data() + l * rows, block_acts(l).qkv, rows * sizeof(float));
    }
    release_adapters(l);
    release_base(1 + l);
  }
  if (!last_stage()) return;
  const float* lnf = acquire_base(L + 1, head_unit());
  norm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, block_output(L - 1), lnf,
               has_norm_bias(cfg_) ? lnf + C : nullptr, held.n, C);
  round_to_dtype(kernels(), a.lnf, static_cast<long>(held_floats), dtype());
  release_base(L + 1);
}

void Decoder::block_forward(int l, const Block& p, const float* adapters, const float* residual) {
  const int B = B_, T = T_, C = cfg_.d_model, N = B * T;
  const Widths w(cfg_);
  const BlockActs x = block_acts(l);
  float* residual3 = block_output(l);
  float* scratch = acts_.scratch;
  // Under amp every matrix product's input and output is rounded to the compute dtype (a no-op in
  // fp32); the residual stream and the norms stay fp32. Under sequence parallelism the norms and
  // the residual sums run over the rows held; a norm's output is gathered whole into scratch for
  // the product it feeds, and a row-parallel product's output (dropout applied on the chain's last
  // rank) goes to the rows' holders for the residual sum.
  const HeldRows held = held_rows(N);
  const long HC = static_cast<long>(held.n) * C;
  const size_t first = static_cast<size_t>(held.first) * C;
  auto whole = [&](const float* normed) {
    if (!cfg_.tensor_share()) return normed;
    gather_held_rows(scratch, normed, 0, N, C);
    return static_cast<const float*>(scratch);
  };
  auto add_branch = [&](float* out, const float* in, DropoutKind kind) {
    const DropoutSite drop = dropout_site(1 + l, kind, cfg_.resid_pdrop, 0);
    const bool last = !cfg_.tensor_share() || tensor_exchange_->rank() + 1 == tensor_exchange_->ranks();
    if (drop.active() && last) dropout_apply(kernels(), scratch, scratch, B, static_cast<long>(T) * C, drop);
    if (cfg_.tensor_share()) send_rows_to_holders(scratch, 0, N, C);
    residual_forward(kernels(), out, in, scratch + first, HC);
  };
  norm_forward(x.ln1, x.ln1_mean, x.ln1_rstd, residual, p.ln1w, p.ln1b, held.n, C);
  round_to_dtype(kernels(), x.ln1, HC, dtype());
  linear_forward(l, linear(p, BlockProduct::kQkv), x.qkv, whole(x.ln1), adapters);
  if (cfg_.qk_norm != QkNorm::kNone) qk_norm_forward(x, p);
  if (cfg_.positions == PositionKind::kRope) {
    // The rotated queries and keys are what attention saw: kept for the backward pass as qkv.
    rope_forward(kernels(), x.qkv, positions_op(0), B, T, w.qkv, cfg_.n_heads + cfg_.kv_heads(), cfg_.head_size(),
                 cfg_.rope);
    round_to_dtype(kernels(), x.qkv, static_cast<long>(N) * w.qkv, dtype());
  }
  attend(l, x);
  round_to_dtype(kernels(), x.atty, static_cast<long>(N) * w.q, dtype());
  linear_forward(l, linear(p, BlockProduct::kAttnOut), scratch, x.atty, adapters);
  // Residual dropout on each branch's output, before it joins the stream.
  add_branch(x.residual2, residual, DropoutKind::kAttentionOutput);
  norm_forward(x.ln2, x.ln2_mean, x.ln2_rstd, x.residual2, p.ln2w, p.ln2b, held.n, C);
  round_to_dtype(kernels(), x.ln2, HC, dtype());
  if (cfg_.has_moe()) {
    moe_forward(l, x, p, adapters, scratch);
  } else {
    linear_forward(l, linear(p, BlockProduct::kFc), x.fch, whole(x.ln2), adapters);
    mlp_activation(acts_.fch_gelu, x.fch, N);
    linear_forward(l, linear(p, BlockProduct::kFcProj), scratch, acts_.fch_gelu, adapters);
  }
  add_branch(residual3, x.residual2, DropoutKind::kMlpOutput);
}

// The queries' and the keys' columns of a qkv row, each normed as `per_position` rows of `norm`
// channels (one row for the whole part, or one per head); their raw values and the norms' saves
// start at `raw` and `save` (per position) in the layer's arrays, the keys' after room for the
// largest microbatch's queries.
Decoder::QkNormPart Decoder::qk_norm_part(bool keys) const {
  const size_t BT = static_cast<size_t>(max_batch_) * max_seq_;
  const int q = cfg_.q_width(), per_head = cfg_.qk_norm == QkNorm::kPerHead;
  const int heads = keys ? cfg_.kv_heads() : cfg_.n_heads, width = keys ? cfg_.kv_width() : q;
  const int per_position = per_head ? heads : 1;
  return {keys ? q : 0, width, width / per_position, per_position, keys ? BT * q : 0,
          keys ? BT * (per_head ? cfg_.n_heads : 1) : 0};
}

void Decoder::qk_part_rows(const QkNormPart& q, float* grain_rows, float* qkv, int n, bool to_grain_rows) {
  // Head h's columns of qkv are its block of N rows.
  const int N = n * T_, qkv_width = Widths(cfg_).qkv;
  const long block = static_cast<long>(N) * q.norm;
  float* columns = qkv + q.col0;
  if (to_grain_rows)
    copy_columns(kernels(), grain_rows, q.norm, block, columns, qkv_width, q.norm, N, q.norm, q.per_position);
  else
    copy_columns(kernels(), columns, qkv_width, q.norm, grain_rows, q.norm, block, N, q.norm, q.per_position);
}

bool Decoder::qk_norm_spans_ranks() const { return cfg_.tensor_share() && cfg_.qk_norm == QkNorm::kWhole; }

float* Decoder::qk_whole(int k, size_t n) {
  qk_whole_[k].resize(n);
  return qk_whole_[k].data();
}

void Decoder::gather_qk_columns(float* whole, const float* mine, int rows, int width) {
  TensorExchange& x = *tensor_exchange_;
  const int R = x.ranks();
  const size_t n = static_cast<size_t>(rows) * width;
  for (int q = 0; q < R; q++) {
    if (q == x.rank())
      qk_part_.assign(mine, mine + n);
    else
      qk_part_.resize(n);
    x.broadcast(qk_part_.data(), n, q);
    copy_columns(kernels(), whole + q * width, static_cast<long>(width) * R, 0, qk_part_.data(), width, 0, rows, width,
                 1);
  }
}

void Decoder::qk_norm_forward(const BlockActs& x, const Block& p) {
  const int N = B_ * T_, G = grain_sequences();
  const Widths w(cfg_);
  for (const bool keys : {false, true}) {
    const QkNormPart q = qk_norm_part(keys);
    float *raw = x.qk_raw + q.raw, *mean = x.qk_mean + q.save, *rstd = x.qk_rstd + q.save;
    for (int b = 0; b < B_; b += G) {
      const size_t r = static_cast<size_t>(b) * T_;
      qk_part_rows(q, raw + r * q.width, x.qkv + r * w.qkv, std::min(G, B_ - b), true);
    }
    const float *weight = keys ? p.klnw : p.qlnw, *bias = keys ? p.klnb : p.qlnb;
    if (qk_norm_spans_ranks()) {
      // Every rank norms the whole rows (all the heads' columns) alike and keeps its columns.
      const int R = cfg_.tensor_ranks, W = q.width * R;
      float* whole_raw = qk_whole(0, static_cast<size_t>(N) * W);
      float* whole_out = qk_whole(1, static_cast<size_t>(N) * W);
      gather_qk_columns(whole_raw, raw, N, q.width);
      norm_forward(whole_out, mean, rstd, whole_raw, weight, bias, N, W);
      copy_columns(kernels(), acts_.scratch, q.width, 0, whole_out + cfg_.tensor_rank * q.width, W, 0, N, q.width, 1);
    } else {
      norm_forward(acts_.scratch, mean, rstd, raw, weight, bias, N * q.per_position, q.norm);
    }
    for (int b = 0; b < B_; b += G) {
      const size_t r = static_cast<size_t>(b) * T_;
      qk_part_rows(q, acts_.scratch + r * q.width, x.qkv + r * w.qkv, std::min(G, B_ - b), false);
    }
  }
  round_to_dtype(kernels(), x.qkv, static_cast<long>(N) * w.qkv, dtype());
}

void Decoder::qk_norm_backward(int l, const BlockActs& x, const Block& p, int b, int n) {
  const int N = n * T_;
  const Widths w(cfg_);
  const size_t r = static_cast<size_t>(b) * T_;
  float* dnormed = dsmall_ + r * w.dsmall;  // free between the attention's backward and qkv's
  float* dqkv = dqkv_ + r * w.qkv;
  for (const bool keys : {false, true}) {
    const QkNormPart q = qk_norm_part(keys);
    const float* weight = keys ? p.klnw : p.qlnw;
    const bool spans = qk_norm_spans_ranks();
    const int W = spans ? q.width * cfg_.tensor_ranks : q.norm;  // the norm's width
    const size_t span = norm_params(W), at = static_cast<size_t>(weight - p.ln1w);
    const size_t saves = q.save + r * q.per_position;
    qk_part_rows(q, dnormed, dqkv, n, true);
    if (!spans) op_zero(kernels(), dqk_, static_cast<size_t>(N) * q.width * sizeof(float));
    float* dw = frozen() ? frozen_dnorm_.data() : units_in_stage_.grads(1 + l, at, span, 1);
    const float *raw = x.qk_raw + q.raw + r * q.width, *mean = x.qk_mean + saves, *rstd = x.qk_rstd + saves;
    if (spans) {
      // Every rank runs the whole rows' backward alike (the weight's gradient is one process's on
      // each) and keeps its columns of the input gradient.
      float* whole_raw = qk_whole(0, static_cast<size_t>(N) * W);
      float* whole_dout = qk_whole(1, static_cast<size_t>(N) * W);
      float* whole_dinp = qk_whole(2, static_cast<size_t>(N) * W);
      gather_qk_columns(whole_raw, raw, N, q.width);
      gather_qk_columns(whole_dout, dnormed, N, q.width);
      std::fill_n(whole_dinp, static_cast<size_t>(N) * W, 0.0f);
      norm_backward(whole_dinp, dw, whole_dout, whole_raw, weight, mean, rstd, N, W);
      copy_columns(kernels(), dqk_, q.width, 0, whole_dinp + cfg_.tensor_rank * q.width, W, 0, N, q.width, 1);
    } else if (cfg_.tensor_share()) {
      // Every rank's heads add to the weight's gradient, in head order: a chain of the ranks.
      chained_norm_backward(all_ranks_, dqk_, dw, dnormed, raw, weight, mean, rstd, N * q.per_position, q.norm);
    } else
      norm_backward(dqk_, dw, dnormed, raw, weight, mean, rstd, N * q.per_position, q.norm);
    if (!frozen()) units_in_stage_.grain_done(1 + l, at, span, 1);
    qk_part_rows(q, dqk_, dqkv, n, false);
  }
  round_to_dtype(kernels(), dqkv, static_cast<long>(N) * w.qkv, dtype());
}

Decoder::Linear Decoder::linear(const Block& p, BlockProduct product) const {
  const Widths w(cfg_);
  const int C = cfg_.d_model;
  auto make = [&](const float* weight, const float* bias, int in, int out) {
    return Linear{product, weight, bias, static_cast<size_t>(weight - p.ln1w), in, out};
  };
  switch (product) {
    case BlockProduct::kQkv: return make(p.qkvw, p.qkvb, C, w.qkv);
    case BlockProduct::kAttnOut: return make(p.attprojw, p.attprojb, w.q, C);
    case BlockProduct::kFc: return make(p.fcw, p.fcb, C, w.fc);
    case BlockProduct::kFcProj: return make(p.fcprojw, p.fcprojb, w.hidden, C);
    case BlockProduct::kRouter: return make(p.routerw, nullptr, C, w.experts);
  }
  ANVIL_FAIL("internal: block product {} unknown", static_cast<int>(product));
}

void Decoder::linear_forward(int l, const Linear& f, float* out, const float* inp, const float* adapters) {
  if (cfg_.tensor_share() && row_parallel(f.product))
    chained_forward(f, out, inp);
  else
    matmul_forward_microbatch(matmul_, microbatch_invariant(), out, inp, f.weight, f.bias, B_, T_, f.in, f.out);
  lora_forward(l, f.product, out, f.out, inp, adapters);
  round_to_dtype(kernels(), out, static_cast<long>(B_) * T_ * f.out, dtype());
}

void Decoder::linear_backward(int l, const Linear& f, float* dinp, const float* dout, const float* inp,
                              const float* adapters, int b, int n) {
  const int N = n * T_;
  if (frozen()) {
    matmul_backward(matmul_, dinp, nullptr, nullptr, dout, f.out, inp, f.weight, N, f.in, f.out, false);
    lora_backward(l, f.product, dinp, dout, f.out, inp, adapters, b, n);
  } else {
    const bool chained = cfg_.tensor_share() && column_parallel(f.product);
    const int spans = grain_spans(n);
    // Spans the products write where the access lets them (a GPU's deterministic training: every
    // sequence's, n of them, whatever the microbatch, so that each product runs alike), else add to.
    float* written = chained ? nullptr : units_in_stage_.grads_to_write(1 + l, f.offset, f.span(), spans);
    float* dw = written ? written : units_in_stage_.grads(1 + l, f.offset, f.span(), spans);
    float* db = f.bias ? dw + (f.bias - f.weight) : nullptr;
    ANVIL_CHECK(spans == 1 || !chained, "internal: a tensor-parallel share's grain of {} sequences", n);
    ANVIL_CHECK(!written || spans == n, "internal: {} sequences' gradients written into {} spans", n, spans);
    if (spans > 1 || written)
      matmul_backward_sequences(matmul_, dinp, dw, db, sequence_span_stride(f.span()), dout, inp, f.weight, n, T_,
                                f.in, f.out, written != nullptr);
    else
      matmul_backward(matmul_, chained ? nullptr : dinp, dw, db, dout, f.out, inp, f.weight, N, f.in, f.out, false);
    units_in_stage_.grain_done(1 + l, f.offset, f.span(), spans);
    if (chained) chained_input_grad(f, dinp, dout, b * T_, N);
  }
  round_to_dtype(kernels(), dinp, static_cast<long>(N) * f.in, dtype());
}

std::vector<int> Decoder::column_parts(BlockProduct p) const {
  const Widths w(cfg_);
  return p == BlockProduct::kQkv ? w.qkv_parts() : w.fc_parts();
}

void Decoder::gather_held_rows(float* whole, const float* held, int g0, int g1, int width) {
  TensorExchange& x = *tensor_exchange_;
  const int N = B_ * T_;
  for (int q = 0; q < x.ranks(); q++) {
    const HeldRows h = held_rows(q, N);
    const int a = std::max(g0, h.first), e = std::min(g1, h.first + h.n);
    if (a >= e) continue;
    float* to = whole + static_cast<size_t>(a - g0) * width;
    const size_t n = static_cast<size_t>(e - a) * width;
    if (q == x.rank()) op_copy(kernels(), to, held + static_cast<size_t>(a - h.first) * width, n * sizeof(float));
    x.broadcast(to, n, q);
  }
}

void Decoder::send_rows_to_holders(float* whole, int g0, int g1, int width) {
  TensorExchange& x = *tensor_exchange_;
  const int N = B_ * T_, last = x.ranks() - 1;
  for (int q = 0; q < last; q++) {
    const HeldRows h = held_rows(q, N);
    const int a = std::max(g0, h.first), e = std::min(g1, h.first + h.n);
    if (a >= e) continue;
    float* at = whole + static_cast<size_t>(a - g0) * width;
    const size_t n = static_cast<size_t>(e - a) * width;
    if (x.rank() == last) x.send(q, at, n);
    if (x.rank() == q) x.receive(last, at, n);
  }
  if (x.rank() == last) x.wait_sends();
}

void Decoder::norm_backward_rows(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                                 const float* mean, const float* rstd, int g0, int g1, int spans) {
  const int C = cfg_.d_model;
  const size_t c = static_cast<size_t>(C);
  if (spans > 1) {
    ANVIL_CHECK(!cfg_.tensor_share() && (g1 - g0) % spans == 0, "internal: a norm's {} rows in {} spans", g1 - g0,
                spans);
    const int T = (g1 - g0) / spans;
    const size_t stride = sequence_span_stride(norm_params());
    if (cfg_.norm == NormKind::kRmsNorm)
      return rmsnorm_backward_sequences(kernels(), dinp + g0 * c, dw, stride, dout, inp + g0 * c, w, rstd + g0, spans,
                                        T, C);
    return layernorm_backward_sequences(kernels(), dinp + g0 * c, dw, has_norm_bias(cfg_) ? dw + C : nullptr, stride,
                                        dout, inp + g0 * c, w, mean + g0, rstd + g0, spans, T, C);
  }
  if (!cfg_.tensor_share())
    return norm_backward(dinp + g0 * c, dw, dout, inp + g0 * c, w, mean + g0, rstd + g0, g1 - g0, C);
  const int N = B_ * T_;
  holders_.clear();
  for (int q = 0; q < tensor_exchange_->ranks(); q++) {
    const HeldRows h = held_rows(q, N);
    if (std::max(g0, h.first) < std::min(g1, h.first + h.n)) holders_.push_back(q);
  }
  // This rank's rows of [g0, g1), if any (none: it only receives the gradient).
  const HeldRows h = held_rows(N);
  const int a = std::max(g0, h.first), e = std::max(a, std::min(g1, h.first + h.n));
  const size_t at = static_cast<size_t>(a - h.first), from = static_cast<size_t>(a - g0);
  chained_norm_backward(holders_, dinp + at * c, dw, dout + from * c, inp + at * c, w, mean + at, rstd + at, e - a,
                        C);
}

void Decoder::chained_norm_backward(const std::vector<int>& order, float* dinp, float* dw, const float* dout,
                                    const float* inp, const float* w, const float* mean, const float* rstd, int rows,
                                    int width) {
  TensorExchange& x = *tensor_exchange_;
  const size_t c = static_cast<size_t>(width), span = norm_params(width);
  const auto me = std::find(order.begin(), order.end(), x.rank());
  if (me != order.end()) {
    const bool first = me == order.begin(), last = me + 1 == order.end();
    if (cfg_.norm == NormKind::kRmsNorm) {
      // RMSNorm adds its weight's terms in double and the sum to dw once: the double sums go
      // from rank to rank (as the bytes of twice as many floats), and the last adds them.
      double* sums = rms_weight_sums_.data();
      float* sums_bytes = reinterpret_cast<float*>(sums);
      std::fill_n(sums, c, 0.0);
      if (!first) x.receive(me[-1], sums_bytes, 2 * c);
      norm_backward(dinp, nullptr, dout, inp, w, mean, rstd, rows, width);
      rmsnorm_weight_sums(kernels(), sums, dout, inp, rstd, rows, width);
      if (last)
        for (size_t k = 0; k < c; k++) dw[k] = static_cast<float>(dw[k] + sums[k]);
      else
        x.send(me[1], sums_bytes, 2 * c);
    } else {
      // LayerNorm adds each row's terms to dw in fp32: dw goes from rank to rank.
      if (!first) x.receive(me[-1], dw, span);
      norm_backward(dinp, dw, dout, inp, w, mean, rstd, rows, width);
      if (!last) x.send(me[1], dw, span);
    }
    x.wait_sends();
  }
  x.broadcast(dw, span, order.back());
}

const float* Decoder::lnf_rows(int b) {
  const int T = T_, C = cfg_.d_model;
  if (!cfg_.tensor_share()) return acts_.lnf + static_cast<size_t>(b) * T * C;
  gather_held_rows(gathered_, acts_.lnf, b * T, (b + 1) * T, C);
  return gathered_;
}

int Decoder::chain_rows(int N) const {
  const int links = 4 * tensor_exchange_->ranks();
  return std::max(8, (N + links - 1) / links);
}

void Decoder::chained_forward(const Linear& f, float* out, const float* inp) {
  std::vector<KSegment> whole_k;
  for (int q = 0; q < tensor_exchange_->ranks(); q++) whole_k.push_back({q, 0, f.in});
  chained_product(f, true, out, inp, f.in, B_ * T_, whole_k);
}

void Decoder::chained_input_grad(const Linear& f, float* dinp, const float* dout, int g0, int N) {
  std::vector<KSegment> whole_k;
  int at = 0;  // the part's first output in this rank's share
  for (int part : column_parts(f.product)) {
    for (int q = 0; q < tensor_exchange_->ranks(); q++) whole_k.push_back({q, at, part});
    at += part;
  }
  chained_product(f, false, dinp, dout, f.out, N, whole_k);
  send_rows_to_holders(dinp, g0, g0 + N, f.in);
}

float* Decoder::chain_scratch(size_t n) {
  if (chain_scratch_used_ == chain_scratch_.size()) chain_scratch_.emplace_back();
  std::vector<float>& v = chain_scratch_[chain_scratch_used_++];
  v.resize(n);
  return v.data();
}

void Decoder::chained_product(const Linear& f, bool forward, float* out, const float* a, long lda, int N,
                              const std::vector<KSegment>& whole_k) {
  TensorExchange& x = *tensor_exchange_;
  const int me = x.rank(), J = forward ? f.out : f.in, rows = chain_rows(N);
  const std::vector<KChainPiece> pieces = tensor_k_chain(whole_k);
  ANVIL_CHECK(!pieces.empty() && pieces.back().rank == x.ranks() - 1, "internal: a k chain ends on rank {}",
              pieces.empty() ? -1 : pieces.back().rank);
  chain_scratch_used_ = 0;
  const size_t n_rows = static_cast<size_t>(N), j = static_cast<size_t>(J);
  // This rank's k [local, local + len) of A (N × len) and of B (forward J × len, else len × J),
  // into a block of K columns (or K rows of B) at k offset `at`.
  auto place_a = [&](float* dst, int K, int at, int local, int len) {
    copy_columns(kernels(), dst + at, K, 0, a + local, lda, 0, N, len, 1);
  };
  auto place_b = [&](float* dst, int K, int at, int local, int len) {
    if (forward)
      copy_columns(kernels(), dst + at, K, 0, f.weight + local, f.in, 0, J, len, 1);
    else
      op_copy(kernels(), dst + at * j, f.weight + static_cast<size_t>(local) * f.in, len * j * sizeof(float));
  };
  // Every rank sends its segments of the pieces others add...
  for (const KChainPiece& p : pieces) {
    if (p.rank == me) continue;
    for (const KSegment& s : p.segments) {
      if (s.rank != me) continue;
      float* sa = chain_scratch(n_rows * s.len);
      float* sb = chain_scratch(j * s.len);
      place_a(sa, s.len, 0, s.local, s.len);
      place_b(sb, s.len, 0, s.local, s.len);
      x.send(p.rank, sa, n_rows * s.len);
      x.send(p.rank, sb, j * s.len);
    }
  }
  // ...then forms the operands of its own: a run of its k where it can be read in place, else a
  // copy (the forward pass reads a contiguous A, k columns a row), a straddling block assembled.
  struct Operands {
    const float* a;
    long lda;
    const float* b;
    int K;
  };
  std::vector<Operands> mine(pieces.size());
  for (size_t i = 0; i < pieces.size(); i++) {
    const KChainPiece& p = pieces[i];
    if (p.rank != me) continue;
    if (!p.assembled()) {
      const KSegment& s = p.segments[0];
      if (!forward) {
        mine[i] = {a + s.local, lda, f.weight + static_cast<size_t>(s.local) * f.in, s.len};
      } else if (s.local == 0 && s.len == f.in) {
        mine[i] = {a, lda, f.weight, s.len};
      } else {
        float* pa = chain_scratch(n_rows * s.len);
        float* pb = chain_scratch(j * s.len);
        place_a(pa, s.len, 0, s.local, s.len);
        place_b(pb, s.len, 0, s.local, s.len);
        mine[i] = {pa, s.len, pb, s.len};
      }
      continue;
    }
    int K = 0;
    for (const KSegment& s : p.segments) K += s.len;
    float* ba = chain_scratch(n_rows * K);
    float* bb = chain_scratch(j * K);
    int at = 0;
    for (const KSegment& s : p.segments) {
      if (s.rank == me) {
        place_a(ba, K, at, s.local, s.len);
        place_b(bb, K, at, s.local, s.len);
      } else {
        float* ra = chain_scratch(n_rows * s.len);
        float* rb = chain_scratch(j * s.len);
        x.receive(s.rank, ra, n_rows * s.len);
        x.receive(s.rank, rb, j * s.len);
        copy_columns(kernels(), ba + at, K, 0, ra, s.len, 0, N, s.len, 1);
        if (forward)
          copy_columns(kernels(), bb + at, K, 0, rb, s.len, 0, J, s.len, 1);
        else
          op_copy(kernels(), bb + at * j, rb, s.len * j * sizeof(float));
      }
      at += s.len;
    }
    mine[i] = {ba, K, bb, K};
  }
  x.wait_sends();
  // The chain: each piece's rank takes the partial sum from the previous piece's, adds its piece
  // and hands the sum to the next piece's, a link of rows at a time.
  for (size_t i = 0; i < pieces.size(); i++) {
    if (pieces[i].rank != me) continue;
    const Operands& o = mine[i];
    const bool first = i == 0;
    const int from = first ? me : pieces[i - 1].rank, to = i + 1 < pieces.size() ? pieces[i + 1].rank : me;
    for (int n0 = 0; n0 < N; n0 += rows) {
      const int m = std::min(rows, N - n0);
      float* c = out + static_cast<size_t>(n0) * J;
      const float* an = o.a + static_cast<size_t>(n0) * o.lda;
      if (from != me) x.receive(from, c, static_cast<size_t>(m) * J);
      if (forward)
        matmul_forward(matmul_, c, an, o.b, first ? f.bias : nullptr, m, o.K, J, !first);
      else
        matmul_backward(matmul_, c, nullptr, nullptr, an, o.lda, nullptr, o.b, m, J, o.K, !first);
      if (to != me) x.send(to, c, static_cast<size_t>(m) * J);
    }
    // Its sends are taken before this rank receives into the same rows for a later piece.
    x.wait_sends();
  }
}

int Decoder::vocab_owner(int32_t token) const {
  const std::vector<int>& b = vocab_.bounds;
  return static_cast<int>(std::upper_bound(b.begin(), b.end(), token) - b.begin()) - 1;
}

void Decoder::vocab_parallel_embedding(float* out, const float* wte, const float* wpe) {
  TensorExchange& x = *tensor_exchange_;
  const int B = B_, T = T_, C = cfg_.d_model, N = B * T, R = x.ranks(), me = x.rank();
  if (vocab_.bounds.empty())
    for (int r = 0; r <= R; r++)
      vocab_.bounds.push_back(r < R ? tensor_vocab_slice(cfg_.whole_vocab(), R, r).first : cfg_.whole_vocab());
  // Every token looked up in this rank's rows (another rank's tokens at row 0, overwritten below),
  // then each rank's rows of its own tokens go to the others: one process's rows, copied.
  vocab_.columns.resize(N);
  for (int i = 0; i < N; i++) vocab_.columns[i] = vocab_owner(tokens_[i]) == me ? tokens_[i] - cfg_.vocab_first : 0;
  op_copy_from_host(kernels(), compact_tokens_op_.data(), vocab_.columns.data(),
                    static_cast<size_t>(N) * sizeof(int32_t));
  encoder_forward(kernels(), out, compact_tokens_op_.data(), positions_op(0), wte, wpe, B, T, C);
  // Each rank's rows of its tokens, in token order, gathered from every rank in rank order.
  const size_t row = static_cast<size_t>(C);
  std::vector<int>& rows = vocab_.rows;
  std::vector<size_t>& counts = vocab_.counts;
  rows.clear();
  counts.assign(R, 0);
  for (int root = 0; root < R; root++)
    for (int i = 0; i < N; i++)
      if (vocab_owner(tokens_[i]) == root) {
        rows.push_back(i);
        counts[root] += row;
      }
  std::vector<float>& buffer = vocab_.buffer;
  buffer.resize(rows.size() * row);
  size_t first = 0;  // this rank's first row in rows
  for (int r = 0; r < me; r++) first += counts[r] / row;
  for (size_t k = first; k < first + counts[me] / row; k++)
    std::copy_n(out + rows[k] * row, row, buffer.begin() + static_cast<std::ptrdiff_t>(k * row));
  x.all_gather(buffer.data(), counts);
  for (size_t k = 0; k < rows.size(); k++)
    std::copy_n(buffer.begin() + static_cast<std::ptrdiff_t>(k * row), row, out + rows[k] * row);
}

void Decoder::vocab_parallel_crossentropy(const int32_t* targets_op, float* losses, float* lse, float dloss) {
  TensorExchange& x = *tensor_exchange_;
  const int T = T_, V = cfg_.vocab_size, R = x.ranks(), me = x.rank();
  const int block = kCrossentropySumBlock, NB = (cfg_.whole_vocab() + block - 1) / block;
  VocabShare& v = vocab_;
  const size_t rows = static_cast<size_t>(T);
  // The rows' maxima and target logits: the elementwise maximum of every rank's.
  const size_t pair = 2 * rows;
  v.buffer.resize(R * pair);
  crossentropy_slice_max(kernels(), v.buffer.data() + me * pair, v.buffer.data() + me * pair + rows, acts_.logits,
                         targets_op, T, V, dtype());
  v.counts.assign(R, pair);
  x.all_gather(v.buffer.data(), v.counts);
  v.max.assign(pair, -INFINITY);
  for (int r = 0; r < R; r++)
    for (size_t i = 0; i < pair; i++) v.max[i] = std::max(v.max[i], v.buffer[r * pair + i]);
  // The block sums (the exps kept over the logits in training), every rank's in vocabulary order.
  const bool training = lse == nullptr;
  size_t at = 0, mine_at = 0;
  for (int r = 0; r < R; r++) {
    const VocabSlice slice = tensor_vocab_slice(cfg_.whole_vocab(), R, r);
    v.counts[r] = rows * ((slice.size + block - 1) / block);
    if (r == me) mine_at = at;
    at += v.counts[r];
  }
  v.buffer.resize(at);
  crossentropy_slice_sums(kernels(), v.buffer.data() + mine_at, training ? acts_.logits : nullptr, acts_.logits,
                          v.max.data(), T, V, dtype());
  x.all_gather(v.buffer.data(), v.counts);
  v.sums.resize(rows * NB);
  at = 0;
  for (int r = 0; r < R; r++) {
    const VocabSlice slice = tensor_vocab_slice(cfg_.whole_vocab(), R, r);
    const int n = (slice.size + block - 1) / block, k0 = slice.first / block;
    for (size_t t = 0; t < rows; t++)
      std::copy_n(v.buffer.begin() + static_cast<std::ptrdiff_t>(at + t * n), n,
                  v.sums.begin() + static_cast<std::ptrdiff_t>(t * NB + k0));
    at += v.counts[r];
  }
  crossentropy_slice_finish(kernels(), losses, lse, training ? acts_.logits : nullptr, v.sums.data(), NB, v.max.data(),
                            v.max.data() + rows, targets_op, dloss, T, V, dtype());
}

void Decoder::chained_head_input_grad(const float* emb, float* dinp, int b) {
  TensorExchange& x = *tensor_exchange_;
  const int R = x.ranks(), r = x.rank(), T = T_, C = cfg_.d_model, V = cfg_.vocab_size, rows = chain_rows(T);
  const int chunk = matmul_column_block(kernels(), V, kVocabChunk);
  for (int n0 = 0; n0 < T; n0 += rows) {
    const int m = std::min(rows, T - n0);
    float* d = dinp + static_cast<size_t>(n0) * C;
    if (r > 0) x.receive(r - 1, d, static_cast<size_t>(m) * C);
    for (int v0 = 0; v0 < V; v0 += chunk)
      matmul_backward(matmul_, d, nullptr, nullptr, acts_.logits + static_cast<size_t>(n0) * V + v0, V, nullptr,
                      emb + static_cast<size_t>(v0) * C, m, C, std::min(chunk, V - v0), r > 0 || v0 > 0);
    if (r + 1 < R) x.send(r + 1, d, static_cast<size_t>(m) * C);
  }
  x.wait_sends();
  send_rows_to_holders(dinp, b * T, (b + 1) * T, C);
}

void Decoder::lora_forward(int l, BlockProduct product, float* out, int width, const float* inp,
                           const float* adapters) {
  const int B = B_, T = T_, N = B * T, r = cfg_.lora.r;
  for (size_t k = 0; k < lora_.size(); k++) {
    const LoraModule& m = lora_[k];
    if (m.product != product) continue;
    const float* A = adapters + lora_offset_[k];
    const float* Bm = A + static_cast<size_t>(r) * m.in;
    const float* x = inp;
    const DropoutSite drop = lora_dropout_site(l, static_cast<int>(k), 0);
    if (drop.active()) {
      dropout_apply(kernels(), lora_x_, inp, B, static_cast<long>(T) * m.in, drop);
      round_to_dtype(kernels(), lora_x_, static_cast<long>(N) * m.in, dtype());
      x = lora_x_;
    }
    float* u = lora_u(l, static_cast<int>(k));
    matmul_forward_microbatch(matmul_, microbatch_invariant(), u, x, A, nullptr, B, T, m.in, r);
    round_to_dtype(kernels(), u, static_cast<long>(N) * r, dtype());
    matmul_forward_microbatch(matmul_, microbatch_invariant(), lora_v_, u, Bm, nullptr, B, T, r, m.rows);
    round_to_dtype(kernels(), lora_v_, static_cast<long>(N) * m.rows, dtype());
    lora_delta_forward(kernels(), out + m.row0, width, lora_v_, N, m.rows, cfg_.lora.scaling());
  }
}

void Decoder::lora_backward(int l, BlockProduct product, float* dinp, const float* dout, int width,
                            const float* inp, const float* adapters, int b, int n) {
  const int T = T_, N = n * T, r = cfg_.lora.r;
  for (size_t k = 0; k < lora_.size(); k++) {
    const LoraModule& m = lora_[k];
    if (m.product != product) continue;
    const float* A = adapters + lora_offset_[k];
    const size_t a_numel = static_cast<size_t>(r) * m.in, span = a_numel + static_cast<size_t>(m.rows) * r;
    const float* Bm = A + a_numel;
    // The branch's output gradient, scaled; through B (its gradient, and u's); through A.
    lora_delta_backward(kernels(), lora_v_, dout + m.row0, width, N, m.rows, cfg_.lora.scaling());
    round_to_dtype(kernels(), lora_v_, static_cast<long>(N) * m.rows, dtype());
    float* dA = units_in_stage_.grads(l, lora_offset_[k], span, 1);
    const float* u = lora_u(l, static_cast<int>(k)) + static_cast<size_t>(b) * T * r;
    matmul_backward(matmul_, lora_du_, dA + a_numel, nullptr, lora_v_, m.rows, u, Bm, N, r, m.rows, false);
    round_to_dtype(kernels(), lora_du_, static_cast<long>(N) * r, dtype());
    const DropoutSite drop = lora_dropout_site(l, static_cast<int>(k), b);
    if (!drop.active()) {
      matmul_backward(matmul_, dinp, dA, nullptr, lora_du_, r, inp, A, N, m.in, r, true);
    } else {
      // The dropped input again (the same mask), and the gradient through the mask.
      const long n_in = static_cast<long>(T) * m.in;
      dropout_apply(kernels(), lora_x_, inp, n, n_in, drop);
      round_to_dtype(kernels(), lora_x_, N * static_cast<long>(m.in), dtype());
      matmul_backward(matmul_, lora_dx_, dA, nullptr, lora_du_, r, lora_x_, A, N, m.in, r, false);
      dropout_apply(kernels(), lora_dx_, lora_dx_, n, n_in, drop);
      residual_forward(kernels(), dinp, dinp, lora_dx_, N * static_cast<long>(m.in));
    }
    units_in_stage_.grain_done(l, lora_offset_[k], span, 1);
  }
}

void Decoder::lm_head(const float* emb, const float* lnf) {
  // Under amp the product is a 16-bit tensor; cross-entropy rounds the logits as it reads them.
  matmul_forward(matmul_, acts_.logits, lnf, emb, nullptr, T_, cfg_.d_model, cfg_.vocab_size);
}

void Decoder::check_targets(const int32_t* targets, int N) const {
  for (int i = 0; i < N; i++)
    ANVIL_CHECK(targets[i] == kIgnoreIndex || (targets[i] >= 0 && targets[i] < cfg_.whole_vocab()),
                "target id {} out of range for vocab_size {}", targets[i], cfg_.whole_vocab());
}

void Decoder::count_sequence_targets(const int32_t* targets, int B, int T) {
  check_targets(targets, B * T);
  sequence_targets_.assign(B, 0);
  for (int i = 0; i < B * T; i++) sequence_targets_[i / T] += targets[i] != kIgnoreIndex;
}

const int32_t* Decoder::upload_targets(const int32_t* targets, int N) {
  if (cfg_.tensor_share()) {  // as columns of this rank's logits, -1 where another rank's
    const int first = cfg_.vocab_first, held = cfg_.vocab_size;
    vocab_.columns.resize(N);
    for (int i = 0; i < N; i++) {
      const int32_t t = targets[i];
      vocab_.columns[i] = t == kIgnoreIndex ? t : t >= first && t < first + held ? t - first : -1;
    }
    targets = vocab_.columns.data();
  }
  op_copy_from_host(kernels(), targets_op_.data(), targets, static_cast<size_t>(N) * sizeof(int32_t));
  return targets_op_.data();
}

double Decoder::sum_losses(const int32_t* targets, int N, int64_t* n_targets) {
  op_copy_to_host(kernels(), losses_host_.data(), acts_.losses, static_cast<size_t>(N) * sizeof(float));
  double sum = 0;
  int64_t count = 0;
  for (int i = 0; i < N; i++) {
    sum += losses_host_[i];
    count += targets[i] != kIgnoreIndex;
  }
  if (n_targets) *n_targets = count;
  return sum;
}

double Decoder::forward(const int32_t* tokens, const int32_t* targets, int B, int T, int64_t* n_targets,
                        const int32_t* positions) {
  require_whole_model("forward");
  if (targets) check_targets(targets, B * T);
  training_ = false;
  forward_to_lnf(tokens, positions, nullptr, B, T);
  return head_forward(targets, n_targets);
}

double Decoder::head_forward(const int32_t* targets, int64_t* n_targets) {
  const int B = B_, T = T_;
  ANVIL_CHECK(targets || !cfg_.tensor_share(), "a tensor-parallel share holds some of the vocabulary's logits: its "
              "forward pass needs the targets");
  const int32_t* targets_op = targets ? upload_targets(targets, B * T) : nullptr;
  const float* emb = hold_lm_head(acquire_base(head_unit(), -1) + head_offset());
  // Without targets only the last sequence's logits are kept, so only they are formed.
  for (int b = targets ? 0 : B - 1; b < B; b++) {
    lm_head(emb, lnf_rows(b));
    const size_t r = static_cast<size_t>(b) * T;
    if (targets && cfg_.tensor_share())
      vocab_parallel_crossentropy(targets_op + r, acts_.losses + r, acts_.ce_lse, 0.0f);
    else if (targets)
      crossentropy_forward(kernels(), acts_.losses + r, acts_.ce_lse, acts_.logits, targets_op + r, T, cfg_.vocab_size,
                           dtype());
  }
  matmul_.release_weight();
  release_base(head_unit());
  return targets ? sum_losses(targets, B * T, n_targets) : 0.0;
}


void Decoder::keep_prefix(const int32_t* tokens, int P) {
  require_whole_model("keep_prefix");
  ANVIL_CHECK(P >= 1 && P < max_seq_, "a kept prefix of {} tokens: expected 1 to {}", P, max_seq_ - 1);
  prefix_.length = 0;
  grow(prefix_.qkv, static_cast<size_t>(cfg_.n_layers) * P * Widths(cfg_).qkv);
  training_ = false;
  prefix_.keeping = true;
  try {
    forward_to_lnf(tokens, nullptr, nullptr, 1, P);
  } catch (...) {
    prefix_.keeping = false;
    prefix_.length = 0;
    throw;
  }
  prefix_.keeping = false;
  prefix_.length = P;
  // Every pass takes each unit in the same order (under ZeRO-3 each is gathered with every rank):
  // the head's too, unused here.
  acquire_base(head_unit(), -1);
  release_base(head_unit());
}

double Decoder::forward_after_prefix(const int32_t* tokens, const int32_t* targets, int B, int T,
                                     int64_t* n_targets) {
  const int P = prefix_.length;
  ANVIL_CHECK(P > 0, "forward_after_prefix needs keep_prefix first");
  ANVIL_CHECK(P + T <= max_seq_, "a kept prefix of {} tokens and {} more exceed the model's {}", P, T, max_seq_);
  const Widths w(cfg_);
  const size_t joined_rows = static_cast<size_t>(B) * (P + T);
  grow(prefix_.joined_qkv, joined_rows * w.qkv);
  grow(prefix_.joined_atty, joined_rows * w.q);
  grow(prefix_.joined_lse, joined_rows * cfg_.n_heads);
  std::vector<int32_t> positions(static_cast<size_t>(B) * T);
  for (size_t i = 0; i < positions.size(); i++) positions[i] = P + static_cast<int32_t>(i % T);
  prefix_.after = true;
  double loss = 0;
  try {
    loss = forward(tokens, targets, B, T, n_targets, positions.data());
  } catch (...) {
    prefix_.after = false;
    throw;
  }
  prefix_.after = false;
  return loss;
}

void Decoder::drop_prefix() {
  for (OpArray<float>* a : {&prefix_.qkv, &prefix_.joined_qkv, &prefix_.joined_atty, &prefix_.joined_lse, &picked_rows_})
    a->reset();
  prefix_.length = 0;
}

void Decoder::forward_logits(const int32_t* tokens, int B, int T, const std::vector<int64_t>& rows,
                             const std::function<void(size_t first, size_t n, const float* logits)>& take) {
  for (const int64_t r : rows)
    ANVIL_CHECK(r >= 0 && r < int64_t{B} * T, "forward_logits: row {} is outside the {} x {} tokens", r, B, T);
  require_whole_model("forward_logits");
  ANVIL_CHECK(!cfg_.tensor_share(), "forward_logits gives the whole vocabulary's logits; a tensor-parallel share holds "
              "some of them");
  training_ = false;
  forward_to_lnf(tokens, nullptr, nullptr, B, T);
  const size_t C = cfg_.d_model, V = cfg_.vocab_size;
  const float* emb = hold_lm_head(acquire_base(head_unit(), -1) + head_offset());
  const size_t chunk = std::min<size_t>(kLogitsChunk, T);  // the logits buffer holds a sequence's
  grow(picked_rows_, std::min(rows.size(), chunk) * C);
  std::vector<float> host(std::min(rows.size(), chunk) * V);
  for (size_t r0 = 0; r0 < rows.size(); r0 += chunk) {
    const size_t n = std::min(rows.size() - r0, chunk);
    for (size_t k = 0; k < n; k++)
      op_copy(kernels(), picked_rows_.data() + k * C, acts_.lnf + static_cast<size_t>(rows[r0 + k]) * C,
              C * sizeof(float));
    matmul_forward(matmul_, acts_.logits, picked_rows_.data(), emb, nullptr, static_cast<int>(n), static_cast<int>(C),
                   static_cast<int>(V));
    op_copy_to_host(kernels(), host.data(), acts_.logits, n * V * sizeof(float));
    take(r0, n, host.data());
  }
  matmul_.release_weight();
  release_base(head_unit());
}

void Decoder::attend(int l, const BlockActs& x) {
  if (!prefix_.after)
    return attention_forward(kernels(), x.atty, x.att_lse, x.qkv, positions_op(0), B_, T_, attention_heads(l));
  // Each sequence after the prefix's rows, attention over the whole for the queries after the
  // prefix (those of the prefix gave their outputs in keep_prefix), and those rows of its output.
  const Widths w(cfg_);
  const int P = prefix_.length, J = P + T_;
  const float* kept = prefix_.qkv.data() + static_cast<size_t>(l) * P * w.qkv;
  float* joined = prefix_.joined_qkv.data();
  for (int b = 0; b < B_; b++) {
    float* row = joined + static_cast<size_t>(b) * J * w.qkv;
    op_copy(kernels(), row, kept, static_cast<size_t>(P) * w.qkv * sizeof(float));
    op_copy(kernels(), row + static_cast<size_t>(P) * w.qkv, x.qkv + static_cast<size_t>(b) * T_ * w.qkv,
            static_cast<size_t>(T_) * w.qkv * sizeof(float));
  }
  AttentionHeads heads = attention_heads(l);
  heads.first_query = P;
  attention_forward(kernels(), prefix_.joined_atty.data(), prefix_.joined_lse.data(), joined, nullptr, B_, J, heads);
  for (int b = 0; b < B_; b++)
    op_copy(kernels(), x.atty + static_cast<size_t>(b) * T_ * w.q,
            prefix_.joined_atty.data() + (static_cast<size_t>(b) * J + P) * w.q,
            static_cast<size_t>(T_) * w.q * sizeof(float));
}

double Decoder::forward_backward(const int32_t* tokens, const int32_t* targets, int B, int T, float dloss,
                                 int64_t* n_targets, const int32_t* positions) {
  require_whole_model("forward_backward");
  count_sequence_targets(targets, B, T);
  training_ = true;
  forward_to_lnf(tokens, positions, nullptr, B, T);
  backward(upload_targets(targets, B * T), dloss);
  training_ = false;
  return sum_losses(targets, B * T, n_targets) + moe_stats_.balance_loss();
}

void Decoder::require_whole_model(const char* pass) const {
  ANVIL_CHECK(whole_model(), "{} runs the whole model; this one is the pipeline stage of blocks [{}, {}) "
              "(stage_forward and stage_backward run a stage)", pass, stage().first_layer, stage().end_layer);
}

void Decoder::stage_forward(const int32_t* tokens, const int32_t* positions, const float* input, int B, int T,
                            const int32_t* targets, float* output) {
  ANVIL_CHECK(last_stage() || output, "a pipeline stage before the last needs somewhere for its output");
  stage_trained_ = false;
  const bool training = targets != nullptr;
  if (training) count_sequence_targets(targets, B, T);
  training_ = training;
  try {
    forward_to_lnf(tokens, positions, input, B, T);
  } catch (...) {
    training_ = false;
    throw;
  }
  training_ = false;
  stage_trained_ = training;
  if (last_stage()) return;
  op_copy_to_host(kernels(), output, block_output(stage().end_layer - 1),
                  static_cast<size_t>(held_rows(B * T).n) * cfg_.d_model * sizeof(float));
}

double Decoder::stage_loss(const int32_t* targets, int64_t* n_targets) {
  ANVIL_CHECK(last_stage(), "only the last pipeline stage has the LM head and the loss");
  ANVIL_CHECK(targets != nullptr, "stage_loss needs the targets");
  check_targets(targets, B_ * T_);
  return head_forward(targets, n_targets);
}

double Decoder::stage_backward(const int32_t* targets, float dloss, const float* doutput, float* dinput,
                               int64_t* n_targets) {
  ANVIL_CHECK(stage_trained_, "stage_backward needs a training stage_forward before it");
  ANVIL_CHECK(last_stage() ? targets != nullptr : doutput != nullptr, "the pipeline stage of blocks [{}, {}) starts "
              "its backward pass from {}", stage().first_layer, stage().end_layer,
              last_stage() ? "the targets" : "the next stage's input gradient");
  ANVIL_CHECK(first_stage() || dinput, "a pipeline stage after the first needs somewhere for its input's gradient");
  stage_trained_ = false;
  const int N = B_ * T_, C = cfg_.d_model;
  const HeldRows held = held_rows(N);
  const int32_t* targets_op = nullptr;
  if (last_stage()) {
    check_targets(targets, N);
    targets_op = upload_targets(targets, N);
  } else {
    op_copy_from_host(kernels(), dresidual_, doutput, static_cast<size_t>(held.n) * C * sizeof(float));
  }
  training_ = true;
  try {
    backward(targets_op, dloss);
  } catch (...) {
    training_ = false;
    throw;
  }
  training_ = false;
  if (!first_stage()) op_copy_to_host(kernels(), dinput, dresidual_, static_cast<size_t>(held.n) * C * sizeof(float));
  return last_stage() ? sum_losses(targets, N, n_targets) : 0.0;
}

void Decoder::backward(const int32_t* targets_op, float dloss) {
  dloss_ = dloss;
  if (last_stage()) lm_head_backward(targets_op, dloss);
  // A residual sum passes its gradient unchanged to both inputs, so dresidual_ stands for the
  // gradient of the block output, of the skip path and of the projection at once; the layer
  // norms then add their input gradients into it. This saves two copies per layer over calling
  // residual_backward.
  for (int l = stage().end_layer - 1; l >= stage().first_layer; l--) block_backward(l);
  if (first_stage()) embedding_backward();
}

void Decoder::lm_head_backward(const int32_t* targets_op, float dloss) {
  const int B = B_, T = T_, C = cfg_.d_model, V = cfg_.vocab_size, L = cfg_.n_layers;
  Acts& a = acts_;
  const size_t rows = static_cast<size_t>(T);  // rows of one sequence
  const int hu = head_unit();
  const size_t h0 = head_offset();

  // The LM head, one sequence at a time: its logits, the loss and the logits' gradient in one
  // pass (written over the logits), and the gradient back through the head a vocabulary chunk at
  // a time, so that a chunk of the logits' gradient is read from memory once for both products
  // and the chunk's rows of the head's gradient are accumulated (grain_done) while they are in
  // cache (kVocabChunk; on a GPU one chunk of the whole vocabulary, and the weight gradients of a
  // group of sequences, each in its own span of the whole head, handed over together:
  // head_grain_sequences). A tied head's unit (the embeddings) keeps its gradient open for the
  // whole backward pass: the head adds to it first, the token embedding last.
  const float* head_unit_params = acquire_base(hu, hu == 0 ? L + 1 : L);
  const float* emb = hold_lm_head(head_unit_params + h0);
  const long TC = static_cast<long>(T) * C;
  const int chunk = matmul_column_block(kernels(), V, kVocabChunk);
  const int group = frozen() ? 1 : head_grain_sequences(cfg_, max_batch_, storage_);
  ANVIL_CHECK(group == 1 || chunk == V, "internal: the LM head's gradients of {} sequences at once in chunks of {} "
              "of its {} columns", group, chunk, V);
  const size_t head_count = static_cast<size_t>(V) * C;
  for (int g0 = 0; g0 < B; g0 += group) {
    const int n = std::min(group, B - g0);  // sequences in this group
    // The spans written by the products where the access lets them (a GPU's deterministic
    // training), else added to.
    float* written = frozen() || chunk != V ? nullptr : units_in_stage_.grads_to_write(hu, h0, head_count, n);
    float* spans = written ? written : n > 1 ? units_in_stage_.grads(hu, h0, head_count, n) : nullptr;
    for (int b = g0; b < g0 + n; b++) {
      const size_t r = b * rows;
      const float* lnf_b = lnf_rows(b);
      lm_head(emb, lnf_b);
      // Under amp the gradients entering and leaving each matrix product are rounded to the
      // compute dtype too (the logits' by cross-entropy as it writes them); parameter gradients
      // accumulate in fp32.
      // Under a cut vocabulary the input gradient sums over every rank's columns: a chain after
      // the weight's gradient.
      const bool cut = cfg_.tensor_share();
      if (cut)
        vocab_parallel_crossentropy(targets_op + r, a.losses + r, nullptr, dloss);
      else
        crossentropy_forward_backward(kernels(), a.losses + r, a.logits, a.logits, targets_op + r, dloss, T, V,
                                      dtype());
      for (int v0 = 0; v0 < V; v0 += chunk) {
        const int width = std::min(chunk, V - v0);
        const size_t at = h0 + static_cast<size_t>(v0) * C, count = static_cast<size_t>(width) * C;
        float* dw = frozen() ? nullptr
                    : spans  ? spans + (b - g0) * sequence_span_stride(head_count)
                             : units_in_stage_.grads(hu, at, count, 1);
        if (written)
          matmul_backward_sequences(matmul_, cut ? nullptr : dsmall_ + r * C, dw, nullptr, 0, a.logits, lnf_b, emb, 1,
                                    T, C, V, true);
        else
          matmul_backward(matmul_, cut ? nullptr : dsmall_ + r * C, dw, nullptr, a.logits + v0, V, lnf_b,
                          emb + static_cast<size_t>(v0) * C, T, C, width, v0 > 0);
        if (!frozen() && !spans) units_in_stage_.grain_done(hu, at, count, 1);
      }
      if (cut) chained_head_input_grad(emb, dsmall_ + r * C, b);
      round_to_dtype(kernels(), dsmall_ + r * C, TC, dtype());
    }
    if (spans) units_in_stage_.grain_done(hu, h0, head_count, n);
  }
  matmul_.release_weight();
  if (hu != L + 1) release_base(hu);
  // A tied head on a stage without the token embedding: nothing more adds to the unit.
  if (hu == 0 && !first_stage() && !frozen()) units_in_stage_.grads_done(0);
  op_zero(kernels(), dresidual_, sizeof(float) * held_rows(B * T).n * C);
  const float* last = block_output(L - 1);
  const float* lnf = hu == L + 1 ? head_unit_params : acquire_base(L + 1, L);
  float* dlnf = frozen() ? frozen_dnorm_.data() : units_in_stage_.grads(L + 1, 0, norm_params(), 1);
  for (int b = 0; b < B; b++) {
    const int r = b * T;
    norm_backward_rows(dresidual_, dlnf, dsmall_ + static_cast<size_t>(r) * C, last, lnf, a.lnf_mean, a.lnf_rstd, r,
                       r + T, 1);
    if (!frozen()) units_in_stage_.grain_done(L + 1, 0, norm_params(), 1);
  }
  release_base(L + 1);
  if (!frozen()) units_in_stage_.grads_done(L + 1);
}

void Decoder::block_backward(int l) {
  const int B = B_, T = T_, C = cfg_.d_model, NH = cfg_.n_heads;
  const Widths w(cfg_);
  Acts& a = acts_;
  const size_t rows = static_cast<size_t>(T);  // rows of one sequence
  const float* residual = block_input(l);
  const Block p = bind_block(compute_params(1 + l, acquire_base(1 + l, l == 0 ? -1 : l)));
  const float* adapters = acquire_adapters(l, l - 1);
  // the same bits as the forward pass's
  if (storage_.activation_checkpointing) {
    recomputing_ = true;
    block_forward(l, p, adapters, residual);
    recomputing_ = false;
  }
  const BlockActs x = block_acts(l);
  // Each op's parameter gradients, a span of the unit (a weight and its bias, or a norm's
  // parameters), are asked for just before the op and handed over (grain_done) right after it,
  // while in cache: deterministic training's scratch then holds the largest op's (one span per
  // sequence of the grain), not the block's (largest_grads_span).
  auto at = [&](const float* t) { return static_cast<size_t>(t - p.ln1w); };
  if (cfg_.has_moe() && expert_parallel()) experts_exchanged_backward(l, x, p);
  // The norms' backward over the grain of n sequences from b, their input gradients into
  // dresidual_.
  auto norm_grad = [&](int b, int n, const float* dout, const float* inp, const float* w, const float* mean,
                       const float* rstd) {
    const int spans = frozen() ? 1 : grain_spans(n);
    float* dw = frozen() ? frozen_dnorm_.data() : units_in_stage_.grads(1 + l, at(w), norm_params(), spans);
    norm_backward_rows(dresidual_, dw, dout, inp, w, mean, rstd, b * T, (b + n) * T, spans);
    if (!frozen()) units_in_stage_.grain_done(1 + l, at(w), norm_params(), spans);
  };
  // The grain's rows of a held array (the residual stream's gradient, a norm's output), whole:
  // under sequence parallelism gathered into gathered_, in use until the next call.
  auto grain_rows = [&](const float* held, int b, int n) -> const float* {
    if (!cfg_.tensor_share()) return held + b * rows * C;
    gather_held_rows(gathered_, held, b * T, (b + n) * T, C);
    return gathered_;
  };
  // The attention output's gradient, rows of w.q from the microbatch's first: the grains' parts
  // of dsmall_ that the grains' MLP backward has used by then (w.q <= w.dsmall, so a grain's
  // rows here end before the next grain's rows of dsmall_ start).
  float* datty = dsmall_;
  // The grains' first halves (the MLP, its norm, the attention output's product), attention's
  // backward over the whole microbatch, then the grains' second halves. Attention sums nothing
  // across sequences, so one call over the microbatch gives each sequence's bits, and a call per
  // sequence would leave most of a GPU idle.
  for (int b = 0; b < B; b += grain_sequences()) {
    const int n = std::min(grain_sequences(), B - b);  // sequences in this grain
    const size_t r = b * rows;
    float* dsmall = dsmall_ + r * w.dsmall;
    // The residual stream's gradient stays fp32; the projections see it rounded (and masked by
    // the branch's residual dropout). Expert parallelism took the MLP's over the whole microbatch.
    const bool mlp_done = cfg_.has_moe() && expert_parallel();
    const float* dproj =
        mlp_done ? nullptr : branch_grad(grain_rows(dresidual_, b, n), 1 + l, DropoutKind::kMlpOutput, b, n);
    if (cfg_.has_moe()) {
      moe_backward(l, x, p, adapters, dproj, dsmall, b, n);
    } else {
      float* fch = x.fch + r * w.fc;
      float* fch_gelu = a.fch_gelu + r * w.hidden;  // this grain's activation output, recomputed
      mlp_activation(fch_gelu, fch, n * T);
      linear_backward(l, linear(p, BlockProduct::kFcProj), dbig_, dproj, fch_gelu, adapters, b, n);
      mlp_activation_backward(dfc_, fch, dbig_, n * T);
      linear_backward(l, linear(p, BlockProduct::kFc), dsmall, dfc_, grain_rows(x.ln2, b, n), adapters, b, n);
    }
    norm_grad(b, n, dsmall, x.residual2, p.ln2w, x.ln2_mean, x.ln2_rstd);
    dproj = branch_grad(grain_rows(dresidual_, b, n), 1 + l, DropoutKind::kAttentionOutput, b, n);
    linear_backward(l, linear(p, BlockProduct::kAttnOut), datty + r * w.q, dproj, x.atty + r * w.q, adapters, b, n);
  }
  attention_backward(kernels(), dqkv_, datty, x.qkv, x.atty, x.att_lse, positions_op(0), B, T, attention_heads(l));
  round_to_dtype(kernels(), dqkv_, static_cast<long>(B) * T * w.qkv, dtype());
  if (cfg_.positions == PositionKind::kRope) {
    rope_backward(kernels(), dqkv_, positions_op(0), B, T, w.qkv, NH + cfg_.kv_heads(), cfg_.head_size(), cfg_.rope);
    round_to_dtype(kernels(), dqkv_, static_cast<long>(B) * T * w.qkv, dtype());
  }
  for (int b = 0; b < B; b += grain_sequences()) {
    const int n = std::min(grain_sequences(), B - b);
    const size_t r = b * rows;
    float* dsmall = dsmall_ + r * w.dsmall;
    if (cfg_.qk_norm != QkNorm::kNone) qk_norm_backward(l, x, p, b, n);
    linear_backward(l, linear(p, BlockProduct::kQkv), dsmall, dqkv_ + r * w.qkv, grain_rows(x.ln1, b, n), adapters,
                    b, n);
    norm_grad(b, n, dsmall, residual, p.ln1w, x.ln1_mean, x.ln1_rstd);
  }
  release_adapters(l);
  release_base(1 + l);
  units_in_stage_.grads_done(frozen() ? l : 1 + l);
}

void Decoder::embedding_backward() {
  if (frozen()) return;  // the embeddings are the base's
  const int B = B_, T = T_, C = cfg_.d_model, V = cfg_.vocab_size;
  const size_t wpe_offset = static_cast<size_t>(V) * C;
  const size_t rows = static_cast<size_t>(T);  // rows of one sequence
  // A tensor-parallel share's rows are token ids [first, first + V) (V the share's): the other
  // tokens' gradients go to a spare row after its sequence's, thrown away.
  const int first = cfg_.vocab_first;
  auto held = [&](int32_t t) { return t >= first && t < first + V; };
  // The embeddings' gradient, a sequence at a time: the token rows it touched, each once and held
  // compact (within the reserved capacity: no allocation), and its positions' rows. Every
  // sequence's rows and compact tokens are found first and copied where the ops run at once, so
  // that the GPU is not stopped for a copy per sequence.
  touched_rows_.clear();
  touched_offsets_.assign(1, 0);
  for (int b = 0; b < B; b++) {
    const int32_t* tokens = tokens_ + b * rows;
    const auto seq_first = touched_rows_.end() - touched_rows_.begin();
    for (int t = 0; t < T; t++)
      if (held(tokens[t])) touched_rows_.push_back(tokens[t] - first);
    const auto seq_rows = touched_rows_.begin() + seq_first;
    std::sort(seq_rows, touched_rows_.end());
    touched_rows_.erase(std::unique(seq_rows, touched_rows_.end()), touched_rows_.end());
    const auto spare = static_cast<int32_t>(touched_rows_.end() - seq_rows);
    for (int t = 0; t < T; t++)
      compact_tokens_[b * rows + t] = held(tokens[t]) ? static_cast<int32_t>(std::lower_bound(seq_rows,
                                          touched_rows_.end(), tokens[t] - first) - seq_rows) : spare;
    touched_offsets_.push_back(touched_rows_.size());
  }
  op_copy_from_host(kernels(), compact_tokens_op_.data(), compact_tokens_.data(), B * rows * sizeof(int32_t));
  op_copy_from_host(kernels(), touched_rows_op_.data(), touched_rows_.data(), touched_rows_.size() * sizeof(int32_t));
  for (int b = 0; b < B; b++) {
    const size_t r = b * rows;
    const size_t n_touched = touched_offsets_[b + 1] - touched_offsets_[b];
    // (a spare row is needed only where some token is not held, so it fits in the sequence's T)
    op_zero(kernels(), demb_rows_, std::min(n_touched + cfg_.tensor_share(), rows) * C * sizeof(float));
    // The sequence's rows of the stream's gradient, whole (gathered under sequence parallelism).
    float* dres = dresidual_ + r * C;
    if (cfg_.tensor_share()) {
      gather_held_rows(gathered_, dresidual_, b * T, (b + 1) * T, C);
      dres = gathered_;
    }
    const DropoutSite emb_drop = dropout_site(0, DropoutKind::kEmbedding, cfg_.emb_pdrop, b);
    if (emb_drop.active()) dropout_apply(kernels(), dres, dres, 1, static_cast<long>(T) * C, emb_drop);
    if (cfg_.positions == PositionKind::kLearned) {
      encoder_backward(kernels(), demb_rows_, units_in_stage_.grads(0, wpe_offset, rows * C, 1), dres,
                       compact_tokens_op_.data() + r, positions_op(b), 1, T, C);
      units_in_stage_.grain_done(0, wpe_offset, rows * C, 1);
    } else {
      encoder_backward(kernels(), demb_rows_, nullptr, dres, compact_tokens_op_.data() + r, nullptr, 1, T, C);
    }
    units_in_stage_.grain_rows(0, 0, demb_rows_, touched_rows_.data() + touched_offsets_[b],
                        touched_rows_op_.data() + touched_offsets_[b], n_touched, C);
  }
  units_in_stage_.grads_done(0);
}

}  // namespace anvil
