// Blocks of columns of row-major rows copied out to or in from rows of their own: the QK norms
// normalise the query and key columns of the fused qkv product as rows of their own (MPT's over
// all the heads' columns at once, Qwen3's head by head).
#pragma once
#include "kernels/op.h"

namespace anvil {

// dst[p·dst_part + n·ld_dst + c] = src[p·src_part + n·ld_src + c], for p < parts, n < N, c < cols
// (cols <= both strides): `parts` blocks of N rows, the parts' places dst_part and src_part apart.
// One launch on a GPU however many parts (Qwen3's heads are that many blocks of columns).
void copy_columns(KernelImpl impl, float* dst, long ld_dst, long dst_part, const float* src, long ld_src, long src_part,
                  int N, int cols, int parts);

ANVIL_OP_IMPLEMENTATIONS(copy_columns)

}  // namespace anvil
