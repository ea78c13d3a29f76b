// The decoder's sizes (model/decoder_layout.h).
#include "model/decoder_layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "config/lora_config.h"
#include "kernels/matmul.h"

namespace anvil {

bool has_norm_bias(const ModelConfig& cfg) { return cfg.norm == NormKind::kLayerNorm && cfg.norm_bias; }

namespace {

// The init std of a matrix with fan_in inputs; residual: it writes to the residual stream (the
// attention and MLP output projections).
float init_std(const ModelConfig& cfg, int64_t fan_in, bool residual) {
  const float depth = std::sqrt(2.0f * static_cast<float>(cfg.n_layers));
  switch (cfg.init) {
    case InitScheme::kGpt2:
      return residual ? 0.02f / depth : 0.02f;
    case InitScheme::kKaimingNormal: {
      const float std = std::sqrt(2.0f / static_cast<float>(fan_in));
      return residual ? std / depth : std;
    }
    case InitScheme::kNormal:
      return cfg.init_std;
  }
  return 0.0f;
}

}  // namespace

std::vector<BlockTensor> block_tensors(const ModelConfig& cfg) {
  const int64_t C = cfg.d_model;
  const Widths w(cfg);
  const bool nb = has_norm_bias(cfg), lb = cfg.linear_bias, qk = cfg.qk_norm != QkNorm::kNone;
  // The query and key norms' widths: the whole part's (all the ranks' heads' in a tensor-parallel
  // share, whose rows it norms whole), or one head's (shared by the heads).
  const bool per_head = cfg.qk_norm == QkNorm::kPerHead;
  const int64_t R = cfg.tensor_ranks;
  const int64_t qn = per_head ? cfg.head_size() : w.q * R, kn = per_head ? cfg.head_size() : w.kv * R;
  auto opt = [](bool present, int64_t n) { return present ? std::vector<int64_t>{n} : std::vector<int64_t>{}; };
  const bool moe = cfg.has_moe();
  // The router scores every expert; an expert-parallel share holds its own experts' weights alone.
  const int64_t E = moe ? cfg.moe.experts : 1, held = moe ? cfg.held_experts() : 1;
  return {{"ln1w", {C}, false, false, 1.0f},
          {"ln1b", opt(nb, C)},
          {"qlnw", opt(qk, qn), false, false, 1.0f},
          {"qlnb", opt(qk && nb, qn)},
          {"klnw", opt(qk, kn), false, false, 1.0f},
          {"klnb", opt(qk && nb, kn)},
          {"qkvw", {w.qkv, C}, true},
          {"qkvb", opt(lb || cfg.qkv_bias, w.qkv)},
          {"attprojw", {C, w.q}, true, true},
          {"attprojb", opt(lb, C)},
          {"ln2w", {C}, false, false, 1.0f},
          {"ln2b", opt(nb, C)},
          // Under MoE the router, then every held expert's fc weight (the i-th held expert's rows
          // from i·fc), then every held expert's fcproj weight (its (C, hidden) from i·C·hidden); no
          // biases.
          {"routerw", moe ? std::vector<int64_t>{E, C} : std::vector<int64_t>{}, true},
          {"routerb", {}},
          {"fcw", {held * w.fc, C}, true},
          {"fcb", opt(lb && !moe, w.fc)},
          {"fcprojw", {held * C, w.hidden}, true, true},
          {"fcprojb", opt(lb && !moe, C)}};
}

size_t numel_of(const std::vector<int64_t>& shape) {
  if (shape.empty()) return 0;
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

namespace {

// LoRA's adapters, a unit per block: for each module chosen, A (r, in) then B (out, r), named by
// the module's transformers path ("h.3.self_attn.q_proj.lora_A").
std::vector<ParamTensor> lora_param_layout(const ModelConfig& cfg) {
  std::vector<ParamTensor> t;
  const int64_t r = cfg.lora.r;
  const std::vector<LoraModule> modules = lora_targets(cfg);
  for (int l = 0; l < cfg.n_layers; l++)
    for (const LoraModule& m : modules) {
      const std::string name = fmt::format("h.{}.{}.", l, m.name);
      ParamTensor a{name + "lora_A", {r, m.in}, 0, 0, l, true};
      a.init_uniform = 1.0f / std::sqrt(static_cast<float>(m.in));  // PEFT's kaiming_uniform_(a=√5)
      t.push_back(a);
      t.push_back({name + "lora_B", {m.rows, r}, 0, 0, l, true});  // zero: training starts from the base
    }
  return t;
}

// The widest input and output of the adapters chosen.
int lora_widest_in(const std::vector<LoraModule>& modules) {
  int w = 0;
  for (const LoraModule& m : modules) w = std::max(w, m.in);
  return w;
}
int lora_widest_out(const std::vector<LoraModule>& modules) {
  int w = 0;
  for (const LoraModule& m : modules) w = std::max(w, m.rows);
  return w;
}

}  // namespace

std::vector<ParamTensor> decoder_param_layout(const ModelConfig& cfg) {
  if (cfg.has_lora()) return lora_param_layout(cfg);
  const int64_t L = cfg.n_layers, C = cfg.d_model, V = cfg.vocab_size, P = cfg.max_seq_len;
  // The embeddings are tables, initialised as a matrix of fan_in C (kaiming) or at 0.02.
  const float emb_std = init_std(cfg, C, false);
  std::vector<ParamTensor> t = {{"wte", {V, C}, 0, 0, 0, false, emb_std, 0}};
  if (cfg.positions == PositionKind::kLearned) t.push_back({"wpe", {P, C}, 0, 0, 0, false, emb_std, 0});
  const std::vector<BlockTensor> block = block_tensors(cfg);
  for (int l = 0; l < L; l++) {
    const std::string h = fmt::format("h.{}.", l);
    for (const BlockTensor& b : block) {
      if (b.shape.empty()) continue;
      t.push_back({h + b.name, b.shape, 0, 0, 1 + l, b.matrix, b.matrix ? init_std(cfg, b.shape[1], b.residual) : 0,
                   b.init_value});
    }
  }
  const int last = static_cast<int>(L) + 1;
  t.push_back({"lnfw", {C}, 0, 0, last, false, 0, 1});
  if (has_norm_bias(cfg)) t.push_back({"lnfb", {C}, 0, 0, last, false, 0, 0});
  if (!cfg.tied_embeddings) t.push_back({"lm_head", {V, C}, 0, 0, last, true, init_std(cfg, C, false), 0});
  return t;
}

double decoder_train_flops_per_token(const ModelConfig& cfg, int seq_len) {
  const double C = cfg.d_model, L = cfg.n_layers;
  const Widths w(cfg);
  // A token passes through the router and its top_k experts' products.
  const double mlp = cfg.has_moe() ? C * (cfg.moe.experts + cfg.moe.top_k * (w.fc + w.hidden)) : C * (w.fc + w.hidden);
  const double block_matrices = C * (w.qkv + w.q) + mlp;
  const double matmul_params = static_cast<double>(cfg.vocab_size) * C + L * block_matrices;
  // Attention's two products per query head: over the query width, which is d_model unless the
  // head size is the family's own.
  const double attention = 12.0 * L * w.q * seq_len;
  if (!cfg.has_lora()) return 6.0 * matmul_params + attention;
  double adapters = 0;
  for (const LoraModule& m : lora_targets(cfg)) adapters += static_cast<double>(cfg.lora.r) * (m.in + m.rows);
  return 4.0 * matmul_params + 6.0 * L * adapters + attention;
}

int backward_grain_sequences(const ModelConfig& cfg, int max_batch, const ModelStorage& storage) {
  if (!storage.microbatch_invariant) return max_batch;
  const bool per_sequence_parts = cfg.has_moe() || cfg.has_lora() || cfg.qk_norm != QkNorm::kNone || cfg.tensor_share();
  return matmul_rows_independent(storage.kernels) || per_sequence_parts ? 1 : max_batch;
}

size_t block_grads_span(const ModelConfig& cfg, int max_batch, const ModelStorage& storage) {
  const std::vector<BlockTensor> block = block_tensors(cfg);
  size_t largest = 0;
  const size_t experts = cfg.has_moe() ? cfg.held_experts() : 1;
  for (size_t i = 0; i < block.size(); i += 2) {
    const bool expert_weight = i >= 14;  // fc's and fcproj's pairs
    const size_t pair = numel_of(block[i].shape) + numel_of(block[i + 1].shape);
    largest = std::max(largest, pair / (expert_weight ? experts : 1));
  }
  const int spans = storage.microbatch_invariant ? backward_grain_sequences(cfg, max_batch, storage) : 1;
  return sequence_spans_extent(largest, spans);
}

int head_grain_sequences(const ModelConfig& cfg, int max_batch, const ModelStorage& storage) {
  if (!storage.microbatch_invariant || backward_grain_sequences(cfg, max_batch, storage) == 1) return 1;
  const size_t span_bytes = sequence_span_stride(static_cast<size_t>(cfg.vocab_size) * cfg.d_model) * sizeof(float);
  const int fit = static_cast<int>(std::clamp<size_t>(kHeadSpansBytes / span_bytes, 1, max_batch));
  const int groups = (max_batch + fit - 1) / fit;
  return (max_batch + groups - 1) / groups;
}

ActivationSizes activation_sizes(const ModelConfig& cfg, int max_batch, int max_seq, const ModelStorage& storage) {
  const PipelineStage stage = resolved_stage(cfg, storage.stage);
  // The stage's blocks; the LM head's logits and its log-sum-exps on the last stage only.
  const size_t T = max_seq, BT = static_cast<size_t>(max_batch) * T, C = cfg.d_model,
               L = static_cast<size_t>(stage.end_layer - stage.first_layer),
               V = stage.end_layer == cfg.n_layers ? cfg.vocab_size : 0, NH = cfg.n_heads,
               GT = T * backward_grain_sequences(cfg, max_batch, storage);
  const Widths w(cfg);
  const size_t QKV = w.qkv, F = w.hidden, FC = w.fc;
  const size_t mean = cfg.norm == NormKind::kLayerNorm ? BT : 0;  // RMSNorm keeps no mean
  // The residual stream's rows this rank holds (a tensor-parallel share holds at most ceil(BT/R)
  // of them: sequence parallelism) and the norms' activations over them; a share gathers a grain's
  // rows of them when a product or the backward pass needs them whole.
  const size_t R = cfg.tensor_ranks, BS = (BT + R - 1) / R, stream_mean = mean ? BS : 0;
  const size_t gathered = R > 1 ? GT * C : 0;
  const size_t dfc = cfg.mlp == MlpKind::kSwiglu ? GT * FC : 0;     // GELU's backward runs in place
  const size_t Q = w.q, DS = w.dsmall;
  // The query and key norms: their inputs, and their saves per position (one per head under
  // per-head norms; Decoder::qk_norm_part); the normed part's gradient, a grain at a time.
  const size_t qk = cfg.qk_norm != QkNorm::kNone ? 1 : 0, qk_raw = qk * BT * (Q + w.kv), dqk = qk * GT * Q;
  const size_t qk_rows = cfg.qk_norm == QkNorm::kPerHead ? BT * (NH + cfg.kv_heads()) : 2 * qk * BT;
  const size_t qk_mean = cfg.norm == NormKind::kLayerNorm ? qk_rows : 0;
  const size_t layers = storage.activation_checkpointing ? 1 : L;
  // Under MoE: the router's probabilities and the chosen weights, the experts' outputs (a row per
  // slot), and the routes' integers (Decoder::MoeRoutes: 7 of BT·K each).
  const size_t E = w.experts, K = w.slots, probs = E * BT, chosen = E ? BT * K : 0, expert_rows = E ? BT * K * C : 0;
  const size_t moe_grads = E ? 2 * GT * K * C + GT * E + GT * K + GT * E : 0;
  ActivationSizes s{{BS * C, stream_mean, BS, BT * QKV, qk_raw, qk_mean, qk_rows, BT * Q, NH * BT, BS * C, BS * C,
                     stream_mean, BS, BT * K * FC, probs, chosen, expert_rows},
                    layers,
                    {BS * C, L * BS * C, BS * C, stream_mean, BS, T * V, BT, V ? T : 0, BT * DS, BT * K * F, probs,
                     expert_rows},
                    BS * C + BT * DS + GT * K * F + K * dfc + BT * QKV + T * C + gathered + dqk + moe_grads,
                    layers * (E ? 7 * BT * K : 0),
                    {}};
  if (cfg.has_lora()) {
    const std::vector<LoraModule> modules = lora_targets(cfg);
    const size_t r = cfg.lora.r, in = lora_widest_in(modules), out = lora_widest_out(modules);
    const bool dropout = cfg.lora.dropout > 0;
    s.lora[0] = layers * modules.size() * BT * r;
    s.lora[1] = BT * out;
    s.lora[2] = GT * r;
    s.lora[3] = dropout ? BT * in : 0;
    s.lora[4] = dropout ? GT * in : 0;
  }
  return s;
}

size_t decoder_activation_bytes(const ModelConfig& cfg, int max_batch, int max_seq, const ModelStorage& storage) {
  const ActivationSizes s = activation_sizes(cfg, max_batch, max_seq, storage);
  return s.total() * sizeof(float) + s.moe_routes * sizeof(int32_t);
}

// Decoder's Prefix and forward_logits' chunk at their largest: each layer's qkv of a prefix of up
// to max_seq - 1 tokens, the joined rows of a pass (max_batch sequences of up to max_seq tokens
// with the prefix: their qkv, attention outputs and log-sum-exps), and a chunk's rows of the final
// norm's output and their logits on the host.
size_t decoder_evaluation_bytes(const ModelConfig& cfg, int max_batch, int max_seq) {
  const Widths w(cfg);
  const size_t S = static_cast<size_t>(max_seq), B = static_cast<size_t>(max_batch);
  const size_t chunk = std::min<size_t>(Model::kLogitsChunk, S);
  const size_t floats = static_cast<size_t>(cfg.n_layers) * (S - 1) * w.qkv +
                        B * S * (static_cast<size_t>(w.qkv) + w.q + cfg.n_heads) +
                        chunk * (static_cast<size_t>(cfg.d_model) + cfg.vocab_size);
  return floats * sizeof(float);
}

}  // namespace anvil
