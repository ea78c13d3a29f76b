// `anvil eval`: a checkpoint's (or a transformers directory's) loss and perplexity on the first samples of a dataset split, in
// the dataset's order, computed as training's evaluation computes it (the same fixed-point sums,
// so the same figure as a run's eval loss on the same samples).
#pragma once
#include <cstdint>
#include <string>

namespace anvil {

struct EvalOptions {
  std::string checkpoint;      // a checkpoint or run directory (its latest), or a transformers directory
  std::string data;            // an MDS dataset directory holding the split
  std::string split = "val";
  int64_t max_samples = 0;     // 0: the whole split
  int batch = 8;               // sequences per forward pass (does not change the figure)
};

struct EvalResult {
  double loss = 0;             // mean over the target tokens
  int64_t samples = 0, target_tokens = 0;
  int seq_len = 0;             // the model's max_seq_len
};

EvalResult evaluate_checkpoint(const EvalOptions& opt);

}  // namespace anvil
