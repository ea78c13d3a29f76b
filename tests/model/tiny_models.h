// The tiny models the model tests share: 2 layers, 4 heads, d_model 32, a vocabulary of 97, as
// each family builds them (GPT-2's defaults; an MPT with ALiBi and no biases on its products; a
// Llama with RoPE, SwiGLU, 2 key/value heads and its own LM head).
#pragma once
#include "config/model_config.h"
#include "model/model.h"

namespace anvil::testing {

inline ModelConfig tiny_model(ModelFamily family, int max_seq_len) {
  ModelConfig c{2, 4, 32, 97, max_seq_len};
  c.name = family;
  if (family == ModelFamily::kMpt) {
    c.positions = PositionKind::kAlibi;
    c.linear_bias = false;
  }
  if (family == ModelFamily::kLlama) {
    c.norm = NormKind::kRmsNorm;
    c.positions = PositionKind::kRope;
    c.mlp = MlpKind::kSwiglu;
    c.n_kv_heads = 2;
    c.linear_bias = c.norm_bias = c.tied_embeddings = false;
  }
  return c;
}

// A model's own storage, its ops run by impl's kernels.
inline ModelStorage storage_on(KernelImpl impl) {
  ModelStorage s;
  s.kernels = impl;
  return s;
}

}  // namespace anvil::testing
