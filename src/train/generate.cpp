// Sampling: the model runs over the last max_seq_len tokens for each new token (no KV cache yet).
#include "train/generate.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"
#include "data/chat_template.h"
#include "data/tokenizer.h"
#include "interop/hf_import.h"
#include "model/model.h"

namespace anvil {

std::string generate_text(const GenerateOptions& opt) {
  ANVIL_CHECK(opt.max_new_tokens >= 0, "--max-new-tokens must not be negative");
  ANVIL_CHECK(opt.temperature >= 0 && std::isfinite(opt.temperature), "--temperature must be >= 0");
  ANVIL_CHECK(opt.top_k >= 0, "--top-k must be >= 0");
  ANVIL_CHECK(opt.top_p > 0 && opt.top_p <= 1, "--top-p must be in (0, 1]");
  const ModelWeights loaded = load_model_weights(opt.checkpoint);
  const std::unique_ptr<Tokenizer> tok = load_tokenizer(opt.tokenizer.empty() ? loaded.tokenizer : opt.tokenizer);
  const ModelConfig& cfg = loaded.config;
  const int context = cfg.max_seq_len;
  const std::unique_ptr<Model> model = make_model(cfg, 1, context);
  std::copy(loaded.params.begin(), loaded.params.end(), model->params());
  if (cfg.has_lora()) model->set_base_weights(loaded.base);

  std::vector<int32_t> ids;
  if (opt.chat) {
    const ChatFormatter chat(chat_template_for(opt.chat_template, tok->files()), tok->files());
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    if (!opt.system.empty()) messages.push_back({{"role", "system"}, {"content", opt.system}});
    messages.push_back({{"role", "user"}, {"content", opt.prompt}});
    const std::string text = chat.render(messages, true);
    // A model's own template writes its special tokens (apply_chat_template adds none).
    ids = chat.writes_special_tokens() ? tok->encode(text) : tok->encode_prompt(text);
  } else {
    ids = tok->encode_prompt(opt.prompt);
  }
  for (int32_t id : ids)
    ANVIL_CHECK(id < cfg.vocab_size, "the prompt has token {} outside the model's vocabulary of {}", id, cfg.vocab_size);
  const size_t prompt_len = ids.size();
  Rng rng(opt.seed, 0);
  std::vector<int> order(cfg.vocab_size);
  std::vector<double> probs(cfg.vocab_size);
  for (int n = 0; n < opt.max_new_tokens; n++) {
    const int T = static_cast<int>(std::min<size_t>(ids.size(), context));
    model->forward(ids.data() + ids.size() - T, nullptr, 1, T, nullptr);
    const float* logits = model->logits() + static_cast<size_t>(T - 1) * cfg.vocab_size;
    int next;
    if (opt.temperature == 0) {
      next = static_cast<int>(std::max_element(logits, logits + cfg.vocab_size) - logits);
    } else {
      const int k = opt.top_k == 0 ? cfg.vocab_size : std::min(opt.top_k, cfg.vocab_size);
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
      double sum = 0;
      for (int i = 0; i < k; i++) sum += probs[i] = std::exp((logits[order[i]] - logits[order[0]]) / opt.temperature);
      // Nucleus (top-p): the fewest most likely tokens whose probability reaches top_p.
      int kept = k;
      if (opt.top_p < 1) {
        double cumulative = 0;
        for (kept = 0; kept < k && cumulative < opt.top_p * sum; kept++) cumulative += probs[kept];
        sum = cumulative;
      }
      double u = rng.uniform() * sum;
      next = order[kept - 1];
      for (int i = 0; i < kept; i++) {
        if ((u -= probs[i]) < 0) {
          next = order[i];
          break;
        }
      }
    }
    if (opt.chat && next == tok->eos_id()) break;
    ids.push_back(next);
  }
  std::vector<int32_t> generated(ids.begin() + static_cast<long>(prompt_len), ids.end());
  return (opt.chat ? "" : opt.prompt) + tok->decode(generated);
}

}  // namespace anvil
