// 16-bit formats: the scalar conversions (the specification) on values whose encoding is known,
// on every fp16 code, and against the CPU's own F16C conversion where it has one; the fast
// rounding kernel against them bit for bit.
#include <gtest/gtest.h>
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/round.h"

namespace anvil {
namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(Fp16, KnownEncodings) {
  EXPECT_EQ(float_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_fp16(-2.0f), 0xc000);
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7bff);                     // the largest finite
  EXPECT_EQ(float_to_fp16(65519.99f), 0x7bff);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00);                     // the tie rounds to infinity
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -14)), 0x0400);        // the smallest normal
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -24)), 0x0001);        // the smallest subnormal
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -25)), 0x0000);        // a tie: to even, zero
  EXPECT_EQ(float_to_fp16(std::ldexp(3.0f, -25)), 0x0002);        // a tie: to even, 2 units
  EXPECT_EQ(float_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // a tie: to even
  EXPECT_EQ(float_to_fp16(1.0f + std::ldexp(3.0f, -11)), 0x3c02);
  EXPECT_EQ(float_to_fp16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(float_to_fp16(std::numeric_limits<float>::quiet_NaN()) & 0x7e00, 0x7e00);
}

TEST(Fp16, EveryCodeRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; h++) {
    const float f = fp16_to_float(static_cast<uint16_t>(h));
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << h;
      continue;
    }
    ASSERT_EQ(float_to_fp16(f), h) << std::hex << h;
  }
}

__attribute__((target("f16c"))) uint16_t hardware_fp16(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }

TEST(Fp16, MatchesTheCpusF16cConversion) {
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "no F16C on this CPU";
  Rng rng(5, 0);
  for (int i = 0; i < 2000000; i++) {
    const uint32_t u = static_cast<uint32_t>(rng.next_u64());
    if ((u & 0x7fffffffu) > 0x7f800000u) continue;  // NaN payloads may differ
    const uint16_t hw = hardware_fp16(from_bits(u));
    ASSERT_EQ(float_to_fp16(from_bits(u)), hw) << std::hex << u;
  }
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);  // a tie: to even
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(3.0f, -8)), 0x3f82);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to infinity
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

// The vectorised kernel against the scalar conversions, bit for bit, over random bit patterns
// (every exponent) and the edges.
TEST(RoundToDtype, FastKernelMatchesReferenceBitForBit) {
  std::vector<float> x = {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, -70000.0f, std::ldexp(1.0f, -14),
                          std::ldexp(1.0f, -25), std::ldexp(3.0f, -25), std::ldexp(1.0f, -140),
                          1.0f + std::ldexp(1.0f, -8), 1.0f + std::ldexp(1.0f, -11),
                          std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::max()};
  Rng rng(9, 0);
  for (int i = 0; i < 100000; i++) x.push_back(from_bits(static_cast<uint32_t>(rng.next_u64())));
  for (ComputeDtype d : {ComputeDtype::kBf16, ComputeDtype::kFp16}) {
    std::vector<float> a = x, b = x;
    ref::round_to_dtype(a.data(), static_cast<long>(a.size()), d);
    cpu::round_to_dtype(b.data(), static_cast<long>(b.size()), d);
    for (size_t i = 0; i < x.size(); i++) {
      if (std::isnan(a[i])) {
        EXPECT_TRUE(std::isnan(b[i])) << i;
        continue;
      }
      ASSERT_EQ(bits(a[i]), bits(b[i])) << dtype_name(d) << " input " << std::hex << bits(x[i]);
    }
  }
  std::vector<float> same = x;
  cpu::round_to_dtype(same.data(), static_cast<long>(same.size()), ComputeDtype::kFp32);
  EXPECT_EQ(std::memcmp(same.data(), x.data(), x.size() * 4), 0);
}

}  // namespace
}  // namespace anvil
