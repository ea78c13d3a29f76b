// The decoder every family is built from (model/model.h's Model): token embeddings (and learned
// positions when the family has them), L pre-norm blocks (norm, fused qkv product, RoPE on the
// queries and keys when chosen, causal attention with grouped-query heads and ALiBi as options,
// output projection, residual; norm, MLP of GELU or SwiGLU, residual), the final norm and the LM
// head, tied to the token embedding or its own. ModelConfig's architecture options choose each
// part; GPT-2 is the defaults. Every activation is allocated once, for the largest microbatch (at
// construction, or by set_max_batch before training): a step never allocates.
//
// Built as a pipeline stage (ModelStorage::stage), it holds and runs its own blocks, with the
// embeddings on the first stage and the final norm and LM head on the last, and its passes are
// the whole model's cut at the stage's ends (Model::stage_forward).
//
// Under LoRA the base's weights are read from the frozen copy (Model::base_params) and only the
// adapters go through UnitAccess (unit l: block l's). An adapted product adds its branch,
// scaling · (dropout(x)·Aᵀ)·Bᵀ, to the base product's output columns the module covers; the
// backward pass forms the input gradients through the base and the branches, and parameter
// gradients for the adapters alone.
#pragma once
#include <array>
#include <cstdint>
#include <deque>
#include <vector>

#include "kernels/attention.h"
#include "kernels/dropout.h"
#include "config/lora_config.h"
#include "kernels/matmul.h"
#include "model/decoder_layout.h"
#include "model/model.h"
#include "model/tensor_parallel.h"

namespace anvil {

// out (B·T, OC) = inp (B·T, C) · weightᵀ + bias: where the model must be invariant, each
// sequence's rows the bits of a product of that sequence alone (matmul_forward_sequences), so that
// a sequence's result never depends on the microbatch it came in (see UnitAccess); else one
// product for the microbatch.
void matmul_forward_microbatch(MatmulContext& ctx, bool invariant, float* out, const float* inp, const float* weight,
                               const float* bias, int B, int T, int C, int OC);

class Decoder final : public Model {
 public:
  // Buffers for microbatches of up to max_batch sequences of up to max_seq tokens.
  Decoder(const ModelConfig& cfg, int max_batch, int max_seq, const ModelStorage& storage = {});

  // Of a block, its largest op's (a product's weight and bias); of the embeddings, a chunk of the
  // tied LM head's rows or a sequence's positions; of the final unit, its norm or a chunk of its
  // own LM head's rows. Under LoRA, an adapter's A and B.
  size_t largest_grads_span(int unit) const override;
  size_t activation_bytes() const override {
    return (act_memory_.size() + grad_act_memory_.size()) * sizeof(float) + moe_routes_memory_.size() * sizeof(int32_t);
  }
  void set_max_batch(int max_batch) override;
  int max_batch() const override { return max_batch_; }
  void set_compute_dtype(ComputeDtype dtype) override;
  void set_base_weights(const std::vector<float>& base, bool held_in_bf16 = false) override;
  size_t base_bytes() const override;
  double forward(const int32_t* tokens, const int32_t* targets, int B, int T, int64_t* n_targets,
                 const int32_t* positions = nullptr) override;
  void forward_logits(const int32_t* tokens, int B, int T, const std::vector<int64_t>& rows,
                      const std::function<void(size_t first, size_t n, const float* logits)>& take) override;
  double forward_backward(const int32_t* tokens, const int32_t* targets, int B, int T, float dloss,
                          int64_t* n_targets, const int32_t* positions = nullptr) override;
  void keep_prefix(const int32_t* tokens, int P) override;
  double forward_after_prefix(const int32_t* tokens, const int32_t* targets, int B, int T,
                              int64_t* n_targets) override;
  void drop_prefix() override;
  void stage_forward(const int32_t* tokens, const int32_t* positions, const float* input, int B, int T,
                     const int32_t* targets, float* output) override;
  double stage_loss(const int32_t* targets, int64_t* n_targets) override;
  double stage_backward(const int32_t* targets, float dloss, const float* doutput, float* dinput,
                        int64_t* n_targets) override;
  // The LM head's fp32 products (under amp, of 16-bit operands; the loss reads them rounded:
  // crossentropy.h).
  const float* logits() const override { return acts_.logits; }
  const float* losses() const override { return losses_host_.data(); }
  MoeStats moe_stats() const override { return moe_stats_; }

