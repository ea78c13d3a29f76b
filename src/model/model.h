// What every layer above src/model sees of a model, whatever its family: the flat parameter
// layout cut into units, how units are reached (UnitAccess), what the model stores, and the
// passes. A family implements Model; make_model and the model_* functions choose it by
// model.name in one table (model.cpp), so data parallelism, checkpoints, the trainer and the
// benches never name a family.
//
// Under LoRA (ModelConfig::lora) the parameters are the adapters alone, a unit per block: what
// trains, is reduced, sharded, checkpointed and updated. The base model's weights are held apart,
// frozen (set_base_weights), and have no gradient.
//
// Parameters live in one flat array, unit by unit (the embeddings, each block, the final norm),
// so that each unit is one contiguous range: a block's gradient is complete, and can be reduced,
// while the backward pass goes on to the blocks below it, and a sharded run gathers one unit at a
// time. Parameters, gradients and activations are op memory (kernels/buffer.h): on the GPU under
// kernels=gpu; tokens, targets and losses cross to the host.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "core/dtype.h"
#include "kernels/buffer.h"

namespace anvil {

// One named parameter tensor inside the flat buffer ("wte", "h.3.qkvw", "lnfw").
struct ParamTensor {
  std::string name;
  std::vector<int64_t> shape;
  size_t offset = 0, numel = 0;
  int unit = 0;               // the contiguous unit that holds it (see ParamUnit)
  bool weight_decay = false;  // matmul weights decay; biases, norms and embeddings do not
  float init_std = 0.0f;      // normal(0, init_std); 0: init_uniform's or init_value
  float init_value = 0.0f;
  float init_uniform = 0.0f;  // uniform(-init_uniform, init_uniform) (LoRA's A); 0: init_value
  int index = 0;              // its place in the whole model's layout, which keys its initial values
};

// A contiguous range of the flat parameter array that the model uses as a whole: unit 0 is the
// embeddings, unit 1 + l is block l, unit L + 1 the final norm.
struct ParamUnit {
  size_t offset = 0, numel = 0;
};

// How the model reaches its parameters and gradients, one unit at a time. The default serves the
// model's own full arrays; data-parallel training substitutes one that gathers sharded
// parameters (ZeRO-3) or hands out working gradient buffers that it reduces as soon as the
// backward pass has finished with them (ZeRO-2/3), or starts reducing full gradients then.
//
// In a microbatch-invariant model (ModelStorage, the default) every matrix product whose rows'
// bits depend on the rows beside them (GPU BLAS) gives each sequence the bits of its product
// alone (matmul_forward_sequences, or one sequence at a time), and every parameter gradient is
// formed a sequence at a time, each in a span of its own: this keeps each sequence's forward pass
// and gradient independent of what else shares its microbatch, the basis of bitwise determinism
// across microbatch sizes. The grain below is then one sequence on the CPU, and on a GPU the
// microbatch with a span per sequence (formed by batched products: matmul_backward_sequences).
// Otherwise the grain is a whole microbatch with one span.
// How far apart UnitAccess::grads puts the spans of several sequences' contributions to count
// values of a gradient: count rounded up to 16 bytes, so that every span is as aligned as the
// first (GPU BLAS libraries run their fast kernels on 16-byte aligned outputs only).
inline size_t sequence_span_stride(size_t count) { return (count + 3) / 4 * 4; }
// The floats from the first of `sequences` such spans to the end of the last.
inline size_t sequence_spans_extent(size_t count, int sequences) {
  return (sequences - 1) * sequence_span_stride(count) + count;
}

class UnitAccess {
 public:
  virtual ~UnitAccess() = default;
  // The unit's parameters (layout order), valid until release_params(unit). next_unit: the unit
  // the model will ask for after this one (-1: none), so that it can be fetched ahead.
  virtual const float* acquire_params(int unit, int next_unit) = 0;
  virtual void release_params(int unit) = 0;
  // Where a grain's contributions to [offset, offset + count) of the unit's gradient are added
  // (+=): `sequences` spans of count floats, sequence_span_stride(count) apart, one for each of
  // the grain's sequences where each forms its gradient apart, or one span. A span may share
  // memory with the unit's earlier spans whose contributions were handed over (grain_done), so
  // that deterministic training needs scratch for the largest grain's spans only
  // (Model::largest_grads_span), not for the embedding table.
  virtual float* grads(int unit, size_t offset, size_t count, int sequences) = 0;
  // Spans as grads() gives them, which the caller's ops write (=) whole, every value of each span,
  // instead of adding to: their old values are not read, so they need not be cleared between
  // grains (deterministic training on a GPU, where clearing and reading them back cost a pass
  // over every sequence's spans). Null where contributions must be added (grads()).
  virtual float* grads_to_write(int, size_t, size_t, int) { return nullptr; }
  // The grain's contributions to [offset, offset + count) of the unit's gradient are complete in
  // the spans grads() or grads_to_write() gave for them. The backward pass says so after each
  // grain, so that contributions can be summed exactly (deterministic training accumulates each
  // sequence's in fixed point and clears the spans added to; written ones are left as they are);
  // parts it did not touch since the last call need not be named.
  virtual void grain_done(int unit, size_t offset, size_t count, int sequences) = 0;
  // One sequence's contribution to rows of one tensor, as the token embedding rows it touched,
  // held compact in x (op memory): row r of x is for [offset + rows[r]·row_len, + row_len) of
  // the unit. rows: distinct, in host memory and the same in op memory (rows_op), so that no copy
  // per sequence stops the GPU. x may be cleared.
  virtual void grain_rows(int unit, size_t offset, float* x, const int32_t* rows, const int32_t* rows_op,
                          size_t n_rows, size_t row_len) = 0;
  // The backward pass has added everything it will to the unit's gradient in this microbatch.
  virtual void grads_done(int unit) = 0;
};

// The blocks one pipeline stage runs: [first_layer, end_layer). The stage that starts at block 0
// also holds the embeddings; the one that ends at the last block holds the final norm and the LM
// head, and the embeddings too when the head is tied to them (their gradients are the sum of the
// two stages'). Its parameters are the units it holds, in the whole model's order, in an array
// of their own. The default is the whole model.
struct PipelineStage {
  int first_layer = 0;
  int end_layer = -1;  // -1: through the last block
  bool operator==(const PipelineStage&) const = default;
};

// Expert parallelism: the ranks that share a mixture of experts' work, and the messages between
// them. Each of the R ranks runs experts / R consecutive experts (expert e on rank e / (experts /
// R)) for the tokens of every rank: a pass sends each token's rows to its experts' ranks and takes
// their outputs back, a layer at a time, so the ranks run their passes in lockstep (the same
// number of passes, each through every layer). parallel/expert_parallel.h builds it over MPI.
class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  virtual int ranks() const = 0;
  virtual int rank() const = 0;
  struct Message {
    int peer;
    void* data;  // host memory
    size_t bytes;
  };
  // Posts every send and receive at once and waits for them all. Messages between two ranks are
  // matched in list order; this rank's messages to itself are copied to its receives from itself.
  // what: the pass, named in the error if a peer's message never comes.
  virtual void exchange(const std::vector<Message>& sends, const std::vector<Message>& receives,
                        const char* what) = 0;
  // Bytes sent to other ranks so far.
  virtual int64_t bytes_sent() const = 0;
};

