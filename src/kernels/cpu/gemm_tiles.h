// The bf16 GEMM on tile instructions (AMX's TDPBF16PS), as templates over the tile operations:
// gemm_kernels_amx.cpp gives them the instructions, and test_gemm an emulation of them as the
// instruction set reference describes them, so that the packing and the loops are checked on
// any CPU.
//
// A 32 × 32 tile of C is four 16 × 16 fp32 accumulator tiles, fed by two tiles of A (16 rows ×
// 16 pairs of k) and two of B (16 pairs of k × 16 columns). TDPBF16PS does not compute gemm.h's
// pair chain: for each element it sums a chunk's 16 even products and its 16 odd products in two
// separate chains from zero, then adds the two sums and adds that to the accumulator (gemm.h,
// GemmPrecision, states it as the tiles' own order). A k block's pairs past its last whole 16
// (only a product's last block has them) are taken as one more chunk padded with zero pairs.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/gemm_blocked.h"

namespace anvil::cpu {
namespace {

constexpr int kTilePairs = 16;             // pairs of k in an A tile's row and in a B tile
constexpr int kTileMR = 32, kTileNR = 32;  // the C tile: 2 × 2 accumulator tiles
static_assert(kGemmKc % (2 * kTilePairs) == 0, "a k block is whole chunks of 16 pairs, padded only at K");

// A as the tiles read it: panels of kTileMR rows (zero past the operand's last), each row's
// pairs of the k block in one run (tiles load rows at a stride of the block's pairs).
inline void pack_tile_rows(const GemmOperand& m, int K, int i0, int rows, int k0, int kc, uint32_t* dst) {
  const int pairs = (kc + 1) / 2, k_end = K - k0;  // k_end: the operand's end, from k0
  const long rs = m.row_stride, cs = m.col_stride;
  for (int p = 0; p < rows; p += kTileMR, dst += static_cast<long>(pairs) * kTileMR) {
    const int valid = std::min(kTileMR, rows - p);
    const float* panel = m.data + (i0 + p) * rs + k0 * cs;
    if (rs == 1 && valid == kTileMR) {  // each k a contiguous run of the panel's rows
      for (int q = 0; q < pairs; q++) {
        const float* even = panel + 2 * q * cs;
        const float* odd = 2 * q + 1 < k_end ? even + cs : nullptr;
        for (int r = 0; r < kTileMR; r++)
          dst[r * pairs + q] = pair_word(bf16_bits(even[r]), odd ? bf16_bits(odd[r]) : 0u);
      }
      continue;
    }
    for (int r = 0; r < kTileMR; r++) {
      uint32_t* out = dst + r * pairs;
      if (r >= valid) {
        std::fill(out, out + pairs, 0u);
        continue;
      }
      const float* row = panel + r * rs;
      int q = 0;
      if (cs == 1)  // the row a contiguous run of k
        for (; q < pairs && 2 * q + 1 < k_end; q++)
          out[q] = pair_word(bf16_bits(row[2 * q]), bf16_bits(row[2 * q + 1]));
      for (; q < pairs; q++) out[q] = row_pair(row, cs, 2 * q, k_end);
    }
  }
}

// T provides the tile operations: configure() readies this thread's tiles and release() frees
// them, around each call (a library using the tiles between anvil's calls, oneDNN, releases
// them or configures its own shapes), zero() clears the four accumulators, step(a, a_stride, b,
// b_stride) loads and multiplies 16 pairs of k (A's 32 rows from a, a_stride words apart; B's 16
// pair rows of 32 columns from b, b_stride words apart), store(c, ldc) writes the 32 × 32
// accumulators to c. V is an fp32 vector type (gemm_blocked.h), for adding them to C.
template <class T, class V>
void micro_tiles(int steps, const uint32_t* a, const uint32_t* b, long ldb, float* c, long ldc, int m, int n,
                 bool add_to_c) {
  const int whole = steps / kTilePairs * kTilePairs;
  T::zero();
  for (int q = 0; q < whole; q += kTilePairs) T::step(a + q, steps, b + q * ldb, ldb);
  if (whole < steps) {  // the last chunk, zero-padded to 16 pairs
    alignas(64) uint32_t a_tail[kTileMR * kTilePairs] = {}, b_tail[kTilePairs * kTileNR] = {};
    for (int r = 0; r < kTileMR; r++)
      std::copy(a + r * steps + whole, a + r * steps + steps, a_tail + r * kTilePairs);
    for (int q = whole; q < steps; q++)
      std::copy(b + q * ldb, b + q * ldb + kTileNR, b_tail + (q - whole) * kTileNR);
    T::step(a_tail, kTilePairs, b_tail, kTileNR);
  }
  alignas(64) float acc[kTileMR * kTileNR];
  T::store(acc, kTileNR);
  for (int r = 0; r < m; r++) {
    float* row = c + r * ldc;
    const float* sum = acc + r * kTileNR;
    if (n == kTileNR) {
      for (int v = 0; v < kTileNR; v += V::W)
        V::store(row + v, add_to_c ? V::add(V::load(row + v), V::load(sum + v)) : V::load(sum + v));
    } else {
      for (int j = 0; j < n; j++) row[j] = add_to_c ? row[j] + sum[j] : sum[j];
    }
  }
}

template <class T, class V>
void blocked_tiles(const GemmCall& g) {
  T::configure();
  run_blocked<uint32_t>(
      g, kTileMR, kTileNR, 2, g.K, micro_tiles<T, V>,
      [&](int i0, int rows, int k0, int kc, uint32_t* dst) { pack_tile_rows(g.a, g.K, i0, rows, k0, kc, dst); },
      [&](int k0, int kc, int j0, int cols, uint32_t* dst) {
        pack_pair_panels<kTileNR>(g.bt, g.K, j0, cols, k0, kc, dst);
      });
  T::release();
}

// An instruction set's kernels with the tiles for bf16 (B packed ahead as pair panels of
// kTileNR columns: pack_b_pairs).
template <class T, class V>
GemmKernels with_tiles(GemmKernels kernels) {
  kernels.pairs = blocked_tiles<T, V>;
  kernels.pairs_pack_b = pack_b_pairs<V, kTileNR / V::W>;
  kernels.pairs_nr = kTileNR;
  return kernels;
}

}  // namespace
}  // namespace anvil::cpu
