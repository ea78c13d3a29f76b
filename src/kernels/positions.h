// Where each token stands in its example. A sequence may hold several fine-tuning examples packed
// back to back; each token's position then counts from the start of its own example, so that
// position embeddings (learned or RoPE) and attention see every example as if it were alone:
// query i attends to keys i - p(b,i) .. i. The ops take positions as (B,T) int32 in op memory, or
// null for the usual p(b,t) = t.
#pragma once
#include <cstdint>

#include "kernels/op.h"

namespace anvil {

ANVIL_HOST_DEVICE inline int position_of(const int32_t* positions, int b, int T, int t) {
  return positions ? positions[static_cast<long>(b) * T + t] : t;
}

}  // namespace anvil
