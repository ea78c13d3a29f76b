// The family's rows, and what every family's transformers model shares: an untied LM head is
// lm_head.weight, and config.json carries the tokenizer's ids and the stored dtype.
#include "interop/hf_format.h"

#include <fmt/format.h>

namespace anvil {

std::string hf_block_prefix(const ModelConfig& c, int l) {
  return fmt::format(fmt::runtime(family(c.name).hf_block_prefix), l);
}

std::vector<HfTensor> hf_tensors(const ModelConfig& c) {
  const Family& f = family(c.name);
  f.check_hf(c);
  HfTensorList t;
  f.hf_tensors(c, t);
  if (!c.tied_embeddings) t.whole("lm_head.weight", "lm_head", {c.vocab_size, c.d_model});
  return t.tensors;
}

nlohmann::ordered_json hf_config(const ModelConfig& c, const std::string& torch_dtype, int bos, int eos) {
  const Family& f = family(c.name);
  f.check_hf(c);
  nlohmann::ordered_json j = f.hf_config(c);
  j["bos_token_id"] = bos;
  j["eos_token_id"] = eos;
  j["torch_dtype"] = torch_dtype;
  j["use_cache"] = true;
  return j;
}

}  // namespace anvil
