// The registry of families, and what is the same for all of them.
#include "config/families/family.h"

#include <fmt/format.h>

#include "config/map_reader.h"
#include "core/error.h"

namespace anvil {

// Each family's file defines its one instance.
const Family& gpt2_family();
const Family& mpt_family();
const Family& llama_family();
const Family& mistral_family();
const Family& mixtral_family();
const Family& qwen3_moe_family();
const Family& qwen2_family();
const Family& qwen3_family();

namespace {

const Family* const* all_families() {
  static const Family* const all[] = {&gpt2_family(),    &mpt_family(),   &llama_family(), &mistral_family(),
                                       &mixtral_family(), &qwen2_family(), &qwen3_family(),
                                       &qwen3_moe_family(), nullptr};
  return all;
}

}  // namespace

const Family& family(ModelFamily id) {
  for (const Family* const* f = all_families(); *f; f++)
    if ((*f)->id == id) return **f;
  ANVIL_FAIL("internal: no family registered for model.name {}", choice_name(id));
}

const Family* family_for_hf_model_type(const std::string& model_type) {
  for (const Family* const* f = all_families(); *f; f++)
    if (model_type == (*f)->hf_model_type) return *f;
  return nullptr;
}

std::string hf_model_types() {
  std::vector<std::string> types;
  for (const Family* const* f = all_families(); *f; f++) types.push_back((*f)->hf_model_type);
  return or_list(types);
}

void HfTensorList::whole(std::string name, std::string source, std::vector<int64_t> shape) {
  tensors.push_back({std::move(name), std::move(source), std::move(shape), 0, 0, false});
}

void HfTensorList::conv1d(std::string name, std::string source, int64_t in, int64_t out) {
  tensors.push_back({std::move(name), std::move(source), {in, out}, 0, 0, true});
}

void HfTensorList::rows(std::string name, std::string source, int64_t row0, int64_t n, std::vector<int64_t> shape) {
  tensors.push_back({std::move(name), std::move(source), std::move(shape), row0, n, false});
}

void Family::require(bool ok, const std::string& what) const {
  ANVIL_CHECK(ok, "a {} model cannot be written as transformers' {}: it has {}", title, hf_architecture, what);
}

void check_model_sizes(const ModelConfig& c, const MapReader* m) {
  const Family& f = family(c.name);
  // "where: model.key = value", for the key as the family spells it.
  auto key = [&](const char* k) {
    const std::string full = m ? m->full(k) : fmt::format("model.{}", k);
    return m ? fmt::format("{}: {}", m->source(k), full) : full;
  };
  auto positive = [&](int v, const char* k) { ANVIL_CHECK(v > 0, "{} = {} must be a positive integer", key(k), v); };
  positive(c.n_layers, "n_layers");
  positive(c.n_heads, "n_heads");
  positive(c.d_model, "d_model");
  positive(c.vocab_size, "vocab_size");
  ANVIL_CHECK(c.max_seq_len >= 0, "{} = {} must be a positive integer", key("max_seq_len"), c.max_seq_len);
  ANVIL_CHECK(c.head_dim || c.d_model % c.n_heads == 0, "{} = {} must be divisible by model.n_heads = {}",
              key("d_model"), c.d_model, c.n_heads);
  // A family without the key (GPT-2) has grouped-query heads only when code sets them.
  ANVIL_CHECK(c.n_kv_heads == 0 || (c.n_kv_heads > 0 && c.n_heads % c.n_kv_heads == 0), "{} = {} must be a "
              "positive divisor of model.n_heads = {}", key(*f.kv_heads_key ? f.kv_heads_key : "n_kv_heads"),
              c.n_kv_heads, c.n_heads);
  if (c.head_dim)
    ANVIL_CHECK(c.positions != PositionKind::kRope || c.head_dim % 2 == 0, "{} = {} is odd; RoPE rotates pairs of "
                "dimensions", key("head_dim"), c.head_dim);
  else
    ANVIL_CHECK(c.positions != PositionKind::kRope || c.head_size() % 2 == 0, "{} = {} over model.n_heads = {} "
                "gives an odd head size ({}); RoPE rotates pairs of dimensions", key("d_model"), c.d_model, c.n_heads,
                c.head_size());
  ANVIL_CHECK(c.mlp_width() > 0, "{} = {} must be positive", key(*f.mlp_width_key ? f.mlp_width_key : "d_model"),
              c.mlp_width());
}

}  // namespace anvil
