// Rounding fp32 values to a 16-bit compute dtype, kept in fp32: what a 16-bit tensor holds, for
// the inputs and outputs of matrix products under amp_bf16 / amp_fp16 (docs/precision.md).
#pragma once
#include "core/dtype.h"
#include "kernels/op.h"

namespace anvil {

// x (N) = the nearest value of dtype d (ties to even), in place: bf16 keeps 8 significant bits;
// fp16 keeps 11, flushes |x| >= 65520 to infinity and rounds below 2^-14 to multiples of 2^-24.
// NaN stays NaN. kFp32 leaves x alone.
void round_to_dtype(float* x, long N, ComputeDtype d);

ANVIL_OP_IMPLEMENTATIONS(round_to_dtype)

}  // namespace anvil
