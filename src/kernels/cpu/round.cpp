// Rounding to bf16 / fp16 in place, branch-free so that the loops vectorise; the same bits as the
// scalar conversions in core/dtype.h (tested against ref::round_to_dtype).
#include <cstdint>
#include <cstring>

#include "kernels/cpu/vec_math.h"
#include "kernels/round.h"

namespace anvil::cpu {
namespace {

ANVIL_CPU_CLONES void round_bf16(float* x, long N) {
#pragma omp parallel for simd schedule(static)
  for (long i = 0; i < N; i++) {
    uint32_t u;
    std::memcpy(&u, &x[i], 4);
    const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    const uint32_t out = nan ? ((u | 0x00400000u) & 0xffff0000u) : rounded;
    std::memcpy(&x[i], &out, 4);
  }
}

ANVIL_CPU_CLONES void round_fp16(float* x, long N) {
#pragma omp parallel for simd schedule(static)
  for (long i = 0; i < N; i++) {
    uint32_t u;
    std::memcpy(&u, &x[i], 4);
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
    std::memcpy(&x[i], &out, 4);
  }
}

}  // namespace

void round_to_dtype(float* x, long N, ComputeDtype d) {
  if (d == ComputeDtype::kBf16) round_bf16(x, N);
  if (d == ComputeDtype::kFp16) round_fp16(x, N);
}

}  // namespace anvil::cpu
