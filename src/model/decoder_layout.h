// The decoder's tensors and buffers as sizes: the products' widths, a block's tensors in layout
// order, the parameter layout and init of every family (with LoRA's adapters), the FLOPs of a
// training token and the floats of every activation buffer. model/decoder.cpp binds them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "config/model_config.h"
#include "model/model.h"

namespace anvil {

// Widths of the products: the fused qkv rows (the queries' q columns, n_heads·head_size, d_model
// unless the head size is the family's own; then the keys' and the values' kv each), the MLP's
// hidden width F, the first MLP product's outputs (F, or gate and up: 2F), and the backward
// pass's rows of the narrow gradients (d_model, or the attention's output where that is wider).
// Under MoE, the MLP's products run over slots, a token's rows for its top_k experts: `slots`
// per token (1 for a dense MLP).
struct Widths {
  explicit Widths(const ModelConfig& cfg)
      : q(cfg.q_width()),
        kv(cfg.kv_width()),
        qkv(cfg.qkv_width()),
        hidden(cfg.mlp_width()),
        fc(cfg.mlp == MlpKind::kSwiglu ? 2 * hidden : hidden),
        dsmall(q > cfg.d_model ? q : cfg.d_model),
        experts(cfg.moe.experts),
        slots(cfg.has_moe() ? cfg.moe.top_k : 1) {}
  int q, kv, qkv, hidden, fc, dsmall, experts, slots;
  // The parts of the fused products' outputs, in order: q, k and v of qkv; gate and up of the
  // first MLP product (one part without SwiGLU). Tensor parallelism cuts each part among its ranks.
  std::vector<int> qkv_parts() const { return {q, kv, kv}; }
  std::vector<int> fc_parts() const {
    return fc == hidden ? std::vector<int>{hidden} : std::vector<int>{hidden, hidden};
  }
};

// Whether the architecture's norms have a bias (LayerNorm with one; never RMSNorm).
bool has_norm_bias(const ModelConfig& cfg);

// A block's tensors in the order of Decoder::Block, with their shapes; absent ones (no bias) are
// left out of the layout and null in Block.
struct BlockTensor {
  const char* name;
  std::vector<int64_t> shape;  // empty: absent
  bool matrix = false, residual = false;
  float init_value = 0.0f;  // of a vector: the norms' weights start at 1
};
std::vector<BlockTensor> block_tensors(const ModelConfig& cfg);
size_t numel_of(const std::vector<int64_t>& shape);

// Floats of every activation array: per layer in the order of Decoder::BlockActs, then the rest
// of Decoder::Acts, then the activation gradients.
struct ActivationSizes {
  size_t block[17];
  size_t block_layers;  // the stage's blocks (ModelStorage::stage), or 1 under activation checkpointing
  // encoded, residual3, lnf, lnf_mean, lnf_rstd, logits, losses, ce_lse, scratch, fch_gelu,
  // router_logits, expert_in
  size_t rest[12];
  // dresidual (the rows held), dsmall and dqkv for the microbatch; dbig and dfc (SwiGLU's own)
  // for a grain; demb_rows for a sequence; a tensor-parallel share's gathered rows, for a grain;
  // under MoE, for a grain: the experts' output and input gradients, the router's logits', its
  // weights' and its probabilities'
  size_t grads;
  // Under MoE, the routes' integers (Decoder::MoeRoutes) of every layer kept: int32s, apart
  // from the floats above.
  size_t moe_routes;
  // LoRA's (Decoder::lora_u_ ...): u, v, du, x, dx
  size_t lora[5];

  size_t block_total() const {
    size_t n = 0;
    for (size_t x : block) n += x;
    return n;
  }
  size_t total() const {
    size_t n = block_layers * block_total() + grads;
    for (size_t x : rest) n += x;
    for (size_t x : lora) n += x;
    return n;
  }
};
ActivationSizes activation_sizes(const ModelConfig& cfg, int max_batch, int max_seq, const ModelStorage& storage);
// Sequences per grain of the backward pass: the whole microbatch, but one sequence in a
// microbatch-invariant model on the CPU (a sequence's parameter gradients stay in cache while they
// are accumulated) or with parts whose backward goes a sequence at a time (MoE, LoRA, QK norms, a
// tensor-parallel share). An invariant model's grain forms a gradient span per sequence.
int backward_grain_sequences(const ModelConfig& cfg, int max_batch, const ModelStorage& storage);
// The floats of a block's gradient the backward pass asks for at once (UnitAccess::grads): the
// largest op's span (a product's weight and bias, under MoE one expert's, or a norm's
// parameters), one per sequence of an invariant model's grain.
size_t block_grads_span(const ModelConfig& cfg, int max_batch, const ModelStorage& storage);
// How many sequences' LM head weight gradients the backward pass forms, each in a span of the
// whole head's, before it hands them over together: where the block's grain is several sequences
// (a GPU), as many as the spans fit in kHeadSpansBytes (one where a span alone is larger), in the
// fewest groups and the smallest group size that gives them, so that the head's fixed-point pass
// reads its accumulators once a group and not once a sequence; otherwise one.
int head_grain_sequences(const ModelConfig& cfg, int max_batch, const ModelStorage& storage);
constexpr size_t kHeadSpansBytes = size_t{1} << 30;

// What model.h's model_* functions give, for the decoder cfg describes. The layout's offsets and
// sizes are filled in there.
std::vector<ParamTensor> decoder_param_layout(const ModelConfig& cfg);
// 6 per matmul weight (the LM head counts once, tied or not) plus the attention score and value
// products, 12·L·C·T. Under LoRA a frozen weight costs 4 (no weight gradient), an adapter 6.
double decoder_train_flops_per_token(const ModelConfig& cfg, int seq_len);
size_t decoder_activation_bytes(const ModelConfig& cfg, int max_batch, int max_seq, const ModelStorage& storage);
size_t decoder_evaluation_bytes(const ModelConfig& cfg, int max_batch, int max_seq);

}  // namespace anvil
