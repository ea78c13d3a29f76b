// One value rounded to bf16 / fp16 and kept in fp32, branch-free so that the loops calling it
// vectorise: the same bits as the scalar conversions in core/dtype.h. round_to_dtype's CPU
// version and the fused cross-entropy read and write through these.
#pragma once
#include <cstdint>
#include <cstring>

#include "core/dtype.h"

namespace anvil::cpu {

inline float round_bf16_value(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  const uint32_t out = nan ? ((u | 0x00400000u) & 0xffff0000u) : rounded;
  std::memcpy(&x, &out, 4);
  return x;
}

inline float round_fp16_value(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t sign = u & 0x80000000u, a = u & 0x7fffffffu;
  // Normal range: 11 significant bits, to nearest even, still in float encoding.
  const uint32_t normal = (a + 0xfffu + ((a >> 13) & 1u)) & ~0x1fffu;
  // Below 2^-14: to a multiple of 2^-24. Adding 0.5 (whose ulp is 2^-24) rounds there, ties to
  // even, and subtracting it again is exact.
  float small;
  std::memcpy(&small, &a, 4);
  small = (small + 0.5f) - 0.5f;
  uint32_t subnormal;
  std::memcpy(&subnormal, &small, 4);
  uint32_t out = a < 0x38800000u ? subnormal : normal;
  out = a >= 0x477ff000u ? 0x7f800000u : out;       // 65520 and above: infinity
  out = a > 0x7f800000u ? (a | 0x00400000u) : out;  // NaN stays (quiet) NaN
  out |= sign;
  std::memcpy(&x, &out, 4);
  return x;
}

// x rounded to d (kFp32: x).
inline float round_value(float x, ComputeDtype d) {
  return d == ComputeDtype::kBf16 ? round_bf16_value(x) : d == ComputeDtype::kFp16 ? round_fp16_value(x) : x;
}

}  // namespace anvil::cpu