// Tensor parallelism's ranks (model/tensor_parallel.h), for a model that holds one rank's share of
// each block: messages between two ranks are taken in the order they were sent.
class TensorExchange {
 public:
  virtual ~TensorExchange() = default;
  virtual int ranks() const = 0;
  virtual int rank() const = 0;
  // Starts sending n floats (host memory, left unchanged until wait_sends) to rank `to`.
  virtual void send(int to, const float* data, size_t n) = 0;
  // Waits for the next n floats from rank `from`.
  virtual void receive(int from, float* data, size_t n) = 0;
  // Waits until every send started has been taken.
  virtual void wait_sends() = 0;
  // Rank root's n floats at data, to every rank's data.
  virtual void broadcast(float* data, size_t n, int root) = 0;
  // Every rank's segment of data (counts[r] floats for rank r, the segments in rank order; this
  // rank's filled in) to every rank.
  virtual void all_gather(float* data, const std::vector<size_t>& counts) = 0;
};

// Which full arrays the model allocates for itself, and how it works. A sharded run leaves out
// what it shards.
struct ModelStorage {
  // Which kernels run the model's ops, and so where its arrays live (kernels/buffer.h).
  KernelImpl kernels = KernelImpl::kCpu;
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
  // The part of the model this one runs (pipeline parallelism); activations are held for its
  // blocks only.
  PipelineStage stage;
};

