// The model's shape and family (the `model:` section of a config), apart from the rest of the
// training config so that the model module needs nothing else of it.
#pragma once
#include "config/choices.h"

namespace anvil {

struct ModelConfig {
  int n_layers = 0;
  int n_heads = 0;
  int d_model = 0;
  int vocab_size = 50257;
  int max_seq_len = 0;  // defaults to the top-level max_seq_len
  ModelFamily name = ModelFamily::kGpt2;

  bool operator==(const ModelConfig&) const = default;
};

}  // namespace anvil
