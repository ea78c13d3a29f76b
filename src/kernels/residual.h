// Residual connection: an element-wise sum whose backward passes the gradient to both inputs.
#pragma once
#include "kernels/op.h"

namespace anvil {

// out (N) = a (N) + b (N). out may alias a or b.
void residual_forward(KernelImpl impl, float* out, const float* a, const float* b, long N);
// da (N) += dout; db (N) += dout.
void residual_backward(KernelImpl impl, float* da, float* db, const float* dout, long N);

ANVIL_OP_IMPLEMENTATIONS(residual_forward)
ANVIL_OP_IMPLEMENTATIONS(residual_backward)

}  // namespace anvil