 private:
  // A block's activations, per layer (or for one layer under activation checkpointing).
  struct BlockActs {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv;
    // Under QK LayerNorm, the queries and keys before their norms (all the queries' rows, then
    // the keys'), and the norms' saves (the queries', then the keys').
    float *qk_raw, *qk_mean, *qk_rstd;
    float *atty, *att_lse, *residual2, *ln2, *ln2_mean, *ln2_rstd, *fch;
    // Under MoE (fch then holds a row per slot): the router's probabilities (N,E), the chosen
    // experts' weights (N,k), and the experts' outputs, a row per slot.
    float *probs, *route_weights, *expert_out;
  };
  struct Acts {
    BlockActs block;  // layer l's at offset l·(its size for one layer)
    float *encoded, *residual3, *lnf, *lnf_mean, *lnf_rstd, *logits, *losses, *ce_lse, *scratch;
    // The MLP activation's output (GELU's or SwiGLU's), the MLP projection's input: one layer's,
    // not kept per layer, since the backward pass recomputes it from fch a grain at a time (the
    // same bits) for less memory.
    float* fch_gelu;
    // Under MoE: the router's logits, and the experts' input rows (a row per slot; in the backward
    // pass a grain's, in MoeRoutes' grain order).
    float *router_logits, *expert_in;
  };
  // One block's tensors inside its unit, in layout order; null where the architecture has none
  // (norm biases, product biases, the QK norms, the router and its absent bias). The norms come
  // before the products they feed, so that a block is its first norms, then qkv and attproj, ln2,
  // then the router under MoE, fc and fcproj (under MoE every held expert's, one after another).
  struct Block {
    float *ln1w, *ln1b, *qlnw, *qlnb, *klnw, *klnb, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *routerw,
        *routerb, *fcw, *fcb, *fcprojw, *fcprojb;
  };
  Block bind_block(const float* base) const;
  // The passes below number units as the whole model does (0 the embeddings, 1 + l block l,
  // L + 1 the final norm), whatever the stage; units() and the unit access count the stage's own
  // (Model::units()). This is the access in the whole model's numbers: a prefetch hint of a unit
  // outside the stage is dropped, and asking for one is a bug.
  class StageUnits final : public UnitAccess {
   public:
    explicit StageUnits(Decoder& d) : d_(d) {}
    const float* acquire_params(int unit, int next_unit) override {
      return d_.access().acquire_params(d_.stage_unit(unit), next_unit < 0 ? -1 : d_.stage_units_[next_unit]);
    }
    void release_params(int unit) override { d_.access().release_params(d_.stage_unit(unit)); }
    float* grads(int unit, size_t offset, size_t count, int sequences) override {
      return d_.access().grads(d_.stage_unit(unit), offset, count, sequences);
    }
    float* grads_to_write(int unit, size_t offset, size_t count, int sequences) override {
      return d_.access().grads_to_write(d_.stage_unit(unit), offset, count, sequences);
    }
    void grain_done(int unit, size_t offset, size_t count, int sequences) override {
      d_.access().grain_done(d_.stage_unit(unit), offset, count, sequences);
    }
    void grain_rows(int unit, size_t offset, float* x, const int32_t* rows, const int32_t* rows_op, size_t n_rows,
                    size_t row_len) override {
      d_.access().grain_rows(d_.stage_unit(unit), offset, x, rows, rows_op, n_rows, row_len);
    }
    void grads_done(int unit) override { d_.access().grads_done(d_.stage_unit(unit)); }