// What a config's model is before it is built (by model.name): its trainable parameters (under
// LoRA the adapters; the base's are model_param_layout(cfg.base())).
std::vector<ParamTensor> model_param_layout(const ModelConfig& cfg);
// The stage's tensors (their names and init as in the whole model; offsets in the stage's own
// array, units numbered from 0 over the stage's), after checking that the stage is a nonempty
// range of cfg's blocks; a whole-model stage gives model_param_layout. Under LoRA only the whole
// model is a stage.
std::vector<ParamTensor> stage_param_layout(const ModelConfig& cfg, const PipelineStage& stage);
// Block range of a stage with end_layer -1 resolved.
PipelineStage resolved_stage(const ModelConfig& cfg, const PipelineStage& stage);
size_t model_num_params(const ModelConfig& cfg);
// Whether weights trained as `loaded` serve the model `wanted` (a weights-only load): the same
// architecture; how they were initialised, their dropout, and the context length of a model
// without a position table may differ.
bool same_architecture(const ModelConfig& loaded, const ModelConfig& wanted);
// The units of a layout, from its tensors' unit numbers.
std::vector<ParamUnit> model_units(const std::vector<ParamTensor>& layout);
// The initial values of the flat range [lo, hi) of layout's array into out (hi - lo floats),
// from each tensor's init_std / init_uniform / init_value. Each value depends only on (seed, the
// tensor's index in the whole model, the element), so a shard or a pipeline stage initialises
// itself without the rest, to the whole model's values.
void model_init_params(const std::vector<ParamTensor>& layout, uint64_t seed, size_t lo, size_t hi, float* out);
// LoRA's adapters folded into its base: each adapted module's rows of its product's weight W
// become W + scaling·B·A (summed in double), so that the model cfg.base() with these weights
// computes what the adapted model does (to rounding). base: model_param_layout(cfg.base()) order;
// adapters: model_param_layout(cfg)'s.
std::vector<float> lora_merged_weights(const ModelConfig& cfg, const std::vector<float>& base,
                                       const std::vector<float>& adapters);
// Bytes of activations (and their gradients) a model built with storage holds for microbatches
// of up to max_batch sequences of max_seq tokens: what activation_bytes() will report.
size_t model_activation_bytes(const ModelConfig& cfg, int max_batch, int max_seq, const ModelStorage& storage);
// Bytes of the gradient spans a grain of the backward pass forms beyond one sequence's, in
// deterministic training's scratch (an invariant model on a GPU forms a span per sequence of its
// microbatch, and of a group of its sequences for the LM head): memory that grows with the
// microbatch, as the activations do.
size_t model_grain_grads_bytes(const ModelConfig& cfg, int max_batch, const ModelStorage& storage);
// Bytes an evaluation that keeps prefixes and picks rows (keep_prefix, forward_after_prefix,
// forward_logits: the ICL tasks) takes at most beyond the activations, in passes of up to
// max_batch sequences of up to max_seq tokens; freed by drop_prefix.
size_t model_evaluation_bytes(const ModelConfig& cfg, int max_batch, int max_seq);
// Training FLOPs per token (forward + backward), the MFU numerator.
double model_train_flops_per_token(const ModelConfig& cfg, int seq_len);
// The architecture in one line, as the train and bench logs print it: "Llama, 12 layers, 12 heads
// (4 key/value), d_model 768, vocab 50257; RMSNorm, RoPE (theta 10000), SwiGLU 2048, no biases,
// own LM head".
std::string model_architecture_summary(const ModelConfig& cfg);

