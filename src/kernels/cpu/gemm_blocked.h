// The blocked GEMM as templates over a vector type, included by one source file per instruction
// set (gemm_kernels_*.cpp), each compiled for its ISA, so that packing is vectorised for the
// same ISA as the microkernel. Everything here has internal linkage, so that no instantiation
// compiled for one ISA can stand in for another's.
//
// B is packed a KC × NC block at a time and A a MC × KC block at a time, into k-major panels of
// MR rows (A) and NR columns (B); the microkernel computes an MR × NR tile of C from a pair of
// panels: each element's chain over the k block from zero, then added to C (gemm.h).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "kernels/cpu/gemm.h"

namespace anvil::cpu {
namespace {

// V provides W (floats per vector), Vec, zero(), load(const float*), store(float*, Vec) and
// add(a, b); for fp32, bcast(float) and fma(a, b, c) = a·b + c rounded once; for bf16 words,
// Pairs, PairScalar, load_pairs(const uint32_t*), bcast_pair(uint32_t) and dot_pair(a, b, acc),
// one VDPBF16PS step.

template <class V, int MR, int NV, class Step>
inline void micro_tile(int steps, float* c, long ldc, int m, int n, bool add_to_c, const Step& step) {
  constexpr int NR = NV * V::W;
  // C is usually cold (a fresh output, or a gradient accumulated into): its lines are fetched
  // while the chains run, and it is read only at the end.
  for (int r = 0; r < m; r++) {
    __builtin_prefetch(c + r * ldc, 1);
    __builtin_prefetch(c + r * ldc + n - 1, 1);
  }
  typename V::Vec acc[MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) acc[r][v] = V::zero();
#pragma GCC unroll 4
  for (int k = 0; k < steps; k++) step(k, acc);
  alignas(64) float edge[MR * NR];
  const bool full = m == MR && n == NR;
  float* cp = c;
  long ld = ldc;
  if (!full) {  // an edge tile goes through a full-size copy: the same arithmetic, the valid part kept
    cp = edge;
    ld = NR;
    std::memset(edge, 0, sizeof edge);
    if (add_to_c)
      for (int r = 0; r < m; r++) std::memcpy(edge + r * NR, c + r * ldc, sizeof(float) * n);
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) {
      float* at = cp + r * ld + v * V::W;
      V::store(at, add_to_c ? V::add(V::load(at), acc[r][v]) : acc[r][v]);
    }
  if (!full)
    for (int r = 0; r < m; r++) std::memcpy(c + r * ldc, edge + r * NR, sizeof(float) * n);
}

template <class V, int MR, int NV>
void micro_fp32(int steps, const float* a, const float* b, long ldb, float* c, long ldc, int m, int n, bool add_to_c) {
  micro_tile<V, MR, NV>(steps, c, ldc, m, n, add_to_c, [&](int k, typename V::Vec(&acc)[MR][NV]) {
    typename V::Vec bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) bv[v] = V::load(b + k * ldb + v * V::W);
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++) {
      const typename V::Vec ar = V::bcast(a[k * MR + r]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) acc[r][v] = V::fma(ar, bv[v], acc[r][v]);
    }
  });
}

template <class V, int MR, int NV>
void micro_pairs(int steps, const uint32_t* a, const uint32_t* b, long ldb, float* c, long ldc, int m, int n,
                 bool add_to_c) {
  micro_tile<V, MR, NV>(steps, c, ldc, m, n, add_to_c, [&](int p, typename V::Vec(&acc)[MR][NV]) {
    typename V::Pairs bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) bv[v] = V::load_pairs(b + p * ldb + v * V::W);
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++) {
      const typename V::PairScalar ar = V::bcast_pair(a[p * MR + r]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) acc[r][v] = V::dot_pair(ar, bv[v], acc[r][v]);
    }
  });
}

