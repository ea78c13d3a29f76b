// Mistral (transformers' MistralForCausalLM): Llama's shape (llama_shaped.h) with a sliding
// attention window in its config (Mistral-7B-v0.1: 4096; v0.2 and later: none), which the
// attention kernels apply (kernels/attention.h).
#include <yaml-cpp/yaml.h>

#include "config/families/hf_fields.h"
#include "config/families/llama_shaped.h"
#include "config/map_reader.h"

namespace anvil {
namespace {

class Mistral final : public LlamaShaped {
 public:
  Mistral() : LlamaShaped(ModelFamily::kMistral, "Mistral", "mistral", "MistralForCausalLM", /*rope_scaling=*/false) {}

 protected:
  void read_own_keys(MapReader& m, ModelConfig& c) const override {
    m.get("sliding_window", c.sliding_window);
    ANVIL_CHECK(c.sliding_window >= 0, "{}: {} = {} must be a positive number of keys (or null: none)",
                m.source("sliding_window"), m.full("sliding_window"), c.sliding_window);
  }
  void write_own_keys(YAML::Emitter& e, const ModelConfig& c) const override {
    if (c.sliding_window) e << YAML::Key << "sliding_window" << YAML::Value << c.sliding_window;
  }
  void own_keys_from_hf(HfFields& f) const override { f.copy("sliding_window", "sliding_window"); }
  void own_hf_config(const ModelConfig& c, nlohmann::ordered_json& j) const override {
    j["sliding_window"] = c.sliding_window ? nlohmann::ordered_json(c.sliding_window) : nlohmann::ordered_json();
  }
};

}  // namespace

const Family& mistral_family() {
  static const Mistral f;
  return f;
}

}  // namespace anvil
