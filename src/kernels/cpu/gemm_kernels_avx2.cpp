// The GEMM microkernel for AVX2 + FMA (compiled with -mavx2 -mfma; run only where the CPU has
// them): 6 × 16 tiles, 12 accumulators. bf16 products use it too (gemm.cpp).
#include <immintrin.h>

#include "kernels/cpu/gemm_blocked.h"

namespace anvil::cpu {
namespace {

struct Avx2 {
  static constexpr int W = 8;
  using Vec = __m256;
  static Vec zero() { return _mm256_setzero_ps(); }
  static Vec load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
  static Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
  static Vec bcast(float s) { return _mm256_set1_ps(s); }
  static Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
};

}  // namespace

const GemmKernels& gemm_kernels_avx2() {
  static const GemmKernels kernels = fp32_kernels<Avx2, 6, 2>();
  return kernels;
}

}  // namespace anvil::cpu