class Model {
 public:
  virtual ~Model();

  const ModelConfig& config() const { return cfg_; }
  const std::vector<ParamTensor>& tensors() const { return layout_; }
  const std::vector<ParamUnit>& units() const { return units_; }
  size_t num_params() const { return num_params_; }
  bool microbatch_invariant() const { return storage_.microbatch_invariant; }
  KernelImpl kernels() const { return storage_.kernels; }
  // Replaces how units are reached (nullptr: the model's own arrays). Not owned.
  void set_unit_access(UnitAccess* access);
  // Expert parallelism over exchange's ranks (not owned; null: this model runs every expert): the
  // model is the exchange's rank's share of a mixture of experts (expert_share_config over as many
  // ranks), on host memory (kernels cpu/ref).
  void set_expert_exchange(ExpertExchange* exchange);
  // Whether passes exchange rows with other ranks, and so must run in lockstep with theirs.
  bool expert_parallel() const { return expert_exchange_ != nullptr; }
  // Tensor parallelism over exchange's ranks (not owned; null: this model is whole): this model is
  // the model of tensor_share_config(whole, ranks) (or a pipeline stage of it), holding rank's
  // share of every block
  // (model/tensor_parallel.h), on the CPU (kernels cpu; ref's products are not cut at k blocks).
  // Its passes then run in lockstep with the other ranks', on the same data, and give every rank
  // the whole model's losses and, for what it holds (its rows of the residual stream among them),
  // activations and gradients.
  void set_tensor_exchange(TensorExchange* exchange);
  TensorExchange* tensor_exchange() const { return tensor_exchange_; }
  // The model's own full arrays (op memory): null when ModelStorage left them out.
  float* params() { return params_.data(); }
  const float* params() const { return params_.data(); }
  float* grads() { return grads_.data(); }
  // model_init_params over the model's own parameter array.
  void init_weights(uint64_t seed);
  void zero_grad();
  // Under LoRA: the frozen base's weights (host, model_param_layout(config().base()) order), copied
  // where the ops run; required before a pass. held_in_bf16: the blocks' weights held in bf16,
  // for amp_bf16, whose products round them to bf16 anyway: the same bits in half the memory
  // (norms and embeddings stay fp32).
  virtual void set_base_weights(const std::vector<float>& base, bool held_in_bf16 = false) = 0;
  // Bytes of the frozen base where the ops run (0 without LoRA).
  virtual size_t base_bytes() const = 0;

  // The most floats of the unit's gradient the backward pass asks UnitAccess::grads for at once
  // (a grain's spans together, from the first's start to the last's end).
  virtual size_t largest_grads_span(int unit) const = 0;
  virtual size_t activation_bytes() const = 0;
  // Reallocates the activations for microbatches of up to max_batch sequences.
  virtual void set_max_batch(int max_batch) = 0;
  // The most sequences a pass may hold.
  virtual int max_batch() const = 0;

  // What matrix products compute in. Under bf16 / fp16 every matrix product's operands (weights
  // and biases, activations, the gradients flowing back) and its outputs are rounded to that
  // dtype, as autocast does; norms, softmax, attention's sums, the loss and every parameter
  // gradient stay fp32 (docs/precision.md).
  virtual void set_compute_dtype(ComputeDtype dtype) = 0;