   private:
    Decoder& d_;
  };
  int stage_unit(int unit) const;
  // [whole-model unit]: its number among the stage's, -1 where the stage does not hold it (under
  // LoRA, whose units are the blocks' adapters and whose stage is the whole model, the same).
  std::vector<int> stage_units_;
  StageUnits units_in_stage_{*this};
  bool first_stage() const { return stage().first_layer == 0; }
  bool last_stage() const { return stage().end_layer == cfg_.n_layers; }
  // Block l's output (its residual stream after the MLP, the rows held), l in the stage.
  float* block_output(int l) const {
    return acts_.residual3 + static_cast<size_t>(l - stage().first_layer) * held_capacity() * cfg_.d_model;
  }
  // Block l's input: the stage's input (the embeddings' output on the first stage) or the block
  // before's output.
  const float* block_input(int l) const { return l == stage().first_layer ? acts_.encoded : block_output(l - 1); }
  // One of a block's four matrix products, out = inp·weightᵀ + bias over rows of `in` columns
  // into rows of `out`: its weight and bias (null when the architecture has none) in the block's
  // unit, `offset` floats from the unit's start, its gradient span from the weight to the end of
  // the bias; and the LoRA product whose adapters add their branches to it.
  struct Linear {
    BlockProduct product;
    const float *weight, *bias;
    size_t offset;
    int in, out;
    size_t span() const { return (bias ? static_cast<size_t>(out) : 0) + static_cast<size_t>(in) * out; }
  };
  Linear linear(const Block& p, BlockProduct product) const;
  // The product over the microbatch, its adapters' branches added, rounded to the compute dtype.
  void linear_forward(int l, const Linear& f, float* out, const float* inp, const float* adapters);
  // Its backward over the grain of n sequences from b: the input gradient into dinp, rounded to
  // the compute dtype, and the parameter gradients: the weight's and bias's, or under LoRA (the
  // base frozen) the adapters'.
  void linear_backward(int l, const Linear& f, float* dinp, const float* dout, const float* inp,
                       const float* adapters, int b, int n);
  // Tensor parallelism (Model::set_tensor_exchange; model/tensor_parallel.h). The attention's and
  // the MLP's output products are row-parallel: each rank holds some of their k. The qkv and up
  // (gate) products are column-parallel: each rank holds some of their outputs, in parts (q, k
  // and v; gate and up) each a range of the whole product's outputs.
  static bool row_parallel(BlockProduct p) { return p == BlockProduct::kAttnOut || p == BlockProduct::kFcProj; }
  static bool column_parallel(BlockProduct p) { return p == BlockProduct::kQkv || p == BlockProduct::kFc; }
  std::vector<int> column_parts(BlockProduct p) const;
  // Sequence parallelism: a tensor-parallel share holds rows [first, first + n) of a pass's N rows
  // of the residual stream (N·r/R to N·(r+1)/R for rank r of R), and runs the norms, the residual
  // sums and their saves over those rows alone; its arrays of them (the stream, the norms' outputs
  // and saves, dresidual_) start at row first. A whole model holds every row.
  HeldRows held_rows(int rank, int N) const { return tensor_held_rows(cfg_, rank, N); }
  HeldRows held_rows(int N) const { return held_rows(cfg_.tensor_rank, N); }
  // Rows of those arrays: the most any rank holds of the largest microbatch.
  size_t held_capacity() const {
    const size_t rows = static_cast<size_t>(max_batch_) * max_seq_, R = static_cast<size_t>(cfg_.tensor_ranks);
    return (rows + R - 1) / R;
  }
  // Rows [g0, g1) of width floats whole on every rank, into whole (row g0 first), from each
  // holder's array `held` (held_rows).
  void gather_held_rows(float* whole, const float* held, int g0, int g1, int width);
  // Rows [g0, g1) of whole (row g0 first), complete on the last rank (a chain's end), sent to
  // their holders: each rank's whole is then right at the rows it holds.
  void send_rows_to_holders(float* whole, int g0, int g1, int width);
  // The norm's backward over rows [g0, g1) of its input gradient dout (row g0 first): the input
  // gradient added into dinp and the parameter gradient into dw, held arrays for inp, dinp, mean
  // and rstd. Under sequence parallelism the holders add the rows to dw in row order, one after
  // another, as one process does, and the last sends the sum to every rank. spans > 1: the rows
  // are that many sequences, each adding to a span of its own (UnitAccess::grads).
  void norm_backward_rows(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                          const float* mean, const float* rstd, int g0, int g1, int spans);
  // The norm's backward over this rank's rows of a weight gradient that sums over the ranks in
  // `order` (this rank among them or not): each adds its rows in turn, as norm_backward_rows says,
  // and the last sends the gradient to every rank.
  void chained_norm_backward(const std::vector<int>& order, float* dinp, float* dw, const float* dout,
                             const float* inp, const float* w, const float* mean, const float* rstd, int rows,
                             int width);
  std::vector<int> all_ranks_;  // 0 .. tensor_ranks - 1
  std::array<std::vector<float>, 3> qk_whole_;
  std::vector<float> qk_part_;
  std::deque<std::vector<float>> chain_scratch_;  // chain_scratch's
  size_t chain_scratch_used_ = 0;
  std::vector<int> holders_;    // norm_backward_rows' ranks holding its rows
  // Sequence b's rows of the final norm's output, whole (gathered_ under sequence parallelism).
  const float* lnf_rows(int b);
  // Rows per link of a chain: a few links per rank, so that the ranks work on different rows at once.
  int chain_rows(int N) const;
  // A row-parallel product's output over the microbatch: the ranks add the pieces of its k
  // (tensor_k_chain) to the partial sum in turn, a link of rows at a time (the first piece's rank
  // with the bias), each handing the sum on, and the last rank's sum is one process's product
  // (block_forward applies the residual dropout there and sends the rows to their holders:
  // send_rows_to_holders).
  void chained_forward(const Linear& f, float* out, const float* inp);
  // A column-parallel product's input gradient over rows [g0, g0 + N), the same chain through
  // every part's ranks in the whole product's output order, each row's sum then to its holder.
  void chained_input_grad(const Linear& f, float* dinp, const float* dout, int g0, int N);
  // The chain of both: out (N × J) = A (N × k) · B (k × J) over the whole k (whole_k: the ranks'
  // runs of it), this rank's A its k columns of a (row stride lda) and its B f.weight's columns
  // (forward: J = f.out) or rows (input gradient: J = f.in). A piece assembled from several ranks'
  // segments gets their columns of A and B first: every rank sends what others assemble, then
  // takes what it assembles, before the chain starts.
  void chained_product(const Linear& f, bool forward, float* out, const float* a, long lda, int N,
                       const std::vector<KSegment>& whole_k);
  // Scratch of n floats for chained_product, valid until the next chained_product call (host
  // memory outside the activations' arrays: the straddling blocks' columns and the copies of
  // runs that are not a rank's whole k, which a forward product reads contiguous).
  float* chain_scratch(size_t n);
  // The vocabulary cut among the ranks (cfg_.tensor_share(); model/tensor_parallel.h). The
  // microbatch's token embeddings (every row, into out): each rank looks up the tokens it holds,
  // and each rank's rows go to the others in turn.
  void vocab_parallel_embedding(float* out, const float* wte, const float* wpe);
  // The loss of one sequence's T rows (targets_op: columns of this rank's logits, upload_targets)
  // from this rank's logits (acts_.logits) through the slice cross-entropy, the ranks exchanging
  // each row's maximum and target logit, then their block sums; in evaluation (lse given) the lse
  // too, in training (lse null) the logits' gradient over the logits.
  void vocab_parallel_crossentropy(const int32_t* targets_op, float* losses, float* lse, float dloss);
  // The LM head's input gradient (sequence b's T rows into dinp) over every rank's vocabulary: a
  // chain in vocabulary order, as chained_input_grad's.
  void chained_head_input_grad(const float* emb, float* dinp, int b);
  int vocab_owner(int32_t token) const;
  // The base's unit: through UnitAccess, or the frozen copy under LoRA (a block held in bf16
  // widened into base_block_).
  bool frozen() const { return cfg_.has_lora(); }
  const float* acquire_base(int unit, int next_unit);
  void release_base(int unit);
  // Block l's adapters (unit l under LoRA) as the products use them: rounded to the compute dtype
  // in adapters_rounded_ unless fp32; null without LoRA.
  const float* acquire_adapters(int l, int next_l);
  void release_adapters(int l);
  // The branches of the adapters on `product` of block l, over the microbatch: added into out
  // (rows of width columns) from inp. adapters: acquire_adapters's.
  void lora_forward(int l, BlockProduct product, float* out, int width, const float* inp, const float* adapters);
  // Their backward over the grain of n sequences from b: the adapters' gradients, and the input
  // gradient added into dinp; dout: the product's output gradient (rows of width), inp: its input.
  void lora_backward(int l, BlockProduct product, float* dinp, const float* dout, int width, const float* inp,
                     const float* adapters, int b, int n);
  // Block l's adapter k's input dropout at sequence b0 (inactive outside training or at p 0).
  DropoutSite lora_dropout_site(int l, int k, int b0) const;
  // Where adapter k's product with A, x·Aᵀ (B·T, r), is kept for block l's backward.
  float* lora_u(int l, int k) const;
  // Floats of each of Block's tensors (0: absent), in its order: a weight, then its bias.
  std::array<size_t, 18> block_sizes_{};
  // A block unit's parameters as matrix products use them: p itself in fp32; otherwise a copy in
  // compute_params_ with the matrix operands rounded.
  const float* compute_params(int unit, const float* p);
  // The LM head p (the token embedding when tied) as the products use it, held by the matmuls
  // (MatmulContext::hold_weight) until release_weight: p itself in fp32, and where the hold
  // rounds it (lm_head_held_rounded_); otherwise a rounded copy in compute_params_.
  const float* hold_lm_head(const float* p);
  // The unit holding the LM head (0 when tied, else the final unit, after the final norm) and
  // where the head starts in it.
  int head_unit() const { return cfg_.tied_embeddings ? 0 : cfg_.n_layers + 1; }
  size_t head_offset() const { return cfg_.tied_embeddings ? 0 : norm_params(); }
  // Floats of one norm's parameters over rows of width (d_model unless given): its weight, and
  // its bias when it has one.
  size_t norm_params(int width = 0) const;
  // The norm of the architecture over N rows of width, forward and backward (mean unused by
  // RMSNorm); dw: the norm's parameter gradient span (weight, then bias).
  void norm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int N,
                    int width);
  void norm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w, const float* mean,
                     const float* rstd, int N, int width);
  // QK LayerNorm over the microbatch: x.qkv's query and key columns, kept in x.qk_raw, replaced
  // by their norms' outputs. A part's rows (the norms' inputs, outputs and saves) go grain by
  // grain of the backward pass (grain_sequences), and within a grain head by head, so that a
  // per-head norm's weight gradient sums over one head's rows after another's: under tensor
  // parallelism a chain of the ranks, each holding some of the heads.
  struct QkNormPart {
    int col0, width, norm, per_position;
    size_t raw, save;
  };
  QkNormPart qk_norm_part(bool keys) const;
  // Between n sequences' qkv rows (B,T,qkv) and the part's grain rows (heads, n·T, norm): out to
  // the grain rows, or back into qkv's columns.
  void qk_part_rows(const QkNormPart& q, float* grain_rows, float* qkv, int n, bool to_grain_rows);
  void qk_norm_forward(const BlockActs& x, const Block& p);
  // A QK norm over all the heads' channels (MPT's qk_ln) under tensor parallelism: its statistics
  // span the ranks, so each rank's columns of a pass's rows go to every rank (gather_qk_columns:
  // rows of `width` floats into rows of width·R, rank order being the heads' order), and every
  // rank norms the whole rows (forward and backward) alike, keeping its columns. Its buffers
  // (qk_whole: host memory, a pass's rows of all the heads' channels) are not among the
  // activations' arrays.
  bool qk_norm_spans_ranks() const;
  void gather_qk_columns(float* whole, const float* mine, int rows, int width);
  float* qk_whole(int k, size_t n);
  // Its backward over the grain of n sequences from b: dqkv_'s query and key columns from the
  // norms' outputs' gradients to their inputs', and the norms' parameter gradients.
  void qk_norm_backward(int l, const BlockActs& x, const Block& p, int b, int n);
  // Under MoE, a layer's routes (of the microbatch routed last in that layer's slot), where the
  // ops run: each token's chosen experts (N,k), their slots (N,k; -1: skipped, the expert full)
  // and each slot's token and choice (moe.h). Slots are expert-major, then in (sequence, position,
  // choice) order, so that an expert's rows for a run of sequences are contiguous. The grain_
  // arrays number them again for the backward pass, which goes a grain of sequences at a time:
  // a grain's slots packed in (expert, sequence, position) order, each token's slots as that
  // packing's index (grain_slots), each packed row's token within the grain and its choice.
  struct MoeRoutes {
    int32_t *experts, *slots, *slot_tokens, *slot_choices, *grain_slots, *grain_slot_tokens, *grain_slot_choices;
  };
  MoeRoutes moe_routes(int l);
  // The host's view of layer l's routes: choices[b·E + e], sequence b's choices of expert e (before
  // capacity); segment[e·(B+1) + b], where expert e's slots of sequence b start (segment[e·(B+1)
  // + B]: its end).
  struct MoeHostRoutes {
    std::vector<int32_t> choices, segment;
  };
  // Block l's MLP under MoE, over the microbatch: the router, the routes, the experts and their
  // combination into out (N,C), rounded to the compute dtype; in training, the balancing loss and
  // the skipped choices added to moe_stats_.
  void moe_forward(int l, const BlockActs& x, const Block& p, const float* adapters, float* out);
  // Its backward over the grain of n sequences from b: dout the combination's gradient (rows of
  // the grain; null under expert parallelism, whose exchanges took it for the whole microbatch
  // before the grains: experts_exchanged_backward), into dinp the gradient of the MLP's input
  // (ln2's output), and the router's and the experts' weight gradients.
  void moe_backward(int l, const BlockActs& x, const Block& p, const float* adapters, const float* dout, float* dinp,
                    int b, int n);
  // Where a grain's gradient of block l's weight w (n floats) goes, handed over by
  // weight_grads_done; null under LoRA, whose base is frozen.
  float* weight_grads(int l, const Block& p, const float* w, size_t n);
  void weight_grads_done(int l, const Block& p, const float* w, size_t n);
  // Layer l's routes from the experts chosen: capacity applied, slots numbered, uploaded.
  void moe_assign_slots(int l);
  // Expert e's products over runs of rows (bounds[0..runs]: a run per sequence): out (rows, out_w)
  // = inp · the expert's weight ᵀ, one call over all the runs unless a row's bits depend on its
  // neighbours (then one per run). Rows are numbered from 0 in inp and out.
  void expert_products(const float* weights, int e, float* out, const float* inp, int in_w, int out_w,
                       const int32_t* bounds, int runs);
  // Expert parallelism (Model::set_expert_exchange): this rank runs its experts for every rank of
  // the exchange. A layer's forward pass sends each rank's rows of an expert (one run of the
  // MoeRoutes slot order) to the expert's rank, which keeps what it gets in (its expert, sending
  // rank, sequence) order, runs it, and sends the outputs back into x.expert_out; the backward
  // pass sends the outputs' gradients the same way and takes back the inputs'. Each sequence's
  // rows go through the products, and form the weight gradients, as in one process.
  struct ExpertRows {
    std::vector<int32_t> counts;  // [sending rank][1 + its local expert j·max_batch_ + sequence]: [0] its sequences
    std::vector<int32_t> start;   // [j·ranks + rank]: where (j, rank)'s rows start in in and fch; [last]: the end
    OpArray<float> in, fch;       // the rows received, and their first product (for the backward pass)
  };
  std::vector<ExpertRows> expert_rows_;  // per layer slot
  // The rank's own experts' working rows (activation, outputs, gradients) and, for its tokens, a
  // microbatch's gradients of the experts' outputs and inputs, the branch's, and the route weights'.
  OpArray<float> ep_act_, ep_out_, ep_dout_, ep_dbig_, ep_dfc_, ep_din_, ep_dbranch_, ep_dexpert_out_,
      ep_dexpert_in_, ep_droute_weights_;
  std::vector<int32_t> ep_counts_;  // what this rank sends of its rows' counts
  // a holds at least n floats (grown, its contents not kept).
  void grow(OpArray<float>& a, size_t n) {
    if (a.size() >= n) return;
    a.reset();
    a.assign_zeros(kernels(), n);
  }
  // Layer l's experts of this rank over every rank's rows (after the routes are assigned).
  void experts_exchanged_forward(int l, const BlockActs& x, const Block& p);
  // Their backward over the microbatch, before the grains: the combination's backward, the
  // experts' (weight gradients on the experts' rank), the inputs' gradients back in ep_dexpert_in_.
  void experts_exchanged_backward(int l, const BlockActs& x, const Block& p);
  // Sends a microbatch's expert rows (`local`, the slot order) of width floats to the experts'
  // ranks (`remote`, ExpertRows' order), or back when !to_experts.
  void exchange_expert_rows(int l, float* local, float* remote, int width, bool to_experts, const char* what);
  // Local expert j's runs over the rows received: a run per (sending rank, sequence).
  std::vector<int32_t> received_runs(const ExpertRows& o, int j) const;
  OpArray<int32_t> moe_routes_memory_;
  std::vector<MoeHostRoutes> moe_host_;  // per layer slot, as moe_routes
  std::vector<int32_t> moe_scratch_;     // host copies of the routes being numbered
  std::vector<float> moe_probs_host_, moe_dprobs_host_;
  // The balancing loss's factor for sequence b of the training pass: loss_weight · E/(k·T²) over
  // the layers, times the sequence's targets.
  double balance_scale(int b) const;
  std::vector<int64_t> sequence_targets_;  // of the training pass, per sequence
  MoeStats moe_stats_;  // of the last training pass
  float dloss_ = 0;       // the backward pass's scale of the loss
  bool recomputing_ = false;  // block_forward recomputes a block for its backward pass
  // The MLP activation (GELU or SwiGLU) of N rows of fch into out, and its gradient: dfc from
  // dout and fch; both rounded to the compute dtype as they are written.
  void mlp_activation(float* out, const float* fch, int N);
  void mlp_activation_backward(float* dfc, const float* fch, const float* dout, int N);
  // Layer l's attention over the whole microbatch (its dropout keyed from the microbatch's first
  // sequence when training).
  AttentionHeads attention_heads(int l) const;
  // The dropout of a site (layer 0 the embeddings, 1 + l block l) at sequence b0 of the
  // microbatch: inactive outside forward_backward, or where the config's p is 0.
  DropoutSite dropout_site(int layer, DropoutKind kind, float p, int b0) const;
  // The gradient a residual branch's projection sees, for n_seq sequences from b0: dres times
  // the branch's dropout mask, rounded to the compute dtype (in rounded_dres_ unless dres serves).
  const float* branch_grad(const float* dres, int layer, DropoutKind kind, int b0, int n_seq);
  // x (n <= one grain's T·C) rounded to the compute dtype, in rounded_dres_ (x itself in fp32).
  const float* rounded(const float* x, long n);
  ComputeDtype dtype() const { return matmul_.operand_dtype(); }
  // Sequences per grain of the backward pass (backward_grain_sequences).
  int grain_sequences() const { return backward_grain_sequences(cfg_, max_batch_, storage_); }
  // The parameter gradient spans a grain of n sequences forms (UnitAccess::grads): one per sequence
  // in an invariant model, else one.
  int grain_spans(int n) const { return storage_.microbatch_invariant ? n : 1; }
  // rounded_dres_ for the compute dtype and the grain.
  void allocate_rounded_dres();
  // Layer l's activations (slot 0 for every layer under activation checkpointing).
  BlockActs block_acts(int l) const;
  // Where layer l keeps what it saves for its backward pass: its index in the stage, or 0 for every
  // layer under activation checkpointing.
  size_t layer_slot(int l) const {
    return storage_.activation_checkpointing ? 0 : static_cast<size_t>(l - stage().first_layer);
  }
  // The embeddings (or on a later stage its input, into acts_.encoded), the stage's blocks, and on
  // the last stage the final norm, up to acts_.lnf.
  void forward_to_lnf(const int32_t* tokens, const int32_t* positions, const float* input, int B, int T);
  // The microbatch's positions where the ops run, from sequence b on; null when not packed.
  const int32_t* positions_op(int b) const {
    return packed_ ? positions_op_.data() + static_cast<size_t>(b) * T_ : nullptr;
  }
  // Block l over the microbatch: its activations in block_acts(l), its output in residual3 of l.
  void block_forward(int l, const Block& p, const float* adapters, const float* residual);
  // Block l's attention over the microbatch, x.qkv to x.atty; after a kept prefix, each sequence's
  // queries attend to the prefix's keys and values too.
  void attend(int l, const BlockActs& x);
  // keep_prefix's tokens as each layer's attention saw them: the prefix's qkv rows per layer
  // (length of them), and the last forward_after_prefix's sequences with the prefix before each
  // (their qkv, attention outputs and log-sum-exps); each grown as needed, freed by
  // drop_prefix. keeping: keep_prefix's pass is on; after: a forward_after_prefix pass is.
  struct Prefix {
    OpArray<float> qkv, joined_qkv, joined_atty, joined_lse;
    int length = 0;
    bool keeping = false, after = false;
  };
  Prefix prefix_;
  // forward_logits' rows of the final norm's output, gathered for the LM head; freed by drop_prefix.
  OpArray<float> picked_rows_;
  // The logits (T,V) of a sequence's rows of the final norm's output (lnf_rows) into acts_.logits;
  // emb: the LM head (hold_lm_head).
  void lm_head(const float* emb, const float* lnf);
  void check_targets(const int32_t* targets, int N) const;
  // Checks a training pass's targets (B,T) and counts each sequence's into sequence_targets_.
  void count_sequence_targets(const int32_t* targets, int B, int T);
  // Fails unless the model is the whole model, naming the pass that needs it.
  void require_whole_model(const char* pass) const;
  // After forward_to_lnf on the last stage: with targets the losses of the B_ sequences and their
  // sum (sum_losses); without, the last sequence's logits alone, and 0.
  double head_forward(const int32_t* targets, int64_t* n_targets);
  // Copies the losses to the host and sums them.
  double sum_losses(const int32_t* targets, int N, int64_t* n_targets);
  // The host targets copied where the ops run; returns that copy.
  const int32_t* upload_targets(const int32_t* targets, int N);
  // LM head forward, cross-entropy and the backward pass, after forward_to_lnf; targets_op as
  // upload_targets returned them. In three parts: the LM head and the final norm (the gradient
  // of the last block's output into dresidual_; on a stage before the last, stage_backward puts
  // it there), block l (dresidual_ from its output's gradient to its input's), and the
  // embeddings (on the first stage).
  void backward(const int32_t* targets_op, float dloss);
  void lm_head_backward(const int32_t* targets_op, float dloss);
  void block_backward(int l);
  void embedding_backward();

  int max_batch_;
  // The base's units (the model's own under LoRA are the adapters'), and the adapters chosen,
  // each at lora_offset_ in its block's unit (A, then B).
  std::vector<ParamUnit> base_units_;
  std::vector<LoraModule> lora_;
  std::vector<size_t> lora_offset_;
  OpArray<float> act_memory_, grad_act_memory_, compute_params_, rounded_dres_, adapters_rounded_;
  // Under sequence parallelism, a grain's rows gathered whole (gather_held_rows) from the held
  // arrays: of a norm's output or of dresidual_; null otherwise.
  float* gathered_ = nullptr;
  // chained_norm_backward's sums under RMSNorm (host memory: tensor parallelism runs on the CPU).
  std::vector<double> rms_weight_sums_;
  // A frozen norm's parameter gradient, formed by the norm's backward and not kept.
  OpArray<float> frozen_dnorm_;
  // LoRA's frozen base: all of it in fp32 (base_); or held in bf16, the blocks' values in
  // base_bf16_, each block's norms (ln1's, then ln2's) in fp32 in base_norms_, the rest (the
  // embeddings, then the final unit) in base_, and the block in use widened in base_block_.
  OpArray<float> base_, base_norms_, base_block_;
  OpArray<uint16_t> base_bf16_;
  // LoRA's activations: each adapter's x·Aᵀ per layer (lora_u_), a branch's output or output
  // gradient (lora_v_), x·Aᵀ's gradient for a grain (lora_du_), and, with lora_dropout, the
  // branch's dropped input (lora_x_) and its gradient for a grain (lora_dx_).
  float *lora_u_ = nullptr, *lora_v_ = nullptr, *lora_du_ = nullptr, *lora_x_ = nullptr, *lora_dx_ = nullptr;
  OpArray<int32_t> tokens_op_, targets_op_;  // the microbatch's tokens and targets, where the ops run
  OpArray<int32_t> positions_op_;            // and its positions, when packed_
  bool packed_ = false;                      // the microbatch's sequences hold packed examples
  std::vector<float> losses_host_;
  MatmulContext matmul_;  // the operand dtype (the compute dtype) and the held LM head
  bool lm_head_held_rounded_ = false;  // amp, and matmul_.hold_rounds_weight(): no copy of unit 0
  Acts acts_{};
  // Gradients of activations: dresidual_ for the microbatch's rows held (held_rows), dsmall_ and
  // dqkv_ for the microbatch; dbig_ (the activation's output) and dfc_ (its input: dbig_ itself
  // for GELU, in place) for one grain (the blocks' backward works a grain at a time); demb_rows_ the
  // token embedding's gradient for one sequence, a row per distinct token of it (touched_rows_);
  // gathered_ (above) under sequence parallelism; dqk_ a QK norm's input gradient for a grain.
  float *dresidual_ = nullptr, *dbig_ = nullptr, *dfc_ = nullptr, *dqkv_ = nullptr, *dsmall_ = nullptr,
        *demb_rows_ = nullptr, *dqk_ = nullptr;
  // Under MoE, for a grain: the experts' output and input gradients (rows in MoeRoutes' grain
  // order), the router logits' gradient, the chosen weights', and the balancing loss's gradient on
  // the router's probabilities.
  float *dexpert_out_ = nullptr, *dexpert_in_ = nullptr, *drouter_ = nullptr, *droute_weights_ = nullptr,
        *dprobs_ = nullptr;
  const int32_t* tokens_ = nullptr;  // of the last forward (host), for the embedding's backward
  // Each sequence's distinct tokens, ascending, one after another (sequence b's from
  // touched_offsets_[b]; capacity max_batch·max_seq), and each position's token as its index among
  // its sequence's; the same where the ops run.
  std::vector<int32_t> touched_rows_, compact_tokens_;
  std::vector<size_t> touched_offsets_;
  OpArray<int32_t> touched_rows_op_, compact_tokens_op_;
  // Under a cut vocabulary: each rank's first token id (and the vocabulary's size last); the
  // targets as this rank's columns, or the tokens as its rows; host scratch of the exchanges.
  struct VocabShare {
    std::vector<int> bounds, rows;
    std::vector<int32_t> columns;
    std::vector<size_t> counts;  // of an all-gather over the ranks
    std::vector<float> max, sums, buffer;
  } vocab_;
  int B_ = 0, T_ = 0;
  bool training_ = false;  // inside forward_backward: dropout applies
  bool stage_trained_ = false;  // the last stage_forward was a training pass, not yet completed
};

}  // namespace anvil
