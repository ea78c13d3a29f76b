// The model's shape and architecture (the `model:` section of a config), apart from the rest of
// the training config so that the model module needs nothing else of it. A family (model.name)
// is a choice of the architecture options below, which the config reader fills in from the
// family's defaults and its keys; the decoder (model/decoder.h) reads only the options. The
// defaults are GPT-2's.
#pragma once
#include <cmath>
#include <string>
#include <vector>

#include "config/choices.h"
#include "core/rope.h"

namespace anvil {

enum class NormKind { kLayerNorm, kRmsNorm };
// A norm on the queries and keys before attention (and before RoPE): none; over all the queries
// and over all the keys of a position, before the heads split (LLM Foundry's attn_config.qk_ln);
// or over each head's channels with one weight of head_size shared by the heads (Qwen3's q_norm
// and k_norm).
enum class QkNorm { kNone, kWhole, kPerHead };
// How positions enter: a learned table added to the token embeddings (GPT-2's wpe), ALiBi's
// bias on the attention scores, RoPE's rotation of the queries and keys, or not at all (an MPT
// with learned_pos_emb off and neither ALiBi nor RoPE: the causal mask alone).
enum class PositionKind { kLearned, kAlibi, kRope, kNone };
// The MLP: GELU (tanh approximation or exact erf form) between two products, or SwiGLU with its
// gate and up products fused in one.
enum class MlpKind { kGeluTanh, kGeluErf, kSwiglu };
// How the weights start: GPT-2's normal(0.02) with the residual projections scaled by
// 1/√(2·n_layers); LLM Foundry's kaiming_normal_ (fan_in, ReLU gain: std √(2/fan_in), the
// residual projections divided by √(2·n_layers), the embeddings alike with fan_in d_model); or
// normal(init_std) everywhere, as Hugging Face initialises Llama.
enum class InitScheme { kGpt2, kKaimingNormal, kNormal };

// LoRA (PEFT's LoraConfig, `model.peft_config`): each adapted product W gains the branch
// scaling · B·A·dropout(x), with A (r, in) and B (out, r) trained and every weight of the base
// frozen. config/lora_config.h names the modules a family can adapt.
struct LoraConfig {
  int r = 0;             // the adapters' rank; 0: no LoRA
  float alpha = 8.0f;    // lora_alpha
  float dropout = 0.0f;  // lora_dropout, on each branch's input (its own mask per module)
  bool rslora = false;   // use_rslora: scaled by alpha/√r instead of alpha/r
  // PEFT's target_modules as the config gave them: names matched against the end of each
  // module's dotted path, or "all-linear".
  std::vector<std::string> target_modules;

  float scaling() const {
    return rslora ? alpha / std::sqrt(static_cast<float>(r)) : alpha / static_cast<float>(r);
  }
  bool operator==(const LoraConfig&) const = default;
};

// A mixture-of-experts MLP (LLM Foundry's ffn_type mb_moe and mb_dmoe, MegaBlocks' layers): a
// router (one product to a logit per expert, no bias) sends each token to the experts of its
// top_k logits, each expert an MLP of the model's kind (MlpKind, mlp_width) with its own weights
// and no biases, and the token's output is the sum of its experts' outputs weighted by their
// router probabilities (kernels/moe.h). The experts' load is balanced by an auxiliary loss,
// loss_weight · E/(k·T²) · Σ_e n_e · Σ_t p_te over a sequence's T tokens (n_e: the choices of
// expert e, p_te: the router's probabilities), averaged over the layers and added to the training
// loss once per target of the sequence, as the cross-entropy is. Routing, capacity and the balancing loss go a
// sequence at a time, so that no sequence's result depends on the microbatch it came in.
struct MoeConfig {
  int experts = 0;  // moe_num_experts; 0: a dense MLP
  int top_k = 1;    // moe_top_k
  // mb_moe's moe_capacity_factor: an expert takes at most ⌊factor · top_k · max_seq_len / experts⌋
  // of a sequence's choices in any pass (no limit where that is 0), the first in (position, rank)
  // order, and the rest skip it (the token's other choices still count); 0: dropless (mb_dmoe).
  float capacity_factor = 0.0f;
  float normalize_p = 0.0f;   // moe_normalize_expert_weights: the chosen weights divided by their p-norm; 0: not
  float loss_weight = 0.1f;   // moe_loss_weight

  bool operator==(const MoeConfig&) const = default;
};

struct ModelConfig {
  int n_layers = 0;
  int n_heads = 0;
  int d_model = 0;
  int vocab_size = 50257;
  int max_seq_len = 0;  // defaults to the top-level max_seq_len
  ModelFamily name = ModelFamily::kGpt2;

