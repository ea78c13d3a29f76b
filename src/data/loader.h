// The training data loader: each step, this rank's contiguous block of the global batch, in the
// order sample_order.h defines, decoded by a pool of worker threads ahead of use while a download
// pool fetches the shards further ahead. The batches are the same for any number of workers.
//
// A sample of L tokens gives inputs tokens[0, T) and targets tokens[1, T+1); when L == T the last
// target is ignored (LLM Foundry's packing). A sample shorter than T is padded, its positions past
// the end carrying no loss (LLM Foundry's collator). A fine-tuning sample (turns, data/finetuning.h)
// is its turns back to back, cut to T tokens, with loss only where the target policy puts it.
//
// Packing (fine-tuning, packing_ratio R > 1): a step takes round(R · global batch) examples in the
// order and packs them into the global batch's sequences, first fit in order of decreasing
// length (ties in order of the step), each sequence's examples then in order of the step, each
// token given its position in its own example (kernels/positions.h) and each example's last
// target ignored, so that no example sees another. An example that fits in no sequence is not
// trained on, and counted. The packing is a function of the global step's examples alone, so it
// is the same for any world size, microbatch size or worker count.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "data/finetuning.h"
#include "data/sample_order.h"
#include "data/streaming.h"

namespace anvil {

// Where a loader stands, and every input of its order, so that a resumed run can check it
// consumes exactly the samples the interrupted one would have.
struct DataState {
  int64_t epoch = 0;
  int64_t sample_in_epoch = 0;  // global samples of this epoch already consumed
  int64_t global_batch = 0;
  bool shuffle = true;
  std::string algo;
  uint64_t seed = 0;
  int64_t block_size = 0, canonical_nodes = 0, epoch_size = 0;
  std::vector<std::string> stream_names;
  std::vector<double> stream_proportions;
  std::vector<int64_t> stream_samples;
  std::string fingerprint;  // order_fingerprint(): shard sizes included

  std::string to_json() const;
  static DataState from_json(const std::string& text, const std::string& where);
};

// How fine-tuning samples become examples: which tokens carry loss, and the EOS that closes the
// last response.
struct FinetuningExamples {
  TargetPolicy targets;
  int32_t eos_id = -1;
};

// Sample `id` as one training example: inputs (seq_len) and targets (seq_len), as described
// above. vocab_size > 0 checks every token id against it. A dataset of turns needs `finetuning`,
// one of token arrays must not have it.
void load_example(StreamingDataset& data, int64_t id, int seq_len, int vocab_size,
                  const std::optional<FinetuningExamples>& finetuning, int32_t* inputs, int32_t* targets);

struct LoaderOptions {
  int64_t global_batch = 0;
  int rank = 0, world = 1;
  int seq_len = 0;
  int num_workers = 0;       // decode threads; 0 decodes in the caller's thread
  int64_t predownload = -1;  // samples of this rank to download ahead; -1: 8 batches
  int vocab_size = 0;        // > 0: token ids outside [0, vocab_size) are an error
  std::optional<FinetuningExamples> finetuning = std::nullopt;  // for a dataset of turns
  double packing_ratio = 1;  // > 1: packed fine-tuning examples, as described above
};

// What packing did with the examples of the steps next() has returned.
struct PackingStats {
  int64_t examples = 0;  // packed into sequences
  int64_t dropped = 0;   // fitting in no sequence of their step
  int64_t sequences = 0;
};

class TokenLoader {
 public:
  TokenLoader(StreamingDataset& data, OrderSpec spec, LoaderOptions opt);
  ~TokenLoader();
  TokenLoader(const TokenLoader&) = delete;
  TokenLoader& operator=(const TokenLoader&) = delete;

  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int64_t rank_batch() const { return rank_batch_; }
  // The next step's block: inputs and targets (rank_batch × seq_len); ids (rank_batch), if given,
  // receives the global sample ids (packed: each sequence's first example's). When packing,
  // positions (rank_batch × seq_len) receives each token's position in its example.
  void next(int32_t* inputs, int32_t* targets, int64_t* ids = nullptr, int32_t* positions = nullptr);
  bool packing() const { return opt_.packing_ratio > 1; }
  // Samples the order hands out per step: the global batch, or the examples packed into it.
  int64_t samples_per_step() const { return samples_per_step_; }
  PackingStats packing_stats() const { return packing_stats_; }
  // The position after the batches next() has returned.
  DataState state() const;
  // Continues from a saved state. Errors name the input of the order that differs.
  void restore(const DataState& saved);

 private:
  struct Batch {
    int64_t step = -1;
    bool ready = false;
    std::string error;
    std::vector<int32_t> inputs, targets, positions;
    std::vector<int64_t> ids;
    PackingStats packing;
  };
  void fill(int64_t step, Batch& b);
  void fill_packed(int64_t step, Batch& b);
  std::shared_ptr<const std::vector<int64_t>> order_for(int64_t epoch);
  void start_workers();
  void stop_workers();
  void worker_loop();

  StreamingDataset& data_;
  OrderSpec spec_;
  LoaderOptions opt_;
  int64_t steps_per_epoch_ = 0, rank_batch_ = 0, lookahead_ = 0, samples_per_step_ = 0;
  PackingStats packing_stats_;
  int64_t start_epoch_ = 0, start_step_ = 0;  // where step 0 of this loader is
  int64_t consumed_ = 0;                      // steps returned by next()

  std::mutex order_mu_;
  std::map<int64_t, std::shared_ptr<const std::vector<int64_t>>> orders_;  // the newest two epochs

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Batch> slots_;
  int64_t claimed_ = 0;  // next step a worker will build
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace anvil