  // Runs tokens (B,T) through the model (eval, generation). With targets (B,T) (kIgnoreIndex
  // allowed) it also computes per-token losses and returns their sum; the count of non-ignored
  // targets goes to *n_targets (may be null). The logits are formed one sequence at a time, so
  // only the last sequence's remain (logits()). positions (B,T, host), when sequences hold
  // several packed examples: each token's position in its own example (kernels/positions.h),
  // which its position embedding and attention see; null: token t is at position t.
  virtual double forward(const int32_t* tokens, const int32_t* targets, int B, int T, int64_t* n_targets,
                         const int32_t* positions = nullptr) = 0;
  // Evaluation that needs the predictions at a few positions (a language-modelling question's
  // continuation), not every position's logits: runs tokens (B,T) as forward() does and hands
  // the fp32 logits of the positions listed in rows (each b·T + t) to take, kLogitsChunk rows
  // at most a call, in order: rows [first, first + n), host memory (n x vocab_size) valid during
  // the call. Only those rows go through the LM head. Where the matrix products' rows are
  // independent (the CPU), each is the bits forward() gives that position. Its scratch on the
  // ops' side (a chunk's rows of the final norm's output) is held until drop_prefix.
  static constexpr int kLogitsChunk = 64;
  virtual void forward_logits(const int32_t* tokens, int B, int T, const std::vector<int64_t>& rows,
                              const std::function<void(size_t first, size_t n, const float* logits)>& take) = 0;
  // Evaluation of several sequences that begin alike, the shared tokens' work done once:
  // keep_prefix runs tokens (P of them, one sequence) through the blocks and keeps what each
  // layer's attention needs of them (its queries, keys and values); forward_after_prefix then runs
  // tokens (B,T) as if each sequence followed those P tokens (at positions P.., attending to
  // them), as forward() does otherwise: losses and logits of the B·T positions after the prefix.
  // Where the matrix products' rows are independent (the CPU), each position's values are the
  // bits forward() gives the whole sequence. The prefix holds until the next keep_prefix;
  // P + T must fit the model's sequence length. What they keep (each layer's qkv of the prefix,
  // and the joined rows of the last pass) is memory beyond the activations, held until
  // drop_prefix.
  virtual void keep_prefix(const int32_t* tokens, int P) = 0;
  virtual double forward_after_prefix(const int32_t* tokens, const int32_t* targets, int B, int T,
                                      int64_t* n_targets) = 0;
  virtual void drop_prefix() = 0;
  // Training: the forward pass, then adds to the gradient (through UnitAccess) dloss · (the
  // gradient of the sum of the per-token losses, plus a mixture of experts' balancing loss: see
  // moe_stats). Returns that sum, as forward() does, plus the balancing loss. With
  // dropout in the config, its masks are those of set_dropout_position's step and sequences.
  virtual double forward_backward(const int32_t* tokens, const int32_t* targets, int B, int T, float dloss,
                                  int64_t* n_targets, const int32_t* positions = nullptr) = 0;
  // Where the next forward_backward stands in training: the run's seed, the step, and the index
  // in the step's global batch of the microbatch's first sequence. Dropout masks are a function of
  // these (kernels/dropout.h), never of how the batch is cut into ranks and microbatches.
  struct DropoutPosition {
    uint64_t seed = 0;
    int64_t step = 0, first_sample = 0;
  };
  void set_dropout_position(const DropoutPosition& p) { dropout_position_ = p; }

