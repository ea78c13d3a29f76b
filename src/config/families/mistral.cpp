// Mistral (transformers' MistralForCausalLM): Llama's shape (llama_shaped.h) with a sliding
// attention window in its config (Mistral-7B-v0.1: 4096; v0.2 and later: none), which the
// attention kernels apply (kernels/attention.h).
#include "config/families/llama_shaped.h"

namespace anvil {
namespace {

class Mistral final : public LlamaShaped {
 public:
  Mistral()
      : LlamaShaped(ModelFamily::kMistral, "Mistral", "mistral", "MistralForCausalLM", /*rope_scaling=*/false,
                    /*sliding_window=*/true) {}
};

}  // namespace

const Family& mistral_family() {
  static const Mistral f;
  return f;
}

}  // namespace anvil