// fp32 → bf16 bits, nearest even, as float_to_bf16 (core/dtype.h), with a subnormal result
// flushed to a zero of its sign: VDPBF16PS reads subnormal inputs as zero. Branch-free, so that
// the packing loops below vectorise.
inline uint32_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const uint32_t flushed = (rounded & 0x7F80u) == 0 ? rounded & 0x8000u : rounded;
  return (u & 0x7FFFFFFFu) > 0x7F800000u ? (u >> 16) | 0x40u : flushed;  // NaN stays a (quiet) NaN
}
inline float bf16_value(float f) {
  const uint32_t bits = bf16_bits(f) << 16;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// A panel reads a short run from each of many lines (a line per k, or per row), more streams
// than the hardware prefetcher follows, and the LM head's operands (51 MB for bench-16m) come
// from DRAM: the packing loops ask for the lines kPackAhead floats on themselves, one loop of
// hints apart from the arithmetic (a hint inside the converting loop cost a fifth of the
// forward's rate). Measured on Zen 5, the LM head's products: fp32 0.33-0.38 -> 0.40-0.43
// TFLOP/s, bf16 (VDPBF16PS) 0.48-0.54 -> 0.62-0.76.
constexpr int kPackAhead = 64;

// out[j · out_stride + r] = in[r · in_stride + j] for r, j < 8: an 8 × 8 block of 32-bit words
// (floats, or bf16 pair words) transposed. The packing loops move rows that run along k into
// k-major panels through it; compiled for AVX2 and up (every vector TU but the portable one) it
// is eight shuffled 256-bit loads and stores, where the plain loops became a scalar store per
// word (a fifth of a bf16 product's time went to packing).
template <class T>
__attribute__((always_inline)) inline void transpose_8x8(const T* in, long in_stride, T* out, long out_stride) {
  static_assert(sizeof(T) == 4, "32-bit words");
#if defined(__AVX2__)
  __m256 r[8], t[8], u[8];
  for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(reinterpret_cast<const float*>(in + i * in_stride));
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int j = 0; j < 4; j++) {
    float* low = reinterpret_cast<float*>(out + j * out_stride);
    float* high = reinterpret_cast<float*>(out + (j + 4) * out_stride);
    _mm256_storeu_ps(low, _mm256_permute2f128_ps(u[j], u[j + 4], 0x20));
    _mm256_storeu_ps(high, _mm256_permute2f128_ps(u[j], u[j + 4], 0x31));
  }
#else
  for (int j = 0; j < 8; j++)
    for (int r = 0; r < 8; r++) out[j * out_stride + r] = in[r * in_stride + j];
#endif
}

// Packs rows [i0, i0 + rows) × k [k0, k0 + kc) of an operand into panels of Width rows,
// k-major, zero-padded: A as it is, B through GemmCall::bt (Bᵀ) with NR for the width.
// Rows of k at or past K (bf16's odd tail) are zero. Either layout is read in address order.
template <int Width>
void pack_panels(const GemmOperand& m, int K, int i0, int rows, int k0, int kc, float* dst) {
  constexpr int kWhole8 = Width / 8 * 8;  // rows of a panel that go through transpose_8x8
  const int valid_k = std::min(kc, K - k0);
  const long panel = static_cast<long>(kc) * Width;
  const int panels = (rows + Width - 1) / Width;
  for (int p = 0; p < panels; p++) {
    const int valid = std::min(Width, rows - p * Width);
    float* out = dst + p * panel;
    if (m.row_stride == 1) {  // each k is a contiguous run of the rows
      for (int k = 0; k < valid_k; k++) {
        const float* src = m.data + (k0 + k) * m.col_stride + i0 + p * Width;
        __builtin_prefetch(src + kPackAhead);
        if (valid == Width)
          for (int r = 0; r < Width; r++) out[k * Width + r] = src[r];
        else
          for (int r = 0; r < Width; r++) out[k * Width + r] = r < valid ? src[r] : 0.0f;
      }
    } else {
      // Rows along k (the usual case when k is the contiguous index): transposed in 8 × 8
      // blocks, 8 k at a time, so that loads run along rows and stores along the panel.
      const float* src = m.data + (i0 + p * Width) * m.row_stride + k0 * m.col_stride;
      const long rs = m.row_stride, cs = m.col_stride;
      int k = 0;
      if (valid == Width && cs == 1) {
        for (; k + 8 <= valid_k; k += 8) {
          for (int r = 0; r < Width; r++) __builtin_prefetch(src + r * rs + k + kPackAhead);
          for (int r = 0; r < kWhole8; r += 8) transpose_8x8(src + r * rs + k, rs, out + k * Width + r, Width);
          for (int r = kWhole8; r < Width; r++)
            for (int j = 0; j < 8; j++) out[(k + j) * Width + r] = src[r * rs + k + j];
        }
      }
      for (; k < valid_k; k++)
        for (int r = 0; r < Width; r++) out[k * Width + r] = r < valid ? src[r * rs + k * cs] : 0.0f;
    }
    std::fill(out + static_cast<long>(valid_k) * Width, out + panel, 0.0f);
  }
}