  // Pipeline stages (ModelStorage::stage; parallel/pipeline.h runs them): the passes cut at the
  // stages' boundaries, a stage's input and output (and their gradients) crossing in host memory
  // as B·T rows of d_model floats, or a tensor-parallel share's held rows of them
  // (tensor_held_rows), which its peers in the other stages hold too. Run stage after stage,
  // they give every loss and gradient the bits forward() and forward_backward() give the whole
  // model. Those two, and the evaluations above, need the whole model.
  //
  // The stage's forward pass over B sequences of T tokens: the first stage embeds tokens (host,
  // kept until its backward pass), any other starts from input, the previous stage's output;
  // positions as forward() takes them, on every stage. Every stage but the last writes its last
  // block's output to output. targets: a training pass's (B,T), every stage's (a mixture of
  // experts' balancing loss counts each sequence's targets), for forward_backward's pass (dropout
  // applies), which stage_backward completes; null: an evaluation pass.
  virtual void stage_forward(const int32_t* tokens, const int32_t* positions, const float* input, int B, int T,
                             const int32_t* targets, float* output) = 0;
  // The last stage, after an evaluation stage_forward: the losses against targets (B,T) and their
  // sum, as forward() gives them.
  virtual double stage_loss(const int32_t* targets, int64_t* n_targets) = 0;
  // The backward pass of the last training stage_forward: on the last stage from targets and dloss
  // (the sum of the per-token losses returned; each stage's balancing loss is in its moe_stats),
  // on any other from doutput,
  // the gradient of its output (returning 0). Every stage but the first writes the gradient of its
  // input to dinput.
  virtual double stage_backward(const int32_t* targets, float dloss, const float* doutput, float* dinput,
                                int64_t* n_targets) = 0;
  // The blocks this model runs, end_layer resolved (the whole model unless built as a stage).
  const PipelineStage& stage() const { return storage_.stage; }
  bool whole_model() const { return storage_.stage.first_layer == 0 && storage_.stage.end_layer == cfg_.n_layers; }

  // (T,V) in op memory: the last sequence of the last forward(), in fp32.
  virtual const float* logits() const = 0;
  // (B,T) per-token losses of the last forward() with targets or forward_backward(); 0 where
  // ignored. Host memory.
  virtual const float* losses() const = 0;
  // A mixture of experts' accounting of the last training pass (forward_backward, or a training
  // stage_forward; zeros otherwise, and for a dense model) over the blocks it ran: its balancing
  // loss (config/model_config.h's MoeConfig, summed per target as the per-token losses are), and
  // how many of the tokens' expert choices there were and how many the experts skipped, full
  // (capacity).
  struct MoeStats {
    // Each block's balancing loss for each sequence: [(layer - first layer run) · B + sequence]. A
    // value per block and sequence, so that sums over them in fixed point are the same however
    // the blocks are cut into pipeline stages and the sequences into microbatches.
    std::vector<double> balance;
    int64_t choices = 0, skipped = 0;
    double balance_loss() const {
      double sum = 0;
      for (double b : balance) sum += b;
      return sum;
    }
  };
  virtual MoeStats moe_stats() const { return {}; }

 protected:
  // The layout, units and own arrays of cfg's model; max_seq: the longest sequence it will see.
  Model(const ModelConfig& cfg, int max_seq, const ModelStorage& storage);
  UnitAccess& access() { return *access_; }

  const ModelConfig cfg_;
  const ModelStorage storage_;
  const int max_seq_;
  DropoutPosition dropout_position_;
  ExpertExchange* expert_exchange_ = nullptr;
  TensorExchange* tensor_exchange_ = nullptr;

 private:
  class OwnArrays;
  std::vector<ParamTensor> layout_;
  std::vector<ParamUnit> units_;
  size_t num_params_ = 0;
  OpArray<float> params_, grads_;
  std::unique_ptr<UnitAccess> own_access_;
  UnitAccess* access_ = nullptr;
};

// The model cfg describes, with buffers for microbatches of up to max_batch sequences of up to
// max_seq tokens.
std::unique_ptr<Model> make_model(const ModelConfig& cfg, int max_batch, int max_seq, const ModelStorage& storage = {});

}  // namespace anvil
