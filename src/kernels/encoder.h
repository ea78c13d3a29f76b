// Token + position embedding. Dimension letters: B batch, T time, C channels, V vocabulary.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/op.h"
#include "kernels/positions.h"

namespace anvil {

// out (B,T,C) = wte[tokens[b,t]] + wpe[p(b,t)], p(b,t) = positions[b,t] (each token's position in
// its example, when several are packed into a sequence; kernels/positions.h), or t when positions
// is null. tokens (B,T) in [0, V); wte (V,C); wpe (>=T, C), or null for a model without learned
// positions (then only wte's rows, and dwpe is null too).
void encoder_forward(KernelImpl impl, float* out, const int32_t* tokens, const int32_t* positions, const float* wte,
                     const float* wpe, int B, int T, int C);
// dwte (V,C) += and dwpe (>=T, C) += the gradient of out, given dout (B,T,C). With tokens
// renumbered to the distinct tokens of the batch, dwte is that gradient in compact rows. A row of
// dwpe sums its tokens in (b, t) order.
void encoder_backward(KernelImpl impl, float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                      const int32_t* positions, int B, int T, int C);
// Row rows[r] of dst += row r of x, for r < n_rows (rows of row_len; rows distinct): a gradient
// held in compact rows added into the full table.
void add_rows(KernelImpl impl, float* dst, const float* x, const int32_t* rows, size_t n_rows, size_t row_len);

ANVIL_OP_IMPLEMENTATIONS(encoder_forward)
ANVIL_OP_IMPLEMENTATIONS(encoder_backward)
ANVIL_OP_IMPLEMENTATIONS(add_rows)

}  // namespace anvil
