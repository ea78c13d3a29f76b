// Vectorisable math for the fast CPU kernels. libm's expf is a scalar call the compiler cannot
// vectorise, and the softmax of cross-entropy evaluates it B·T·V times per step.
#pragma once
#include <cstdint>
#include <cstring>

// Compile the function for AVX-512, AVX2+FMA and baseline x86-64; the loader picks the best
// the CPU runs (GCC function multiversioning), so one binary is fast everywhere.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define ANVIL_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define ANVIL_CPU_CLONES
#endif

namespace anvil::cpu {

// e^x for float, relative error below 3e-7 (2.5 ulp) on [-87, 88]; underflows to 0 below.
// x = n·ln2 + r with |r| <= ln2/2, e^r by a degree-6 polynomial, 2^n placed in the exponent.
#pragma omp declare simd notinbranch
inline float exp_approx(float x) {
  // Two selects whose comparisons always run: a nested one would evaluate its inner comparison
  // conditionally, which GCC (trapping math) will not turn into vector code.
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  const float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;  // ln2 split in two for exactness
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// erfc(y) for y >= 0 as t·e^(P(t) - y²), t = 1/(1 + y/2), P of degree 10 fitted (Chebyshev, in
// double) to ln(erfc(y)·e^(y²)/t) over [0, 9.5]: relative error below 2e-6 where erfc(y) is above
// 1e-9 (y < 4.5) when evaluated in float, and no cancellation in the tail, so that 1 - erf(-y)
// keeps its relative accuracy where 1 + erf forms it by subtraction. Vectorises, unlike libm's erff.
inline float erfc_nonneg(float y) {
  const float t = 1.0f / (1.0f + 0.5f * y);
  float p = -1.385346055e-01f;
  p = p * t + 9.557606578e-01f;
  p = p * t - 2.756256342e+00f;
  p = p * t + 4.208256721e+00f;
  p = p * t - 3.542453527e+00f;
  p = p * t + 1.674250364e+00f;
  p = p * t - 7.205124497e-01f;
  p = p * t + 2.297005355e-01f;
  p = p * t + 3.535641432e-01f;
  p = p * t + 1.001802564e+00f;
  p = p * t - 1.265578270e+00f;
  return t * exp_approx(p - y * y);
}

}  // namespace anvil::cpu
