// The bf16 GEMM on AMX tiles (TDPBF16PS; compiled with AVX-512 flags, run only where the CPU
// has AMX-BF16 and Linux has granted the process the tile state: gemm.cpp). Its fp32 kernel is
// the AVX-512 one. The tile loops are gemm_tiles.h's; here are the instructions.
#include <cstdint>

#include "kernels/cpu/gemm_avx512.h"
#include "kernels/cpu/gemm_tiles.h"

namespace anvil::cpu {
namespace {

// Tiles 0-3 accumulate C (0: rows 0-15 × columns 0-15, 1: rows 0-15 × columns 16-31, 2 and 3
// the same for rows 16-31), 4 and 5 hold A's two row halves, 6 and 7 B's two column halves; all
// 16 rows of 64 bytes, configured at the start of each product and released at its end. The
// loads and stores are written out rather than taken from <immintrin.h>, whose tile macros tell
// the compiler of no memory access (so stores into the packed panels could be moved past a load
// of them).
struct AmxTiles {
  static void configure() {
    struct alignas(64) TileConfig {
      uint8_t palette, start_row, reserved[14];
      uint16_t bytes_per_row[16];
      uint8_t rows[16];
    } config{};
    config.palette = 1;
    for (int t = 0; t < 8; t++) config.bytes_per_row[t] = 64, config.rows[t] = 16;
    asm volatile("ldtilecfg %0" ::"m"(config));
  }
  static void release() { asm volatile("tilerelease" ::); }
  static void zero() { asm volatile("tilezero %%tmm0\n\ttilezero %%tmm1\n\ttilezero %%tmm2\n\ttilezero %%tmm3" ::); }
  static void step(const uint32_t* a, long a_stride, const uint32_t* b, long b_stride) {
    asm volatile(
        "tileloadd (%[a0], %[as], 1), %%tmm4\n\t"
        "tileloadd (%[a1], %[as], 1), %%tmm5\n\t"
        "tileloadd (%[b0], %[bs], 1), %%tmm6\n\t"
        "tileloadd (%[b1], %[bs], 1), %%tmm7\n\t"
        "tdpbf16ps %%tmm6, %%tmm4, %%tmm0\n\t"
        "tdpbf16ps %%tmm7, %%tmm4, %%tmm1\n\t"
        "tdpbf16ps %%tmm6, %%tmm5, %%tmm2\n\t"
        "tdpbf16ps %%tmm7, %%tmm5, %%tmm3" ::[a0] "r"(a),
        [a1] "r"(a + 16 * a_stride), [as] "r"(a_stride * 4), [b0] "r"(b), [b1] "r"(b + 16), [bs] "r"(b_stride * 4)
        : "memory");
  }
  static void store(float* c, long ldc) {
    asm volatile(
        "tilestored %%tmm0, (%[c0], %[cs], 1)\n\t"
        "tilestored %%tmm1, (%[c1], %[cs], 1)\n\t"
        "tilestored %%tmm2, (%[c2], %[cs], 1)\n\t"
        "tilestored %%tmm3, (%[c3], %[cs], 1)" ::[c0] "r"(c),
        [c1] "r"(c + 16), [c2] "r"(c + 16 * ldc), [c3] "r"(c + 16 * ldc + 16), [cs] "r"(ldc * 4)
        : "memory");
  }
};

}  // namespace

const GemmKernels& gemm_kernels_amx() {
  static const GemmKernels kernels = with_tiles<AmxTiles, Avx512>(gemm_kernels_avx512());
  return kernels;
}

}  // namespace anvil::cpu