// bf16 on CPUs without VDPBF16PS: packed fp32 panels (kc even) rounded to bf16 with the two
// members of each pair of k swapped, so that the fp32 kernel's chain takes the odd k first,
// exactly like the instruction (whose odd tail is the zero padding).
inline void round_and_swap_pairs(float* panels, long values, int width) {
  for (long i = 0; i < values; i += 2L * width)
    for (int j = 0; j < width; j++) {
      const float even = bf16_value(panels[i + j]), odd = bf16_value(panels[i + width + j]);
      panels[i + j] = odd;
      panels[i + width + j] = even;
    }
}

// A pair of k as one 32-bit word of bf16 halves, the even k low.
inline uint32_t pair_word(uint32_t even, uint32_t odd) { return even | odd << 16; }

// Pair (k, k + 1) of a row as a word, k < K; k + 1 = K pads with zero.
inline uint32_t row_pair(const float* row, long stride, int k, int K) {
  return pair_word(bf16_bits(row[k * stride]), k + 1 < K ? bf16_bits(row[(k + 1) * stride]) : 0u);
}

// Packing for the pair instructions: pairs of k in one 32-bit word (pair_word); k = K pads with
// zero. Panels of Width rows, k-major, as pack_panels; each layout is read in address order and
// the full panels go through loops the compiler vectorises (packing otherwise costs as much as
// the products: a bf16 operand is converted on every call).
template <int Width>
void pack_pair_panels(const GemmOperand& m, int K, int i0, int rows, int k0, int kc, uint32_t* dst) {
  constexpr int kWhole8 = Width / 8 * 8;  // rows of a panel that go through transpose_8x8
  const int pairs = (kc + 1) / 2;
  const long rs = m.row_stride, cs = m.col_stride;
  for (int p = 0; p < rows; p += Width, dst += static_cast<long>(pairs) * Width) {
    const int valid = std::min(Width, rows - p);
    const float* panel = m.data + (i0 + p) * rs;
    int q = 0;
    if (valid == Width && rs == 1) {  // each k a contiguous run of the panel's rows
      for (; q < pairs && k0 + 2 * q + 1 < K; q++) {
        const float* lo = panel + (k0 + 2 * q) * cs;
        const float* hi = lo + cs;
        __builtin_prefetch(lo + kPackAhead);  // the panels after this one, on the same lines
        __builtin_prefetch(hi + kPackAhead);
        uint32_t* out = dst + q * Width;
        for (int r = 0; r < Width; r++) out[r] = pair_word(bf16_bits(lo[r]), bf16_bits(hi[r]));
      }
    } else if (valid == Width && cs == 1) {  // each row a contiguous run of k: 8 pairs at a time
      for (; q + 8 <= pairs && k0 + 2 * q + 16 <= K; q += 8) {
        for (int r = 0; r < Width; r++) __builtin_prefetch(panel + r * rs + k0 + 2 * q + kPackAhead);
        uint32_t words[Width][8];  // row r's 8 pair words
        for (int r = 0; r < Width; r++) {
          const float* src = panel + r * rs + k0 + 2 * q;
          uint16_t halves[16];
          for (int j = 0; j < 16; j++) halves[j] = static_cast<uint16_t>(bf16_bits(src[j]));
          std::memcpy(words[r], halves, sizeof words[r]);
        }
        for (int r = 0; r < kWhole8; r += 8) transpose_8x8(&words[r][0], 8, dst + q * Width + r, Width);
        for (int r = kWhole8; r < Width; r++)
          for (int j = 0; j < 8; j++) dst[(q + j) * Width + r] = words[r][j];
      }
    }
    for (; q < pairs; q++)
      for (int r = 0; r < Width; r++)
        dst[q * Width + r] = r < valid ? row_pair(panel + r * rs, cs, k0 + 2 * q, K) : 0;
  }
}

