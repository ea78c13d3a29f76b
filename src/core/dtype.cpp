#include "core/dtype.h"

#include <cmath>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "core/error.h"

namespace anvil {

double float_as_written(float f) { return std::stod(fmt::format("{}", f)); }
namespace {
uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
}  // namespace

const char* dtype_name(ComputeDtype d) {
  return d == ComputeDtype::kFp32 ? "fp32" : d == ComputeDtype::kBf16 ? "bf16" : "fp16";
}

uint16_t float_to_bf16(float f) {
  uint32_t u = bits_of(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float bf16_to_float(uint16_t h) { return float_of(static_cast<uint32_t>(h) << 16); }

uint16_t float_to_fp16(float f) {
  const uint32_t u = bits_of(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;     // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;    // 65520 and above: infinity
  if (a < 0x38800000u) {                           // below 2^-14: a multiple of 2^-24
    const double units = std::nearbyint(static_cast<double>(float_of(a)) * 16777216.0);  // ties to even
    return sign | static_cast<uint16_t>(units);    // 1024 units is the smallest normal, encoded alike
  }
  // Normal: keep 10 of the 23 fraction bits, rounding to nearest even, and rebias 127 -> 15.
  const uint32_t rounded = a + 0xfffu + ((a >> 13) & 1u);
  return sign | static_cast<uint16_t>((rounded - (112u << 23)) >> 13);
}

float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu, fraction = h & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: fraction · 2^-24
    const float m = std::ldexp(static_cast<float>(fraction), -24);
    return float_of(sign | bits_of(m));
  }
  if (exponent == 31) return float_of(sign | 0x7f800000u | (fraction << 13));  // infinity, NaN
  return float_of(sign | ((exponent + 112u) << 23) | (fraction << 13));
}

}  // namespace anvil
