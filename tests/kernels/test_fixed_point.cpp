// Fixed-point gradient accumulation: rounding, range checks and exact sums of squares.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/rng.h"
#include "kernels/fixed_point.h"

namespace anvil {
namespace {

std::vector<float> random_values(size_t n, uint64_t seed, float scale) {
  Rng rng(seed, 0);
  std::vector<float> v(n);
  for (float& x : v) x = scale * static_cast<float>(rng.uniform() * 2.0 - 1.0);
  return v;
}

// The floats a fixed-point array stands for at scale s.
std::vector<float> values_of(const std::vector<int64_t>& acc, int s) {
  std::vector<float> out(acc.size());
  for (size_t i = 0; i < acc.size(); i++) out[i] = static_cast<float>(std::ldexp(static_cast<double>(acc[i]), -s));
  return out;
}

TEST(FixedPoint, RoundsToNearestEvenAndClearsTheInput) {
  // Ties at scale 2^0: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -1.5 -> -2; and ordinary values.
  std::vector<float> x = {0.5f, 1.5f, 2.5f, -1.5f, -0.75f, 3.25f, 1e6f, -7.0f};
  std::vector<int64_t> acc(x.size(), 10);
  float m = 0.0f;
  fixed_point_accumulate(KernelImpl::kCpu, acc.data(), x.data(), x.size(), 1, 0, 0, &m, true);
  EXPECT_EQ(m, 1e6f);
  const std::vector<int64_t> want = {10, 12, 12, 8, 9, 13, 1000010, 3};
  EXPECT_EQ(acc, want);
  for (float v : x) EXPECT_EQ(v, 0.0f);
}

TEST(FixedPoint, MatchesLlrintAtLargeScales) {
  std::vector<float> x = random_values(1000, 1, 3.0f);
  const std::vector<float> copy = x;
  std::vector<int64_t> acc(x.size(), 0);
  const int s = fixed_point_scale(3.0f, 8);
  float m = 0.0f;
  fixed_point_accumulate(KernelImpl::kCpu, acc.data(), x.data(), x.size(), 1, 0, s, &m, true);
  for (size_t i = 0; i < x.size(); i++) EXPECT_EQ(acc[i], std::llrint(std::ldexp(static_cast<double>(copy[i]), s)));
}

// The threaded path (large n) rounds each element the same way as the serial one.
TEST(FixedPoint, LargeArraysGiveTheSameResult) {
  const size_t n = (size_t{1} << 17) + 3;
  std::vector<float> a = random_values(n, 2, 1e-3f), b = a;
  std::vector<int64_t> whole(n, 0), pieces(n, 0);
  const int s = fixed_point_scale(1e-3f, 64);
  float m1 = 0.0f, m2 = 0.0f;
  fixed_point_accumulate(KernelImpl::kCpu, whole.data(), a.data(), n, 1, 0, s, &m1, true);
  for (size_t lo = 0; lo < n; lo += 1000) {
    const size_t len = std::min<size_t>(1000, n - lo);
    fixed_point_accumulate(KernelImpl::kCpu, pieces.data() + lo, b.data() + lo, len, 1, 0, s, &m2, true);
  }
  EXPECT_EQ(m1, m2);
  EXPECT_EQ(whole, pieces);
}

// Several sequences' spans at once: the integers, the zeroed spans and the maximum of one call
// per span, and the values between the spans untouched.
TEST(FixedPoint, CopiesAtOnceAreOneCallPerCopy) {
  const size_t n = 1003, stride = 1008;
  const int copies = 5;
  std::vector<float> together = random_values(copies * stride, 4, 0.05f), apart = together;
  together[2 * stride + 17] = -0.5f;  // the largest, in the third copy
  apart[2 * stride + 17] = -0.5f;
  std::vector<int64_t> acc_together(n), acc_apart;
  for (size_t i = 0; i < n; i++) acc_together[i] = static_cast<int64_t>(i * 131) - 60000;
  acc_apart = acc_together;
  const int s = fixed_point_scale(0.5f, 64);
  float m_together = 0.0f, m_apart = 0.0f;
  fixed_point_accumulate(KernelImpl::kCpu, acc_together.data(), together.data(), n, copies, stride, s, &m_together,
                         true);
  for (int c = 0; c < copies; c++)
    fixed_point_accumulate(KernelImpl::kCpu, acc_apart.data(), apart.data() + c * stride, n, 1, 0, s, &m_apart, true);
  EXPECT_EQ(acc_together, acc_apart);
  EXPECT_EQ(m_together, 0.5f);
  EXPECT_EQ(m_apart, 0.5f);
  EXPECT_EQ(together, apart);  // each span zeroed, the gaps as they were
  EXPECT_NE(together[stride - 1], 0.0f);
}

// Summing per-sample contributions in any grouping, then converting, gives the same floats; and
// the result is the exact sum to well below fp32 precision.
TEST(FixedPoint, AnyGroupingGivesTheSameBits) {
  const size_t n = 257, samples = 8;
  std::vector<std::vector<float>> g;
  for (size_t k = 0; k < samples; k++) g.push_back(random_values(n, 10 + k, 0.01f));
  const int s = fixed_point_scale(0.01f, samples);
  auto sum = [&](const std::vector<std::vector<size_t>>& groups) {
    std::vector<int64_t> total(n, 0);
    for (const auto& group : groups) {  // one "rank" per group, then an integer reduction
      std::vector<int64_t> part(n, 0);
      for (size_t k : group) {
        std::vector<float> x = g[k];
        float m = 0.0f;
        fixed_point_accumulate(KernelImpl::kCpu, part.data(), x.data(), n, 1, 0, s, &m, true);
      }
      for (size_t i = 0; i < n; i++) total[i] += part[i];
    }
    return values_of(total, s);
  };
  const std::vector<float> a = sum({{0, 1, 2, 3, 4, 5, 6, 7}});
  const std::vector<float> b = sum({{7, 3}, {1}, {0, 2, 4, 6, 5}});
  EXPECT_EQ(a, b);
  for (size_t i = 0; i < n; i++) {
    double exact = 0;
    for (size_t k = 0; k < samples; k++) exact += g[k][i];
    EXPECT_NEAR(a[i], exact, 1e-7 * std::fabs(exact) + 1e-12);
  }
}

TEST(FixedPoint, SumOfSquaresSplitsExactly) {
  std::vector<float> x = random_values(5000, 3, 0.5f);
  std::vector<int64_t> acc(x.size(), 0);
  const int s = fixed_point_scale(0.5f, 1);
  double direct = 0;
  for (float v : x) direct += static_cast<double>(v) * v;
  float m = 0.0f;
  fixed_point_accumulate(KernelImpl::kCpu, acc.data(), x.data(), x.size(), 1, 0, s, &m, true);
  unsigned __int128 whole = 0, parts[2] = {0, 0};
  const size_t all[] = {0, acc.size()}, split[] = {0, 1234, acc.size()};
  fixed_point_squares(KernelImpl::kCpu, acc.data(), acc.size(), all, 1, &whole);
  fixed_point_squares(KernelImpl::kCpu, acc.data(), acc.size(), split, 2, parts);
  EXPECT_TRUE(whole == parts[0] + parts[1]);
  const double norm2 = std::ldexp(static_cast<double>(whole), kSquareShift - 2 * s);
  EXPECT_NEAR(norm2, direct, 1e-9 * direct);
}

// The CPU's sum of squares works in 64-bit lanes (32-bit halves, 30-bit limbs): against the
// 128-bit reference at the edges of every split, the extremes of int64 and random full-range
// values, where any lost carry shows.
TEST(FixedPoint, SumOfSquaresIsExactOverTheWholeInt64Range) {
  std::vector<int64_t> acc = {0, 1, -1, INT64_MAX, INT64_MIN, INT64_MIN + 1};
  for (int e : {20, 31, 32, 33, 39, 40, 41, 51, 52, 62}) {
    const int64_t p = int64_t{1} << e;
    for (int64_t v : {p - 1, p, p + 1}) {
      acc.push_back(v);
      acc.push_back(-v);
    }
  }
  for (uint64_t i = 0; i < 3000; i++) {  // full-range values from the project's counter RNG
    const double u = normal_at(99, 7, i), w = normal_at(99, 8, i);
    acc.push_back(static_cast<int64_t>((static_cast<uint64_t>(std::fabs(u) * 1e9) << 33) ^
                                       static_cast<uint64_t>(std::fabs(w) * 1e12)) *
                  (u < 0 ? -1 : 1));
  }
  for (size_t n : {acc.size(), size_t{6}, size_t{17}}) {
    const size_t bounds[] = {0, n};
    unsigned __int128 want = 0, got = 0;
    ref::fixed_point_squares(acc.data(), n, bounds, 1, &want);
    cpu::fixed_point_squares(acc.data(), n, bounds, 1, &got);
    EXPECT_TRUE(got == want) << n << " values";
  }
}

// The embedding-rows form reads and clears the compact rows (one per touched row) and nothing
// after them, adding compact row r into row touched[r]; the maximum is the largest magnitude.
// (Every backend's bits against the reference's: the op table, tests/kernels/op_table.cpp.)
TEST(FixedPoint, RowsFormAddsEachCompactRowIntoItsRow) {
  const size_t rows = 1800, row_len = 37, n = rows * row_len;
  const std::vector<float> x0 = random_values(n, 4, 0.02f);
  const std::vector<int32_t> touched = {7, 0, 49, 12, 13};
  const int s = fixed_point_scale(0.02f, 16);
  std::vector<int64_t> acc(n, 0);
  std::vector<float> x = x0;
  float max_abs = 0.0f;
  fixed_point_accumulate_rows(KernelImpl::kCpu, acc.data(), x.data(), touched.data(), touched.size(), row_len, s,
                              &max_abs);
  for (size_t r = 0; r < rows; r++) EXPECT_EQ(x[r * row_len], r < touched.size() ? 0.0f : x0[r * row_len]) << r;
  for (size_t r = 0; r < touched.size(); r++)
    EXPECT_EQ(acc[touched[r] * row_len + 3], std::llrint(std::ldexp(static_cast<double>(x0[r * row_len + 3]), s)));
  EXPECT_EQ(acc[1 * row_len + 3], 0) << "an untouched row";
  float biggest_touched = 0.0f, biggest = 0.0f;
  for (size_t i = 0; i < n; i++) {
    biggest = std::max(biggest, std::fabs(x0[i]));
    if (i < touched.size() * row_len) biggest_touched = std::max(biggest_touched, std::fabs(x0[i]));
  }
  EXPECT_EQ(max_abs, biggest_touched);
  x = x0;
  max_abs = 0.0f;
  fixed_point_accumulate(KernelImpl::kCpu, acc.data(), x.data(), n, 1, 0, s, &max_abs, true);
  EXPECT_EQ(max_abs, biggest);
}

TEST(FixedPoint, ScaleLeavesHeadroomAndOverflowIsDetected) {
  const int s = fixed_point_scale(0.3f, 12);
  EXPECT_TRUE(fixed_point_fits(0.3f, s, 12));
  EXPECT_TRUE(fixed_point_fits(0.3f * 15.0f, s, 12));   // growth within the 16x headroom
  EXPECT_FALSE(fixed_point_fits(0.3f * 40.0f, s, 12));  // beyond it: the step runs again
  // The per-sample limit shrinks for batches over 4096 sequences, so sums stay under 2^62.
  EXPECT_LT(fixed_point_scale(0.3f, 1 << 14), fixed_point_scale(0.3f, 4096));
  EXPECT_EQ(fixed_point_scale(0.0f, 12), fixed_point_scale(0.75f, 12));  // no history: assume below 1
}

}  // namespace
}  // namespace anvil
