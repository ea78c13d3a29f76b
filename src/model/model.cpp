// What every model shares (the flat arrays, the units, the initialisation), and the model_*
// functions, which every family answers through the one decoder (model/decoder.h).
#include "model/model.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "config/families/family.h"
#include "config/lora_config.h"
#include "core/error.h"
#include "core/rng.h"
#include "kernels/encoder.h"
#include "kernels/matmul.h"
#include "kernels/residual.h"
#include "model/decoder.h"

namespace anvil {

std::vector<ParamTensor> model_param_layout(const ModelConfig& cfg) {
  std::vector<ParamTensor> layout = decoder_param_layout(cfg);
  size_t offset = 0;
  for (size_t k = 0; k < layout.size(); k++) {
    ParamTensor& t = layout[k];
    t.numel = 1;
    for (int64_t d : t.shape) t.numel *= static_cast<size_t>(d);
    t.offset = offset;
    t.index = static_cast<int>(k);
    offset += t.numel;
  }
  return layout;
}

PipelineStage resolved_stage(const ModelConfig& cfg, const PipelineStage& stage) {
  PipelineStage s = stage;
  if (s.end_layer < 0) s.end_layer = cfg.n_layers;
  if (stage == PipelineStage{}) return s;  // the whole model, whatever its size (checked where it is built)
  ANVIL_CHECK(s.first_layer >= 0 && s.first_layer < s.end_layer && s.end_layer <= cfg.n_layers,
              "a pipeline stage of blocks [{}, {}): expected a nonempty range of the model's {} blocks", s.first_layer,
              s.end_layer, cfg.n_layers);
  ANVIL_CHECK(!cfg.has_lora() || (s.first_layer == 0 && s.end_layer == cfg.n_layers),
              "a LoRA model is one pipeline stage: its adapters are not split into stages");
  return s;
}

std::vector<ParamTensor> stage_param_layout(const ModelConfig& cfg, const PipelineStage& stage) {
  const PipelineStage s = resolved_stage(cfg, stage);
  std::vector<ParamTensor> layout = model_param_layout(cfg);
  if (s.first_layer == 0 && s.end_layer == cfg.n_layers) return layout;
  // Units of the whole model: 0 the embeddings, 1 + l block l, L + 1 the final norm (and the
  // LM head when untied).
  const int L = cfg.n_layers;
  const bool last = s.end_layer == L;
  auto held = [&](int unit) {
    if (unit == 0) return s.first_layer == 0 || (last && cfg.tied_embeddings);
    if (unit == L + 1) return last;
    return unit - 1 >= s.first_layer && unit - 1 < s.end_layer;
  };
  std::vector<ParamTensor> out;
  std::vector<int> renumbered(static_cast<size_t>(L) + 2, -1);
  int units = 0;
  size_t offset = 0;
  for (ParamTensor& t : layout) {
    if (!held(t.unit)) continue;
    if (renumbered[t.unit] < 0) renumbered[t.unit] = units++;
    t.unit = renumbered[t.unit];
    t.offset = offset;
    offset += t.numel;
    out.push_back(std::move(t));
  }
  return out;
}

size_t model_num_params(const ModelConfig& cfg) {
  const std::vector<ParamTensor> layout = model_param_layout(cfg);
  return layout.back().offset + layout.back().numel;
}

bool same_architecture(const ModelConfig& loaded, const ModelConfig& wanted) {
  ModelConfig m = loaded;
  m.init = wanted.init;
  m.init_std = wanted.init_std;
  m.emb_pdrop = wanted.emb_pdrop;
  m.attn_pdrop = wanted.attn_pdrop;
  m.resid_pdrop = wanted.resid_pdrop;
  if (m.positions != PositionKind::kLearned) m.max_seq_len = wanted.max_seq_len;
  return m == wanted;
}

std::vector<ParamUnit> model_units(const std::vector<ParamTensor>& layout) {
  std::vector<ParamUnit> units(static_cast<size_t>(layout.back().unit) + 1);
  for (const ParamTensor& t : layout) {
    ParamUnit& u = units[t.unit];
    if (u.numel == 0) u.offset = t.offset;
    u.numel = t.offset + t.numel - u.offset;
  }
  return units;
}

void model_init_params(const std::vector<ParamTensor>& layout, uint64_t seed, size_t lo, size_t hi, float* out) {
  for (const ParamTensor& t : layout) {
    const uint64_t k = static_cast<uint64_t>(t.index);
    const size_t a = std::max(lo, t.offset), b = std::min(hi, t.offset + t.numel);
    if (a >= b) continue;
    float* p = out + (a - lo);
    const size_t first = a - t.offset, n = b - a;
    if (t.init_std != 0.0f) {
#pragma omp parallel for schedule(static)
      for (size_t i = 0; i < n; i++) p[i] = t.init_std * static_cast<float>(normal_at(seed, k, first + i));
    } else if (t.init_uniform != 0.0f) {
#pragma omp parallel for schedule(static)
      for (size_t i = 0; i < n; i++)
        p[i] = t.init_uniform * static_cast<float>(2.0 * uniform_at(seed, k, first + i) - 1.0);
    } else {
      std::fill(p, p + n, t.init_value);
    }
  }
}

std::vector<float> lora_merged_weights(const ModelConfig& cfg, const std::vector<float>& base,
                                       const std::vector<float>& adapters) {
  ANVIL_CHECK(cfg.has_lora(), "only a LoRA model has adapters to merge");
  const ModelConfig base_cfg = cfg.base();
  ANVIL_CHECK(base.size() == model_num_params(base_cfg) && adapters.size() == model_num_params(cfg),
              "merging LoRA: {} base weights and {} adapter values, expected {} and {}", base.size(), adapters.size(),
              model_num_params(base_cfg), model_num_params(cfg));
  std::map<std::string, const ParamTensor*> by_name;
  const std::vector<ParamTensor> base_layout = model_param_layout(base_cfg), lora_layout = model_param_layout(cfg);
  for (const ParamTensor& t : base_layout) by_name[t.name] = &t;
  for (const ParamTensor& t : lora_layout) by_name[t.name] = &t;
  auto at = [&](const std::string& name) -> const ParamTensor& {
    const auto it = by_name.find(name);
    ANVIL_CHECK(it != by_name.end(), "internal: no tensor '{}' to merge", name);
    return *it->second;
  };
  const char* product_tensor[] = {"qkvw", "attprojw", "fcw", "fcprojw", "routerw"};  // by BlockProduct
  std::vector<float> merged = base;
  const int r = cfg.lora.r;
  const double scaling = cfg.lora.scaling();
  for (int l = 0; l < cfg.n_layers; l++)
    for (const LoraModule& m : lora_targets(cfg)) {
      const std::string prefix = fmt::format("h.{}.{}.", l, m.name);
      const float* A = adapters.data() + at(prefix + "lora_A").offset;
      const float* B = adapters.data() + at(prefix + "lora_B").offset;
      const ParamTensor& w = at(fmt::format("h.{}.{}", l, product_tensor[static_cast<int>(m.product)]));
      float* W = merged.data() + w.offset + static_cast<size_t>(m.row0) * m.in;
#pragma omp parallel for schedule(static)
      for (int i = 0; i < m.rows; i++)
        for (int c = 0; c < m.in; c++) {
          double delta = 0;
          for (int k = 0; k < r; k++) delta += static_cast<double>(B[i * r + k]) * A[static_cast<size_t>(k) * m.in + c];
          float& x = W[static_cast<size_t>(i) * m.in + c];
          x = static_cast<float>(x + scaling * delta);
        }
    }
  return merged;
}

size_t model_activation_bytes(const ModelConfig& cfg, int max_batch, int max_seq, const ModelStorage& storage) {
  return decoder_activation_bytes(cfg, max_batch, max_seq, storage);
}

size_t model_grain_grads_bytes(const ModelConfig& cfg, int max_batch, const ModelStorage& storage) {
  const size_t blocks = block_grads_span(cfg, max_batch, storage), blocks_one = block_grads_span(cfg, 1, storage);
  // The LM head's spans beyond one sequence's: a GPU's head span is the whole vocabulary's, and
  // more than one only where the head goes by groups, so only there does it grow. A tied head's
  // spans are the embeddings' scratch (beside the blocks'); an untied head's share the blocks'
  // (GradientReduction::fit_scratch: the larger of the two).
  const bool head = resolved_stage(cfg, storage.stage).end_layer == cfg.n_layers;
  const size_t group = head ? head_grain_sequences(cfg, max_batch, storage) : 1;
  const size_t head_one = static_cast<size_t>(cfg.vocab_size) * cfg.d_model,
               head_group = sequence_spans_extent(head_one, static_cast<int>(group));
  const size_t growth = group == 1 ? blocks - blocks_one
                        : cfg.tied_embeddings
                            ? blocks - blocks_one + head_group - head_one
                            : std::max(blocks, head_group) - std::max(blocks_one, head_one);
  return growth * sizeof(float);
}

size_t model_evaluation_bytes(const ModelConfig& cfg, int max_batch, int max_seq) {
  return decoder_evaluation_bytes(cfg, max_batch, max_seq);
}

double model_train_flops_per_token(const ModelConfig& cfg, int seq_len) {
  return decoder_train_flops_per_token(cfg, seq_len);
}

std::string model_architecture_summary(const ModelConfig& c) {
  std::string s = fmt::format("{}, {} layers, {} heads", family(c.name).title, c.n_layers, c.n_heads);
  if (c.kv_heads() != c.n_heads) s += fmt::format(" ({} key/value)", c.kv_heads());
  if (c.head_dim) s += fmt::format(" of {}", c.head_dim);
  s += fmt::format(", d_model {}, vocab {}; ", c.d_model, c.vocab_size);
  s += c.norm == NormKind::kRmsNorm ? "RMSNorm" : c.norm_bias ? "LayerNorm" : "LayerNorm without bias";
  if (c.qk_norm == QkNorm::kWhole) s += " (and on queries and keys)";
  if (c.qk_norm == QkNorm::kPerHead) s += " (and on each head's queries and keys)";
  switch (c.positions) {
    case PositionKind::kLearned: s += ", learned positions"; break;
    case PositionKind::kAlibi: s += fmt::format(", ALiBi (bias max {:g})", c.alibi_bias_max); break;
    case PositionKind::kRope:
      s += fmt::format(", RoPE (theta {:g}", c.rope.theta);
      if (c.rope.scaling != RopeScalingKind::kNone)
        s += fmt::format("; {} scaling by {:g}", choice_name(c.rope.scaling), c.rope.factor);
      s += ")";
      break;
    case PositionKind::kNone: s += ", no positions"; break;
  }
  switch (c.mlp) {
    case MlpKind::kGeluTanh: s += fmt::format(", GELU (tanh) {}", c.mlp_width()); break;
    case MlpKind::kGeluErf: s += fmt::format(", GELU (erf) {}", c.mlp_width()); break;
    case MlpKind::kSwiglu: s += fmt::format(", SwiGLU {}", c.mlp_width()); break;
  }
  if (c.has_moe()) {
    s += fmt::format(" in each of {} experts, top {}", c.moe.experts, c.moe.top_k);
    s += c.moe.capacity_factor > 0 ? fmt::format(" (capacity factor {:g})", c.moe.capacity_factor) : " (dropless)";
  }
  s += c.linear_bias ? ", biases" : c.qkv_bias ? ", biases on q, k, v" : ", no biases";
  s += c.tied_embeddings ? ", tied LM head" : ", own LM head";
  if (c.sliding_window) s += fmt::format(", sliding window {}", c.sliding_window);
  return s;
}

std::unique_ptr<Model> make_model(const ModelConfig& cfg, int max_batch, int max_seq, const ModelStorage& storage) {
  return std::make_unique<Decoder>(cfg, max_batch, max_seq, storage);
}

namespace {
ModelStorage with_resolved_stage(const ModelConfig& cfg, ModelStorage storage) {
  storage.stage = resolved_stage(cfg, storage.stage);
  return storage;
}
}  // namespace

// The default access: the model's own full arrays, nothing to gather or reduce.
class Model::OwnArrays : public UnitAccess {
 public:
  explicit OwnArrays(Model& m) : m_(m) {}
  const float* acquire_params(int unit, int) override {
    ANVIL_CHECK(!m_.params_.empty(), "the model holds no parameters of its own and has no unit access set");
    return m_.params_.data() + m_.units_[unit].offset;
  }
  void release_params(int) override {}
  // Contributions accumulate in place, or (apart) each span is added to the gradient in sequence
  // order and cleared for the next grain (which may add to the same spans without asking again).
  void grain_done(int unit, size_t offset, size_t count, int sequences) override {
    if (!apart()) return;
    float* g = own(unit, offset);
    const size_t stride = sequence_span_stride(count);
    for (int i = 0; i < sequences; i++)
      residual_forward(m_.kernels(), g, g, spans_.data() + i * stride, static_cast<long>(count));
    op_zero(m_.kernels(), spans_.data(), sequence_spans_extent(count, sequences) * sizeof(float));
  }
  void grain_rows(int unit, size_t offset, float* x, const int32_t*, const int32_t* rows_op, size_t n_rows,
                  size_t row_len) override {
    add_rows(m_.kernels(), own(unit, offset), x, rows_op, n_rows, row_len);
  }
  float* grads(int unit, size_t offset, size_t count, int sequences) override {
    float* g = own(unit, offset);
    if (!apart()) return g;
    const size_t n = sequence_spans_extent(count, sequences);
    if (spans_.size() < n) {  // all zero between grains
      spans_.reset();
      spans_.assign_zeros(m_.kernels(), n);
    }
    return spans_.data();
  }
  void grads_done(int) override {}

