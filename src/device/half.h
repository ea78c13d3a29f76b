// 16-bit floating-point values (bf16, fp16) as bits, on the host and on any GPU: the rounding of
// round_to_dtype (kernels/round.h) and the exact widening back, for the kernels that store or
// pass operands in 16 bits (the tensor-core products, the matrix products' operands).
#pragma once
#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "device/arch.h"

namespace anvil::gpu {

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

}  // namespace anvil::gpu