// The loops around a microkernel: pack_a / pack_b fill panels (pack_b one NR-column panel per
// call), and k_per_step is how many k one step of the kernel's chain consumes (bf16 words: 2).
// A team call (g.threads > 1, every thread of an OpenMP team calling with its g.thread) shares
// the packed B: the threads pack its panels in turn, kGemmTeamBlocks k blocks at a time, into
// the shared g.b_buffer, then each computes its own band of rows; a barrier pair per group of
// blocks orders the two (few, so that a thread the OS pauses holds the others back rarely).
// With `direct` (fp32 whose B rows are contiguous, direct_stride apart), full panels are read
// from B itself: where few rows of A use each panel, packing would cost more than it saves.
// With g.packed_b, every panel is read from there (gemm.h has its layout).
template <class Element, class Kernel, class PackA, class PackB>
void run_blocked(const GemmCall& g, int MR, int NR, int k_per_step, int K, const Kernel& kernel, const PackA& pack_a,
                 const PackB& pack_b, const float* direct = nullptr, long direct_stride = 0) {
  auto* abuf = static_cast<Element*>(g.a_buffer);
  auto* bbuf = static_cast<Element*>(g.b_buffer);
  const auto* packed = static_cast<const Element*>(g.packed_b);
  const long slot = static_cast<long>(kGemmKc / k_per_step) * NR;
  const int band = (g.M + g.threads - 1) / g.threads;
  const int band_rows = (band + MR - 1) / MR * MR;
  const int row0 = std::min(g.M, g.thread * band_rows), row1 = std::min(g.M, row0 + band_rows);
  const int group = g.threads > 1 ? kGemmTeamBlocks : 1;  // k blocks packed per barrier pair
  for (int jc = 0; jc < g.N; jc += kGemmNc) {
    const int nc = std::min(kGemmNc, g.N - jc);
    const long block_size = static_cast<long>((nc + NR - 1) / NR) * NR * (kGemmKc / k_per_step);
    for (int pg = 0; pg < K; pg += group * kGemmKc) {
      const int pg_end = std::min(K, pg + group * kGemmKc);
      for (int pc = pg; pc < pg_end; pc += kGemmKc) {
        const int kc = std::min(kGemmKc, K - pc), steps = (kc + k_per_step - 1) / k_per_step;
        Element* blocks = bbuf + (pc - pg) / kGemmKc * block_size;
        for (int q = g.thread * NR; q < nc && !packed; q += g.threads * NR)
          if (!direct || q + NR > nc)
            pack_b(pc, kc, jc + q, std::min(NR, nc - q), blocks + static_cast<long>(q / NR) * steps * NR);
      }
      if (g.threads > 1) {
#pragma omp barrier
      }
      for (int pc = pg; pc < pg_end; pc += kGemmKc) {
        const int kc = std::min(kGemmKc, K - pc), steps = (kc + k_per_step - 1) / k_per_step;
        const Element* blocks = bbuf + (pc - pg) / kGemmKc * block_size;
        for (int ic = row0; ic < row1; ic += kGemmMc) {
          const int mc = std::min(kGemmMc, row1 - ic);
          pack_a(ic, mc, pc, kc, abuf);
          for (int q = 0; q < nc; q += NR) {
            const bool from_b = direct && q + NR <= nc;
            const Element* bp = packed   ? packed + (pc / kGemmKc * g.packed_panels + (jc + q) / NR) * slot
                                : from_b ? reinterpret_cast<const Element*>(direct + pc * direct_stride + jc + q)
                                         : blocks + static_cast<long>(q / NR) * steps * NR;
            const long ldb = from_b ? direct_stride : NR;
            for (int p = 0; p < mc; p += MR) {
              const Element* ap = abuf + static_cast<long>(p / MR) * steps * MR;
              kernel(steps, ap, bp, ldb, g.c + (ic + p) * g.ldc + jc + q, g.ldc, std::min(MR, mc - p),
                     std::min(NR, nc - q), g.accumulate || pc > 0);
            }
          }
        }
      }
      if (g.threads > 1) {
#pragma omp barrier
      }
    }
  }
}