 private:
  float* own(int unit, size_t offset) {
    ANVIL_CHECK(!m_.grads_.empty(), "the model holds no gradients of its own and has no unit access set");
    return m_.grads_.data() + m_.units_[unit].offset + offset;
  }
  // An invariant model on a GPU forms a gradient span per sequence of its microbatch: every span,
  // one sequence's or several, is formed apart and added in sequence order, so that a sequence's
  // contribution reaches the gradient alike whatever the microbatch (in place, a product adds
  // with one rounding, not two).
  bool apart() const { return m_.microbatch_invariant() && !matmul_rows_independent(m_.kernels()); }

  Model& m_;
  OpArray<float> spans_;  // apart: the grain's spans
};

Model::Model(const ModelConfig& cfg, int max_seq, const ModelStorage& storage)
    : cfg_(cfg), storage_(with_resolved_stage(cfg, storage)), max_seq_(max_seq) {
  check_model_sizes(cfg, nullptr);
  ANVIL_CHECK(cfg.max_seq_len > 0, "model.max_seq_len = {} must be a positive integer", cfg.max_seq_len);
  ANVIL_CHECK(max_seq >= 1 && max_seq <= cfg.max_seq_len, "sequence length {} must be in 1..the model's "
              "max_seq_len {}", max_seq, cfg.max_seq_len);
  layout_ = stage_param_layout(cfg, storage.stage);
  units_ = model_units(layout_);
  num_params_ = layout_.back().offset + layout_.back().numel;
  if (storage.params) params_.assign_zeros(kernels(), num_params_);
  if (storage.grads) grads_.assign_zeros(kernels(), num_params_);
  own_access_ = std::make_unique<OwnArrays>(*this);
  access_ = own_access_.get();
}

Model::~Model() = default;

void Model::set_unit_access(UnitAccess* access) { access_ = access ? access : own_access_.get(); }

void Model::set_expert_exchange(ExpertExchange* exchange) {
  if (exchange) {
    ANVIL_CHECK(cfg_.has_moe(), "expert parallelism shares a mixture of experts' experts among ranks; this model's "
                "blocks have a dense MLP");
    ANVIL_CHECK(exchange->ranks() == cfg_.expert_ranks && exchange->rank() == cfg_.expert_rank,
                "expert parallelism: this model is rank {}'s share of the experts among {} ranks "
                "(expert_share_config), not rank {} of {}", cfg_.expert_rank, cfg_.expert_ranks, exchange->rank(),
                exchange->ranks());
    ANVIL_CHECK(kernels() != KernelImpl::kGpu, "expert parallelism exchanges rows through host memory: it runs "
                "with kernels cpu or ref for now");
  }
  expert_exchange_ = exchange;
}

void Model::set_tensor_exchange(TensorExchange* exchange) {
  if (exchange) {
    ANVIL_CHECK(kernels() == KernelImpl::kCpu, "tensor parallelism chains the ranks' parts of a product through the "
                "CPU's k blocks: it runs with kernels cpu");
    ANVIL_CHECK(!cfg_.has_moe() && !cfg_.has_lora(), "tensor parallelism does not cut LoRA models or mixtures of "
                "experts yet");
    ANVIL_CHECK(cfg_.tensor_share(), "tensor parallelism needs a rank's share of the model (tensor_share_config "
                "over at least 2 ranks); this model is whole");
    ANVIL_CHECK(exchange->ranks() == cfg_.tensor_ranks && exchange->rank() == cfg_.tensor_rank,
                "tensor parallelism: this model is rank {}'s share of {} ranks (tensor_share_config), not rank {} of "
                "{}", cfg_.tensor_rank, cfg_.tensor_ranks, exchange->rank(), exchange->ranks());
  }
  tensor_exchange_ = exchange;
}

void Model::init_weights(uint64_t seed) {
  ANVIL_CHECK(!params_.empty(), "init_weights needs the model's own parameter array");
  std::vector<float> host(num_params_);
  model_init_params(layout_, seed, 0, num_params_, host.data());
  op_copy_from_host(kernels(), params_.data(), host.data(), num_params_ * sizeof(float));
}

void Model::zero_grad() { op_zero(kernels(), grads_.data(), grads_.size() * sizeof(float)); }

}  // namespace anvil
