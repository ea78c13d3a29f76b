// Tensor-core matrix products of one 32-lane group: D (16x8, fp32) += A (16x16) · B (16x8), A and B
// 16-bit (bf16 or fp16) with exact products and fp32 accumulation, in the register layout of
// NVIDIA's mma.m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type").
// On NVIDIA (sm_80 and later) it is that instruction; the emulated GPU computes the same layout
// from the fragments every lane gives, so a kernel written against it is tested there unchanged
// (its fragment bookkeeping, not the instruction). AMD's matrix cores (MFMA) lay fragments out
// otherwise and have no version here.
//
// Layout, for lane l of the group, g = l / 4 and t = l % 4 (an A or B register holds two 16-bit
// values, the lower-numbered column or row in its low half):
//   A: a[0] = A[g][2t, 2t+1]    a[1] = A[g+8][2t, 2t+1]    a[2] = A[g][2t+8, 2t+9]    a[3] = A[g+8][2t+8, 2t+9]
//   B: b[0] = B[2t, 2t+1][g]    b[1] = B[2t+8, 2t+9][g]
//   D: d[0], d[1] = D[g][2t, 2t+1]    d[2], d[3] = D[g+8][2t, 2t+1]
// On the emulator's 64-lane (AMD) wavefronts each half is a group of its own.
#pragma once
#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "device/arch.h"
#include "device/half.h"

namespace anvil::gpu {

constexpr int kMmaLanes = 32;

// Two values as one register: lo in the low half. On NVIDIA one conversion instruction
// (cvt.rn.{bf16x2,f16x2}.f32: round to nearest even, fp16 overflowing to infinity, subnormals
// kept), the same bits as bits16 for every number; a NaN stays a NaN with the unit's own payload.
template <ComputeDtype D>
__device__ inline uint32_t pack16(float lo, float hi) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  if constexpr (D == ComputeDtype::kBf16)
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return bits16<D>(lo) | (bits16<D>(hi) << 16);
#endif
}

// The B fragment (rows k0..k0+15, columns n0..n0+7) of a row-major 16-bit matrix in shared
// memory, row_words 32-bit words per row: b[0] = {M[k0+2t][n0+g], M[k0+2t+1][n0+g]}, b[1] the
// same 8 rows down. That is a transposed read (two rows' values in one register); on NVIDIA
// ldmatrix.trans does it for the whole group in one instruction, which needs each row's 8 values
// 16-byte aligned: tile and row_words multiples of 16 bytes and 4 words, n0 a multiple of 8.
// Every lane of the group calls it together.
__device__ inline void b_fragment_transposed(uint32_t b[2], const uint32_t* tile, int row_words, int k0, int n0) {
  const int lane = static_cast<int>(threadIdx.x) % kMmaLanes;
#if defined(__CUDA_ARCH__)
  // Lanes 0-7 give the rows of the first 8x8 matrix, lanes 8-15 those of the second.
  const uint32_t* row = tile + (k0 + (lane & 15)) * row_words + n0 / 2;
  const auto address = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(b[0]), "=r"(b[1])
               : "r"(address));
#else
  const int g = lane / 4, t = lane % 4;
  const auto half = [&](int r, int c) { return (tile[r * row_words + c / 2] >> (16 * (c & 1))) & 0xffffu; };
  const int r = k0 + 2 * t, c = n0 + g;
  b[0] = half(r, c) | (half(r + 1, c) << 16);
  b[1] = half(r + 8, c) | (half(r + 9, c) << 16);
#endif
}

// d += A·B for one 32-lane group; every lane of the group calls it together.
template <ComputeDtype D>
__device__ inline void mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
#if defined(__CUDA_ARCH__)
#if __CUDA_ARCH__ < 800
#error "device/mma.h: mma.sync.m16n8k16 on 16-bit floats needs sm_80 or later"
#endif
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
#elif defined(ANVIL_GPU_EMULATION)
  // Every lane gives its fragments; lane (g, t) then forms rows g and g+8 of D, columns 2t and
  // 2t+1, from the lanes holding them: row r of A at k = 2s, 2s+1 in lane (r mod 8, s)'s register
  // r / 8 (2 + r / 8 for k + 8), column n of B at k = 2s, 2s+1 in lane (n, s)'s b[0] (b[1] for
  // k + 8).
  const int wave_lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int group0 = wave_lane - wave_lane % kMmaLanes, lane = wave_lane % kMmaLanes, g = lane / 4, t = lane % 4;
  const uint64_t mine[3] = {a[0] | (uint64_t{a[1]} << 32), a[2] | (uint64_t{a[3]} << 32), b[0] | (uint64_t{b[1]} << 32)};
  uint64_t all[kWarpSize * 3];
  emulation::warp_gather(mine, 3, all);
  const auto reg = [&](int from, int r) { return static_cast<uint32_t>(all[(group0 + from) * 3 + r / 2] >> (32 * (r % 2))); };
  const auto value = [](uint32_t pair, int k) { return float16_value<D>((pair >> (16 * k)) & 0xffffu); };
  float acc[4] = {d[0], d[1], d[2], d[3]};
  for (int s = 0; s < 4; s++)
    for (int high = 0; high < 2; high++)  // k = 2s, 2s+1, then 2s+8, 2s+9
      for (int k = 0; k < 2; k++) {
        const float ag = value(reg(g * 4 + s, 2 * high), k), ag8 = value(reg(g * 4 + s, 2 * high + 1), k);
        const float b0 = value(reg(2 * t * 4 + s, 4 + high), k), b1 = value(reg((2 * t + 1) * 4 + s, 4 + high), k);
        acc[0] += ag * b0;
        acc[1] += ag * b1;
        acc[2] += ag8 * b0;
        acc[3] += ag8 * b1;
      }
  for (int i = 0; i < 4; i++) d[i] = acc[i];
#elif defined(__HIP_DEVICE_COMPILE__)
#error "device/mma.h has NVIDIA's product only: AMD's matrix cores lay fragments out otherwise"
#endif
}

}  // namespace anvil::gpu
