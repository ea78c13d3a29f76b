// The GEMM microkernel for AVX-512 (F, BW, VL, DQ; compiled with those flags, run only where
// the CPU has them): 12 × 32 tiles, 24 accumulators. bf16 products use it too on CPUs without
// AVX512-BF16 (gemm.cpp); gemm_kernels_avx512bf16.cpp has the instruction itself.
#include <immintrin.h>

#include "kernels/cpu/gemm_blocked.h"

namespace anvil::cpu {
namespace {

struct Avx512 {
  static constexpr int W = 16;
  using Vec = __m512;
  static Vec zero() { return _mm512_setzero_ps(); }
  static Vec load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
  static Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
  static Vec bcast(float s) { return _mm512_set1_ps(s); }
  static Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
};

}  // namespace

const GemmKernels& gemm_kernels_avx512() {
  static const GemmKernels kernels{blocked_fp32<Avx512, 12, 2>, nullptr};
  return kernels;
}

}  // namespace anvil::cpu
