// The AVX-512 vector type of the GEMM templates (gemm_blocked.h), for the two source files
// compiled with AVX-512 flags: the fp32 kernel's and VDPBF16PS's.
#pragma once
#include <immintrin.h>

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
}  // namespace anvil::cpu
