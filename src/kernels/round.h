// Rounding fp32 values to a 16-bit compute dtype, kept in fp32: what a 16-bit tensor holds, for
// the inputs and outputs of matrix products under amp_bf16 / amp_fp16 (docs/precision.md).
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "kernels/op.h"

namespace anvil {

// x (N) = the nearest value of dtype d (ties to even), in place: bf16 keeps 8 significant bits;
// fp16 keeps 11, flushes |x| >= 65520 to infinity and rounds below 2^-14 to multiples of 2^-24.
// NaN stays NaN. kFp32 leaves x alone.
void round_to_dtype(KernelImpl impl, float* x, long N, ComputeDtype d);
// out (N) = in (N), bf16 values (their 16 bits) as fp32: exact. Weights held in bf16 (a LoRA
// model's frozen base under amp_bf16) are widened so before a product reads them.
void widen_bf16(KernelImpl impl, float* out, const uint16_t* in, long N);

ANVIL_OP_IMPLEMENTATIONS(round_to_dtype)
ANVIL_OP_IMPLEMENTATIONS(widen_bf16)

}  // namespace anvil
