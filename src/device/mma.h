// Tensor-core matrix products of one 32-lane group: D (16x8, fp32) += A (16x16) · B (16x8), A and B
// 16-bit (bf16 or fp16) with exact products and fp32 accumulation, in the register layout of
// NVIDIA's mma.m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type").
// On NVIDIA from sm_80 it is that instruction. Everywhere else (AMD, whose MFMA layouts differ,
// and the emulated GPU) the same layout is computed with lane shuffles, so a kernel written
// against it runs, and is tested, unchanged: its fragment bookkeeping is exercised by the emulator.
//
// Layout, for lane l of the group, g = l / 4 and t = l % 4 (an A or B register holds two 16-bit
// values, the lower-numbered column or row in its low half):
//   A: a[0] = A[g][2t, 2t+1]    a[1] = A[g+8][2t, 2t+1]    a[2] = A[g][2t+8, 2t+9]    a[3] = A[g+8][2t+8, 2t+9]
//   B: b[0] = B[2t, 2t+1][g]    b[1] = B[2t+8, 2t+9][g]
//   D: d[0], d[1] = D[g][2t, 2t+1]    d[2], d[3] = D[g+8][2t, 2t+1]
// On AMD's 64-lane wavefronts each half is a group of its own.
#pragma once
#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "device/arch.h"

namespace anvil::gpu {

constexpr int kMmaLanes = 32;

__host__ __device__ inline uint32_t float_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}
__host__ __device__ inline float bits_float(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

// The 16 bits of x in dtype D (ComputeDtype::kBf16 or kFp16), rounded to nearest, ties to even,
// as round_to_dtype rounds (kernels/round.h): NaN stays NaN; fp16 overflows to infinity and keeps
// subnormals.
template <ComputeDtype D>
__host__ __device__ inline uint32_t bits16(float x) {
  const uint32_t u = float_bits(x);
  if constexpr (D == ComputeDtype::kBf16) {
    if ((u & 0x7fffffffu) > 0x7f800000u) return ((u | 0x00400000u) >> 16) & 0xffffu;
    return ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16) & 0xffffu;
  } else {
    const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u | ((a >> 13) & 0x3ffu);
    if (a >= 0x477ff000u) return sign | 0x7c00u;  // rounds to 65536 or more: infinity
    if (a < 0x38800000u) {
      // Below 2^-14: a multiple of 2^-24, rounded to nearest even by the float addition.
      const float scaled = bits_float(a) * 16777216.0f;  // exact: a power of two
      const float r = (scaled + 8388608.0f) - 8388608.0f;       // ties to even, as the FPU rounds
      return sign | static_cast<uint32_t>(r);
    }
    const uint32_t rounded = a + 0xfffu + ((a >> 13) & 1u);
    return sign | (((rounded >> 23) - 112u) << 10) | ((rounded >> 13) & 0x3ffu);
  }
}

template <ComputeDtype D>
__host__ __device__ inline float float16_value(uint32_t h) {
  if constexpr (D == ComputeDtype::kBf16) {
    return bits_float(h << 16);
  } else {
    const uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
      const float v = static_cast<float>(m) * (1.0f / 16777216.0f);
      return sign ? -v : v;
    }
    if (e == 31) return bits_float(sign | 0x7f800000u | (m << 13));
    return bits_float(sign | ((e + 112u) << 23) | (m << 13));
  }
}

// Two values as one register: lo in the low half.
template <ComputeDtype D>
__device__ inline uint32_t pack16(float lo, float hi) {
  return bits16<D>(lo) | (bits16<D>(hi) << 16);
}

#if !(defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800)
// Lane `source` (0-31) of this lane's group gives v.
__device__ inline uint64_t group_shfl(uint64_t v, int source) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int from = (lane - lane % kMmaLanes) + source;
#if defined(ANVIL_HIP)
  return static_cast<uint64_t>(__shfl(static_cast<unsigned long long>(v), from, kWarpSize));
#else
  return static_cast<uint64_t>(__shfl_sync(0xffffffffu, static_cast<unsigned long long>(v), from, kWarpSize));
#endif
}
__device__ inline uint64_t pair(uint32_t lo, uint32_t hi) { return lo | (static_cast<uint64_t>(hi) << 32); }
#endif

// d += A·B for one 32-lane group; every lane of the group calls it together.
template <ComputeDtype D>
__device__ inline void mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (D == ComputeDtype::kBf16)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  // This lane's outputs are rows g and g+8 of D, columns 2t and 2t+1: it gathers rows g and g+8
  // of A and columns 2t and 2t+1 of B, four k values at a time, from the lanes holding them.
  const int lane = static_cast<int>(threadIdx.x) % kMmaLanes;
  const int g = lane / 4, t = lane % 4;
  float acc[4] = {d[0], d[1], d[2], d[3]};
  for (int s = 0; s < 4; s++) {
    // Lane (g, s) holds A[g or g+8][2s, 2s+1] and [2s+8, 2s+9]; lane (n, s) holds B[2s, 2s+1][n]
    // and B[2s+8, 2s+9][n].
    const uint64_t a01 = group_shfl(pair(a[0], a[1]), g * 4 + s), a23 = group_shfl(pair(a[2], a[3]), g * 4 + s);
    const uint64_t b0 = group_shfl(pair(b[0], b[1]), (2 * t) * 4 + s);
    const uint64_t b1 = group_shfl(pair(b[0], b[1]), (2 * t + 1) * 4 + s);
    // k = 2s, 2s+1 (the low registers), then 2s+8, 2s+9.
    for (int half = 0; half < 2; half++) {
      const uint32_t row_g = static_cast<uint32_t>(half ? a23 : a01);
      const uint32_t row_g8 = static_cast<uint32_t>((half ? a23 : a01) >> 32);
      const uint32_t col0 = static_cast<uint32_t>(b0 >> (32 * half)), col1 = static_cast<uint32_t>(b1 >> (32 * half));
      for (int k = 0; k < 2; k++) {
        const int sh = 16 * k;
        const float ag = float16_value<D>((row_g >> sh) & 0xffffu), ag8 = float16_value<D>((row_g8 >> sh) & 0xffffu);
        const float b_0 = float16_value<D>((col0 >> sh) & 0xffffu), b_1 = float16_value<D>((col1 >> sh) & 0xffffu);
        acc[0] += ag * b_0;
        acc[1] += ag * b_1;
        acc[2] += ag8 * b_0;
        acc[3] += ag8 * b_1;
      }
    }
  }
  for (int i = 0; i < 4; i++) d[i] = acc[i];
#endif
}

}  // namespace anvil::gpu
