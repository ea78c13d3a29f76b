// Evaluation as training does it (fixed-point loss sums), on a split read in its own order.
#include "train/eval.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include "core/error.h"
#include "data/loader.h"
#include "data/streaming.h"
#include "interop/hf_import.h"
#include "model/model.h"
#include "train/data_pipeline.h"
#include "train/step.h"

namespace anvil {

EvalResult evaluate_checkpoint(const EvalOptions& opt) {
  ANVIL_CHECK(opt.max_samples >= 0, "--max-samples must not be negative");
  ANVIL_CHECK(opt.batch > 0, "--batch must be positive");
  const ModelWeights loaded = load_model_weights(opt.checkpoint);
  const ModelConfig& cfg = loaded.config;
  const int T = cfg.max_seq_len;
  StreamingDataset data({{"default", "", opt.data, opt.split, 1.0}}, StreamingOptions{});
  check_data_tokenizer(data, resolve_tokenizer(loaded.tokenizer), cfg.vocab_size);
  const int64_t samples = opt.max_samples > 0 ? std::min(opt.max_samples, data.num_samples()) : data.num_samples();
  ANVIL_CHECK(samples > 0, "'{}' split '{}' holds no samples", opt.data, opt.split);
  const int B = static_cast<int>(std::min<int64_t>(opt.batch, samples));
  const std::unique_ptr<Model> model = make_model(cfg, B, T);
  std::copy(loaded.params.begin(), loaded.params.end(), model->params());
  if (cfg.has_lora()) model->set_base_weights(loaded.base);

  // Fine-tuning examples are scored as training scores them by default: the last response only.
  std::optional<FinetuningExamples> finetuning;
  if (data.kind() == MdsSampleKind::kTurns)
    finetuning = FinetuningExamples{TargetPolicy{}, load_tokenizer(loaded.tokenizer)->eos_id()};
  std::vector<int32_t> tokens(static_cast<size_t>(B) * T), targets(tokens.size());
  int64_t sum = 0, count = 0;
  for (int64_t s0 = 0; s0 < samples; s0 += B) {
    const int b = static_cast<int>(std::min<int64_t>(B, samples - s0));
    for (int k = 0; k < b; k++)
      load_example(data, s0 + k, T, cfg.vocab_size, finetuning, tokens.data() + static_cast<size_t>(k) * T,
                   targets.data() + static_cast<size_t>(k) * T);
    int64_t n = 0;
    model->forward(tokens.data(), targets.data(), b, T, &n);
    sum += fixed_point_loss_sum(model->losses(), b, T);
    count += n;
  }
  ANVIL_CHECK(count > 0, "the first {} samples of '{}' have no target tokens", samples, opt.data);
  EvalResult r;
  r.loss = fixed_point_loss_value(sum) / static_cast<double>(count);
  r.samples = samples;
  r.target_tokens = count;
  r.seq_len = T;
  return r;
}

}  // namespace anvil