// Packs all of B ahead (GemmPackedB) with a product's pack_b, the slots shared out over the
// calling team's threads.
template <class Element, class PackB>
void pack_whole_b(const GemmCall& g, int NR, int k_per_step, int K, const PackB& pack_b, void* dst) {
  const long panels = (g.N + NR - 1) / NR, slot = static_cast<long>(kGemmKc / k_per_step) * NR;
  const long slots = (K + kGemmKc - 1) / kGemmKc * panels;
#pragma omp for schedule(dynamic, 8)
  for (long t = 0; t < slots; t++) {
    const int pc = static_cast<int>(t / panels) * kGemmKc, j0 = static_cast<int>(t % panels) * NR;
    pack_b(pc, std::min(kGemmKc, K - pc), j0, std::min(NR, g.N - j0), static_cast<Element*>(dst) + t * slot);
  }
}

// The fp32 product, and bf16 through it (rounded operands in swapped pair order; an odd K gets
// its zero pad as one more k, so every chain has VDPBF16PS's steps).
template <int Width>
void pack_fp32_panels(const GemmCall& g, const GemmOperand& m, int i0, int rows, int k0, int kc, float* dst) {
  pack_panels<Width>(m, g.K, i0, rows, k0, kc, dst);
  if (g.bf16_operands) round_and_swap_pairs(dst, static_cast<long>((rows + Width - 1) / Width) * Width * kc, Width);
}

template <class V, int MR, int NV>
void blocked_fp32(const GemmCall& g) {
  constexpr int NR = NV * V::W;
  // B read in place when its rows are contiguous and the rows of A fit one packed block.
  const bool direct = !g.bf16_operands && g.bt.row_stride == 1 && g.M <= kGemmMc;
  run_blocked<float>(
      g, MR, NR, 1, g.K + (g.bf16_operands ? g.K & 1 : 0), micro_fp32<V, MR, NV>,
      [&](int i0, int rows, int k0, int kc, float* dst) { pack_fp32_panels<MR>(g, g.a, i0, rows, k0, kc, dst); },
      [&](int k0, int kc, int j0, int cols, float* dst) { pack_fp32_panels<NR>(g, g.bt, j0, cols, k0, kc, dst); },
      direct ? g.bt.data : nullptr, g.bt.col_stride);
}

template <class V, int NV>
void pack_b_fp32(const GemmCall& g, void* dst) {
  constexpr int NR = NV * V::W;
  pack_whole_b<float>(
      g, NR, 1, g.K + (g.bf16_operands ? g.K & 1 : 0),
      [&](int k0, int kc, int j0, int cols, float* out) { pack_fp32_panels<NR>(g, g.bt, j0, cols, k0, kc, out); },
      dst);
}

// bf16 on VDPBF16PS.
template <class V, int MR, int NV>
void blocked_pairs(const GemmCall& g) {
  constexpr int NR = NV * V::W;
  run_blocked<uint32_t>(
      g, MR, NR, 2, g.K, micro_pairs<V, MR, NV>,
      [&](int i0, int rows, int k0, int kc, uint32_t* dst) { pack_pair_panels<MR>(g.a, g.K, i0, rows, k0, kc, dst); },
      [&](int k0, int kc, int j0, int cols, uint32_t* dst) { pack_pair_panels<NR>(g.bt, g.K, j0, cols, k0, kc, dst); });
}

template <class V, int NV>
void pack_b_pairs(const GemmCall& g, void* dst) {
  constexpr int NR = NV * V::W;
  pack_whole_b<uint32_t>(
      g, NR, 2, g.K,
      [&](int k0, int kc, int j0, int cols, uint32_t* out) { pack_pair_panels<NR>(g.bt, g.K, j0, cols, k0, kc, out); },
      dst);
}

// An instruction set's kernels: fp32 (and bf16 through it), then VDPBF16PS's added.
template <class V, int MR, int NV>
GemmKernels fp32_kernels() {
  return {blocked_fp32<V, MR, NV>, nullptr, pack_b_fp32<V, NV>, nullptr, NV * V::W, 0};
}
template <class V, int MR, int NV>
GemmKernels with_pairs(GemmKernels kernels) {
  kernels.pairs = blocked_pairs<V, MR, NV>;
  kernels.pairs_pack_b = pack_b_pairs<V, NV>;
  kernels.pairs_nr = NV * V::W;
  return kernels;
}

}  // namespace
}  // namespace anvil::cpu
