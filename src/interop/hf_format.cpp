// The three families' transformers formats. Names and shapes follow transformers' modeling files
// (modeling_gpt2.py, modeling_llama.py, modeling_mpt.py) as save_pretrained writes them: a tied
// LM head is not stored, GPT-2's Conv1D weights are (input, output), the others nn.Linear's
// (output, input). anvil fuses q/k/v rows in qkvw and gate/up rows in fcw; Llama's are cut out
// of them by rows. RoPE needs no permutation: anvil rotates in transformers' rotate-half order.
#include "interop/hf_format.h"

#include <string>

#include <fmt/format.h>

#include "core/dtype.h"
#include "core/error.h"
#include "model/model.h"

namespace anvil {
namespace {

void require(bool ok, const ModelConfig& c, const char* arch, const std::string& what) {
  ANVIL_CHECK(ok, "a {} model cannot be written as transformers' {}: it has {}", model_family_title(c), arch, what);
}

// GPT2LMHeadModel as anvil's GPT-2 is: learned positions, LayerNorm with bias, tanh GELU
// (gelu_new), biases on every product, one key/value head per query head.
void check_gpt2(const ModelConfig& c) {
  const char* arch = "GPT2LMHeadModel";
  require(c.positions == PositionKind::kLearned, c, arch, "no learned position table (GPT-2 needs wpe)");
  require(c.norm == NormKind::kLayerNorm && c.norm_bias, c, arch, "norms other than LayerNorm with bias");
  require(c.mlp == MlpKind::kGeluTanh, c, arch, "an MLP other than tanh GELU (gelu_new)");
  require(c.linear_bias, c, arch, "no biases on its products");
  require(c.kv_heads() == c.n_heads, c, arch, "grouped-query attention (n_kv_heads)");
}

// LlamaForCausalLM as anvil's Llama is: RMSNorm, RoPE, SwiGLU, no biases.
void check_llama(const ModelConfig& c) {
  const char* arch = "LlamaForCausalLM";
  require(c.norm == NormKind::kRmsNorm, c, arch, "LayerNorm instead of RMSNorm");
  require(c.positions == PositionKind::kRope, c, arch, "positions other than RoPE");
  require(c.mlp == MlpKind::kSwiglu, c, arch, "a GELU MLP instead of SwiGLU");
  require(!c.linear_bias, c, arch, "biases on its products");
}

// transformers' MptForCausalLM: ALiBi, LayerNorm without bias, no biases, exact GELU of 4·d_model,
// one key/value head per query head, the head tied to the embedding.
void check_mpt(const ModelConfig& c) {
  const char* arch = "MptForCausalLM";
  require(c.positions == PositionKind::kAlibi, c, arch, "positions other than ALiBi (attn_config.alibi: true)");
  require(c.norm == NormKind::kLayerNorm, c, arch, "RMSNorm (transformers' MPT has LayerNorm)");
  require(!c.norm_bias && !c.linear_bias, c, arch, "biases (transformers' MPT is no_bias: true)");
  require(c.mlp == MlpKind::kGeluErf && c.mlp_width() == 4 * c.d_model, c, arch,
          "an MLP other than exact GELU with expansion_ratio 4");
  require(c.kv_heads() == c.n_heads, c, arch, "grouped-query attention (attn_config.kv_n_heads)");
  require(c.tied_embeddings, c, arch, "its own LM head (tie_word_embeddings: false)");
  require(!c.qk_norm, c, arch, "QK LayerNorm (attn_config.qk_ln: transformers' MPT has none)");
}


}  // namespace

std::string hf_block_prefix(const ModelConfig& c, int l) {
  switch (c.name) {
    case ModelFamily::kGpt2:
      return fmt::format("transformer.h.{}.", l);
    case ModelFamily::kLlama:
      return fmt::format("model.layers.{}.", l);
    case ModelFamily::kMpt:
      return fmt::format("transformer.blocks.{}.", l);
  }
  return "";
}

std::vector<HfTensor> hf_tensors(const ModelConfig& c) {
  const int64_t C = c.d_model, V = c.vocab_size, F = c.mlp_width(), P = c.max_seq_len;
  const int64_t q = static_cast<int64_t>(c.n_heads) * c.head_size(), kv = static_cast<int64_t>(c.kv_heads()) * c.head_size();
  std::vector<HfTensor> t;
  // A whole anvil tensor as it is, or transposed.
  auto whole = [&](std::string name, std::string source, std::vector<int64_t> shape) {
    t.push_back({std::move(name), std::move(source), std::move(shape), 0, 0, false});
  };
  auto conv1d = [&](std::string name, std::string source, int64_t in, int64_t out) {
    t.push_back({std::move(name), std::move(source), {in, out}, 0, 0, true});
  };
  auto rows = [&](std::string name, std::string source, int64_t row0, int64_t n, std::vector<int64_t> shape) {
    t.push_back({std::move(name), std::move(source), std::move(shape), row0, n, false});
  };
  switch (c.name) {
    case ModelFamily::kGpt2: {
      check_gpt2(c);
      whole("transformer.wte.weight", "wte", {V, C});
      whole("transformer.wpe.weight", "wpe", {P, C});
      for (int l = 0; l < c.n_layers; l++) {
        const std::string h = hf_block_prefix(c, l), a = fmt::format("h.{}.", l);
        whole(h + "ln_1.weight", a + "ln1w", {C});
        whole(h + "ln_1.bias", a + "ln1b", {C});
        conv1d(h + "attn.c_attn.weight", a + "qkvw", C, 3 * C);
        whole(h + "attn.c_attn.bias", a + "qkvb", {3 * C});
        conv1d(h + "attn.c_proj.weight", a + "attprojw", C, C);
        whole(h + "attn.c_proj.bias", a + "attprojb", {C});
        whole(h + "ln_2.weight", a + "ln2w", {C});
        whole(h + "ln_2.bias", a + "ln2b", {C});
        conv1d(h + "mlp.c_fc.weight", a + "fcw", C, F);
        whole(h + "mlp.c_fc.bias", a + "fcb", {F});
        conv1d(h + "mlp.c_proj.weight", a + "fcprojw", F, C);
        whole(h + "mlp.c_proj.bias", a + "fcprojb", {C});
      }
      whole("transformer.ln_f.weight", "lnfw", {C});
      whole("transformer.ln_f.bias", "lnfb", {C});
      break;
    }
    case ModelFamily::kLlama: {
      check_llama(c);
      whole("model.embed_tokens.weight", "wte", {V, C});
      for (int l = 0; l < c.n_layers; l++) {
        const std::string h = hf_block_prefix(c, l), a = fmt::format("h.{}.", l);
        whole(h + "input_layernorm.weight", a + "ln1w", {C});
        rows(h + "self_attn.q_proj.weight", a + "qkvw", 0, q, {q, C});
        rows(h + "self_attn.k_proj.weight", a + "qkvw", q, kv, {kv, C});
        rows(h + "self_attn.v_proj.weight", a + "qkvw", q + kv, kv, {kv, C});
        whole(h + "self_attn.o_proj.weight", a + "attprojw", {C, C});
        whole(h + "post_attention_layernorm.weight", a + "ln2w", {C});
        rows(h + "mlp.gate_proj.weight", a + "fcw", 0, F, {F, C});
        rows(h + "mlp.up_proj.weight", a + "fcw", F, F, {F, C});
        whole(h + "mlp.down_proj.weight", a + "fcprojw", {C, F});
      }
      whole("model.norm.weight", "lnfw", {C});
      break;
    }
    case ModelFamily::kMpt: {
      check_mpt(c);
      whole("transformer.wte.weight", "wte", {V, C});
      for (int l = 0; l < c.n_layers; l++) {
        const std::string h = hf_block_prefix(c, l), a = fmt::format("h.{}.", l);
        whole(h + "norm_1.weight", a + "ln1w", {C});
        whole(h + "attn.Wqkv.weight", a + "qkvw", {3 * C, C});
        whole(h + "attn.out_proj.weight", a + "attprojw", {C, C});
        whole(h + "norm_2.weight", a + "ln2w", {C});
        whole(h + "ffn.up_proj.weight", a + "fcw", {F, C});
        whole(h + "ffn.down_proj.weight", a + "fcprojw", {C, F});
      }
      whole("transformer.norm_f.weight", "lnfw", {C});
      break;
    }
  }
  if (!c.tied_embeddings) whole("lm_head.weight", "lm_head", {V, C});
  return t;
}

nlohmann::ordered_json hf_config(const ModelConfig& c, const std::string& torch_dtype, int bos, int eos) {
  nlohmann::ordered_json j;
  switch (c.name) {
    case ModelFamily::kGpt2:
      check_gpt2(c);
      j = {{"architectures", {"GPT2LMHeadModel"}},
           {"model_type", "gpt2"},
           {"vocab_size", c.vocab_size},
           {"n_positions", c.max_seq_len},
           {"n_ctx", c.max_seq_len},
           {"n_embd", c.d_model},
           {"n_layer", c.n_layers},
           {"n_head", c.n_heads},
           {"n_inner", c.mlp_width()},
           {"activation_function", "gelu_new"},
           {"resid_pdrop", float_as_written(c.resid_pdrop)},
           {"embd_pdrop", float_as_written(c.emb_pdrop)},
           {"attn_pdrop", float_as_written(c.attn_pdrop)},
           {"layer_norm_epsilon", 1e-5},
           {"initializer_range", float_as_written(c.init_std)},
           {"scale_attn_weights", true},
           {"tie_word_embeddings", c.tied_embeddings}};
      break;
    case ModelFamily::kLlama:
      check_llama(c);
      j = {{"architectures", {"LlamaForCausalLM"}},
           {"model_type", "llama"},
           {"vocab_size", c.vocab_size},
           {"hidden_size", c.d_model},
           {"intermediate_size", c.mlp_width()},
           {"num_hidden_layers", c.n_layers},
           {"num_attention_heads", c.n_heads},
           {"num_key_value_heads", c.kv_heads()},
           {"head_dim", c.head_size()},
           {"hidden_act", "silu"},
           {"max_position_embeddings", c.max_seq_len},
           {"rms_norm_eps", float_as_written(c.norm_eps)},
           {"rope_theta", float_as_written(c.rope_theta)},
           {"rope_scaling", nullptr},
           {"attention_bias", false},
           {"mlp_bias", false},
           {"attention_dropout", float_as_written(c.attn_pdrop)},
           {"pretraining_tp", 1},
           {"initializer_range", float_as_written(c.init_std)},
           {"tie_word_embeddings", c.tied_embeddings}};
      break;
    case ModelFamily::kMpt:
      check_mpt(c);
      j = {{"architectures", {"MPTForCausalLM"}},
           {"model_type", "mpt"},
           {"vocab_size", c.vocab_size},
           {"d_model", c.d_model},
           {"n_heads", c.n_heads},
           {"n_layers", c.n_layers},
           {"expansion_ratio", 4},
           {"max_seq_len", c.max_seq_len},
           {"no_bias", true},
           {"norm_type", "low_precision_layernorm"},
           {"layer_norm_epsilon", 1e-5},
           {"learned_pos_emb", false},
           {"resid_pdrop", float_as_written(c.resid_pdrop)},
           {"emb_pdrop", float_as_written(c.emb_pdrop)},
           {"embedding_fraction", 1.0},
           {"logit_scale", nullptr},
           {"attn_config",
            {{"attn_type", "multihead_attention"},
             {"attn_impl", "torch"},
             {"attn_pdrop", float_as_written(c.attn_pdrop)},
             {"alibi", true},
             {"alibi_bias_max", static_cast<int>(c.alibi_bias_max)},
             {"clip_qkv", nullptr},
             {"qk_ln", false},
             {"softmax_scale", nullptr},
             {"prefix_lm", false},
             {"attn_uses_sequence_id", false}}},
           {"init_device", "cpu"},
           {"initializer_range", float_as_written(c.init_std)},
           {"tie_word_embeddings", true}};
      ANVIL_CHECK(c.alibi_bias_max == static_cast<float>(static_cast<int>(c.alibi_bias_max)),
                  "transformers' MPT takes an integer attn_config.alibi_bias_max; the model has {}", c.alibi_bias_max);
      break;
  }
  j["bos_token_id"] = bos;
  j["eos_token_id"] = eos;
  j["torch_dtype"] = torch_dtype;
  j["use_cache"] = true;
  return j;
}

}  // namespace anvil
