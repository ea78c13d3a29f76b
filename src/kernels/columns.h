// A block of columns of row-major rows copied out to or in from its own rows: MPT's QK LayerNorm
// normalises the query and key columns of the fused qkv product as rows of their own.
#pragma once
#include "kernels/op.h"

namespace anvil {

// dst[n·ld_dst + c] = src[n·ld_src + c], for n < N, c < cols (cols <= both strides).
void copy_columns(KernelImpl impl, float* dst, long ld_dst, const float* src, long ld_src, int N, int cols);

ANVIL_OP_IMPLEMENTATIONS(copy_columns)

}  // namespace anvil
