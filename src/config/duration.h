// Time strings as Composer writes them: "100ba" (batches), "2ep" (epochs), "5000sp" (samples),
// "3e6tok" (tokens), "0.1dur" (fraction of max_duration). A bare integer means epochs.
#pragma once
#include <cstdint>
#include <string>

namespace anvil {

struct Duration {
  enum class Unit { kBatch, kEpoch, kSample, kToken, kDur };
  double value = 0;
  Unit unit = Unit::kBatch;
  std::string text;  // as written, for the resolved config and messages
};

// key names the config key in error messages.
Duration parse_duration(const std::string& text, const std::string& key);

// Converts to optimizer steps given the run's shape. total_batches is needed for kDur.
int64_t duration_to_batches(const Duration& d, int64_t batches_per_epoch, int64_t global_batch,
                            int64_t seq_len, int64_t total_batches, const std::string& key);

}  // namespace anvil
