// Dropout whose mask is a pure function of where it applies: element i of sequence s at a site
// (the run's seed, the step, the layer, which dropout of the layer) is kept or dropped by a hash of
// those numbers, not by a generator's state. The mask is therefore the same bits on every backend,
// for any world size, microbatch size or thread count, and the backward pass (or a recomputation
// under activation checkpointing) regenerates it instead of storing it.
#pragma once
#include <cstdint>

#include "kernels/op.h"

namespace anvil {

// The sites of a layer, and the embedding's. LoRA's branches each have their own: kLoraInput plus
// the adapter's index in its block (lora_dropout_kind).
enum class DropoutKind : int { kEmbedding = 0, kAttention = 1, kAttentionOutput = 2, kMlpOutput = 3, kLoraInput = 4 };
inline DropoutKind lora_dropout_kind(int adapter) {
  return static_cast<DropoutKind>(static_cast<int>(DropoutKind::kLoraInput) + adapter);
}

// One dropout application: its key (dropout_key), the global index of the first sequence it
// covers in the step's batch, and the probability of dropping (0: the identity).
struct DropoutSite {
  uint64_t key = 0;
  int64_t first_sample = 0;
  float p = 0.0f;

  ANVIL_HOST_DEVICE bool active() const { return p > 0.0f; }
  // A kept element's factor, 1/(1-p): one float division, the same on every backend.
  ANVIL_HOST_DEVICE float scale() const { return 1.0f / (1.0f - p); }
  // An element is kept when the hash's top 24 bits reach p·2^24 (exact: p·2^24 is a float product
  // by a power of two).
  ANVIL_HOST_DEVICE uint32_t threshold() const { return static_cast<uint32_t>(p * 16777216.0f); }
};

// SplitMix64's output function, a bijective 64-bit mixer. Applied to a counter stepped by the
// golden gamma (below) it is SplitMix64 itself, a generator that passes BigCrush.
ANVIL_HOST_DEVICE inline uint64_t dropout_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

constexpr uint64_t kDropoutGamma = 0x9e3779b97f4a7c15ULL;  // SplitMix64's increment

// The key of one site: seed, step, layer (0 for the embedding) and kind, each mixed in turn.
inline uint64_t dropout_key(uint64_t seed, int64_t step, int layer, DropoutKind kind) {
  uint64_t k = dropout_mix(seed + kDropoutGamma);
  k = dropout_mix(k + static_cast<uint64_t>(step) * kDropoutGamma);
  k = dropout_mix(k + static_cast<uint64_t>(layer) * kDropoutGamma);
  return dropout_mix(k + static_cast<uint64_t>(kind) * kDropoutGamma);
}

// A sequence's stream within a site, then element i of it: kept or not.
ANVIL_HOST_DEVICE inline uint64_t dropout_stream(uint64_t key, int64_t sample) {
  return dropout_mix(key + static_cast<uint64_t>(sample) * kDropoutGamma);
}
ANVIL_HOST_DEVICE inline bool dropout_keep(uint64_t stream, uint64_t i, uint32_t threshold) {
  return static_cast<uint32_t>(dropout_mix(stream + i * kDropoutGamma) >> 40) >= threshold;
}

// x (B, n): element i of sequence b scaled by 1/(1-p) if kept under (site, first_sample + b),
// zeroed if dropped; out may alias x. The same op is its own backward, on the gradient.
void dropout_apply(KernelImpl impl, float* out, const float* x, int B, long n, DropoutSite site);

ANVIL_OP_IMPLEMENTATIONS(dropout_apply)

}  // namespace anvil