  int n_kv_heads = 0;  // key/value heads (grouped-query attention); 0: n_heads
  int head_dim = 0;    // a head's channels; 0: d_model / n_heads (Qwen3's and Mistral-Nemo's differ)
  NormKind norm = NormKind::kLayerNorm;
  bool norm_bias = true;    // LayerNorm's bias
  float norm_eps = 1e-5f;   // RMSNorm's eps (LayerNorm's is kernels/layernorm.h's)
  QkNorm qk_norm = QkNorm::kNone;  // the architecture's norm, on the queries and keys
  PositionKind positions = PositionKind::kLearned;
  RopeFrequencies rope{};  // theta and transformers' rope_scaling (core/rope.h)
  float alibi_bias_max = 8.0f;
  MlpKind mlp = MlpKind::kGeluTanh;
  int mlp_hidden = 0;       // the MLP's hidden width (SwiGLU: of each of gate and up); 0: 4·d_model
  bool linear_bias = true;  // biases on the attention and MLP products
  bool qkv_bias = false;    // biases on the query, key and value products alone (Qwen2)
  bool tied_embeddings = true;  // the LM head is the token embedding
  InitScheme init = InitScheme::kGpt2;
  float init_std = 0.02f;   // kNormal's
  // Dropout probabilities in training (kernels/dropout.h): of the embeddings' output, of the
  // attention probabilities, and of each block's two residual branches (the attention and MLP
  // projections' outputs). Evaluation and generation never drop.
  float emb_pdrop = 0.0f, attn_pdrop = 0.0f, resid_pdrop = 0.0f;
  // A sliding attention window (Mistral's sliding_window): a query sees only the last
  // sliding_window keys, itself included (AttentionHeads::window); 0: no window.
  int sliding_window = 0;
  LoraConfig lora{};  // r 0: the whole model trains
  MoeConfig moe{};    // experts 0: every block's MLP is dense
  // A tensor-parallel share's rows of the vocabulary (model/tensor_parallel.h): its token
  // embeddings and LM head hold token ids [vocab_first, vocab_first + vocab_size) of a vocabulary
  // of vocab_whole ids; vocab_whole 0: the model holds the whole vocabulary.
  int vocab_first = 0;
  int vocab_whole = 0;
  // A tensor-parallel share's rank among the tensor_ranks ranks that hold the model: besides its
  // share of every block and of the vocabulary, it holds its rows of the residual stream and the
  // norms' activations (sequence parallelism; Decoder's held rows). 1: the model is whole.
  int tensor_ranks = 1;
  int tensor_rank = 0;
  // An expert-parallel share's rank among the expert_ranks ranks that share a mixture of
  // experts (model/tensor_parallel.h: expert_share_config): it holds the weights of experts
  // [first_expert(), first_expert() + held_experts()) of moe.experts, the ones it runs; the router
  // still scores every expert. 1: the model holds every expert.
  int expert_ranks = 1;
  int expert_rank = 0;

  int kv_heads() const { return n_kv_heads ? n_kv_heads : n_heads; }
  int head_size() const { return head_dim ? head_dim : d_model / n_heads; }
  // The widths of the fused qkv product's parts: all the queries, the keys (or the values), all.
  int q_width() const { return n_heads * head_size(); }
  int kv_width() const { return kv_heads() * head_size(); }
  int qkv_width() const { return q_width() + 2 * kv_width(); }
  int mlp_width() const { return mlp_hidden ? mlp_hidden : 4 * d_model; }
  bool has_dropout() const { return emb_pdrop > 0 || attn_pdrop > 0 || resid_pdrop > 0; }
  bool has_lora() const { return lora.r > 0; }
  bool has_moe() const { return moe.experts > 0; }
  // A rank's share of a tensor-parallel model (model/tensor_parallel.h): its vocabulary slice, its
  // heads and units, its rows of the residual stream.
  bool tensor_share() const { return tensor_ranks > 1; }
  int whole_vocab() const { return tensor_share() ? vocab_whole : vocab_size; }
  bool expert_share() const { return expert_ranks > 1; }
  int held_experts() const { return moe.experts / expert_ranks; }
  int first_expert() const { return expert_rank * held_experts(); }
  // The model without its adapters: the base that LoRA freezes.
  ModelConfig base() const {
    ModelConfig b = *this;
    b.lora = {};
    return b;
  }

  bool operator==(const ModelConfig&) const = default;
};

}  // namespace anvil
