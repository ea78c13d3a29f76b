// The sample order: which global samples each step of each epoch consumes, as a pure function of
// (the datasets' shard sizes, stream proportions, seed, epoch, shuffle algorithm, block size,
// canonical node count). It never depends on the world size, the rank, the microbatch size or the
// number of loader workers: step t of an epoch consumes positions [t·GB, (t+1)·GB) of the epoch's
// sequence, and rank r of W takes the contiguous block [t·GB + r·GB/W, t·GB + (r+1)·GB/W).
// docs/data.md gives the algorithms step by step.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace anvil {

struct OrderStream {
  std::vector<int64_t> shard_samples;  // samples per shard, in index order
  double proportion = 1.0;             // relative weight among streams
};

struct OrderSpec {
  std::vector<OrderStream> streams;
  bool shuffle = true;
  std::string algo = "py1e";        // none | py1s | py1e
  uint64_t seed = 9176;
  int64_t block_size = -1;          // py1e's window; -1: max(4,000,000 / canonical nodes, 2^18)
  int64_t canonical_nodes = 1;
  int64_t epoch_size = -1;          // samples per epoch; -1: the streams' total sample count
};

// Checks the spec (algorithm name, proportions, node count); errors say what is expected.
void validate_order_spec(const OrderSpec& spec);

int64_t total_samples(const OrderSpec& spec);  // over all streams, each once
int64_t epoch_samples(const OrderSpec& spec);  // what one epoch draws (epoch_size or the total)
int64_t resolved_block_size(const OrderSpec& spec);

// Global sample ids (stream offset + sample within the stream) in the order epoch `epoch`
// consumes them; epoch_samples(spec) entries.
std::vector<int64_t> epoch_order(const OrderSpec& spec, int64_t epoch);

// A digest of everything the order depends on except the epoch: resuming with a different one is
// an error.
std::string order_fingerprint(const OrderSpec& spec);

}  // namespace anvil
