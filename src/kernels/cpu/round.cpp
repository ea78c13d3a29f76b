// Rounding to bf16 / fp16 in place (round_value.h: branch-free, so the loops vectorise); the
// same bits as the scalar conversions in core/dtype.h (tested against ref::round_to_dtype).
#include "kernels/cpu/round_value.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/round.h"

#include <cstring>

namespace anvil::cpu {
namespace {

ANVIL_CPU_CLONES void round_bf16(float* x, long N) {
#pragma omp parallel for simd schedule(static)
  for (long i = 0; i < N; i++) x[i] = round_bf16_value(x[i]);
}

ANVIL_CPU_CLONES void round_fp16(float* x, long N) {
#pragma omp parallel for simd schedule(static)
  for (long i = 0; i < N; i++) x[i] = round_fp16_value(x[i]);
}

}  // namespace

void round_to_dtype(float* x, long N, ComputeDtype d) {
  if (d == ComputeDtype::kBf16) round_bf16(x, N);
  if (d == ComputeDtype::kFp16) round_fp16(x, N);
}

void widen_bf16(float* out, const uint16_t* in, long N) {
#pragma omp parallel for simd schedule(static)
  for (long i = 0; i < N; i++) {
    const uint32_t bits = static_cast<uint32_t>(in[i]) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    out[i] = f;
  }
}

}  // namespace anvil::cpu
