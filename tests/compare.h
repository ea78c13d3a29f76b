// Comparison helpers for tests, with the one table of tolerances. Element-wise checks use
// |x - ref| <= atol + rtol·|ref|; failures report the worst index and the first few pairs.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/rng.h"

namespace anvil::testing {

// n values of scale · N(0, 1), the same for the same (n, stream) in every test.
inline std::vector<float> randn(size_t n, uint64_t stream, float scale = 1.0f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = scale * static_cast<float>(normal_at(1234, stream, i));
  return v;
}

struct Tolerance {
  double atol, rtol;
};
// fp32 kernels against the double-accumulating reference. Element-wise ops round once per
// element; reductions over up to ~5e4 terms (vocabulary) accumulate float error ~ sqrt(n)·eps.
constexpr Tolerance kFp32Elementwise{1e-6, 1e-5};
constexpr Tolerance kFp32Reduction{1e-5, 1e-4};
// fp32 arithmetic within kFp32Elementwise, then rounded to a 16-bit dtype: the two sides can
// round to neighbours, one unit of the format apart (bf16: 8 significant bits, so up to 2^-7
// relative; fp16: 11 bits, 2^-10).
constexpr Tolerance kBf16Rounded{1e-6, 8e-3};
constexpr Tolerance kFp16Rounded{1e-6, 1e-3};
// Attention whose products round the probabilities and score gradients to 16 bits (attention.h:
// operands) against fp32: each rounding is within 2^-9 (bf16) or 2^-12 (fp16) relative.
constexpr double kBf16AttentionRelNorm = 4e-3;
constexpr double kFp16AttentionRelNorm = 6e-4;
// Relative norm error ||x - ref|| / ||ref||, for matmuls and whole-model comparisons.
constexpr double kFp32RelNorm = 1e-5;
// A model trained a few steps with 16-bit matrix products against fp32: bf16 rounds each operand
// to 8 significant bits (relative 2^-9 ≈ 2e-3); errors of that size over a few steps.
constexpr double kBf16RelNorm = 1e-2;

inline ::testing::AssertionResult all_close(const float* got, const float* want, size_t n,
                                            Tolerance tol) {
  size_t bad = 0, worst = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < n; i++) {
    double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    double allowed = tol.atol + tol.rtol * std::fabs(static_cast<double>(want[i]));
    bool ok = err <= allowed;  // NaN fails
    if (!ok) bad++;
    double excess = std::isnan(err) ? 1e300 : err - allowed;
    if (excess > worst_excess) worst_excess = excess, worst = i;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  auto r = ::testing::AssertionFailure();
  r << bad << " of " << n << " elements out of tolerance (atol " << tol.atol << ", rtol " << tol.rtol
    << "); worst at " << worst << ": got " << got[worst] << " want " << want[worst] << "; first:";
  for (size_t i = 0, shown = 0; i < n && shown < 5; i++) {
    double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= tol.atol + tol.rtol * std::fabs(static_cast<double>(want[i])))) {
      r << " [" << i << "] " << got[i] << " vs " << want[i];
      shown++;
    }
  }
  return r;
}

inline double rel_norm_error(const float* got, const float* want, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

inline ::testing::AssertionResult rel_norm_close(const float* got, const float* want, size_t n,
                                                 double tol) {
  double e = rel_norm_error(got, want, n);
  if (e <= tol) return ::testing::AssertionSuccess();
  size_t worst = 0;
  double wd = -1;
  for (size_t i = 0; i < n; i++) {
    double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(d <= wd)) wd = d, worst = i;
  }
  return ::testing::AssertionFailure() << "relative norm error " << e << " > " << tol
                                       << "; worst at " << worst << ": got " << got[worst]
                                       << " want " << want[worst];
}

}  // namespace anvil::testing
