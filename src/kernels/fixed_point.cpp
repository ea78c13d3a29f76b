// The fixed-point scale rules; see fixed_point.h.
#include "kernels/fixed_point.h"

#include <algorithm>
#include <cmath>

namespace anvil {
namespace {

constexpr int kHeadroomBits = 4;

int limit_bits(int64_t samples) {
  int log2_samples = 0;
  while ((int64_t{1} << log2_samples) < samples) log2_samples++;
  return std::min(50, 62 - log2_samples);
}

}  // namespace

int fixed_point_scale(float max_abs, int64_t samples) {
  int e = 0;  // max_abs < 2^e
  if (max_abs > 0.0f) std::frexp(max_abs, &e);
  return limit_bits(samples) - kHeadroomBits - e;
}

bool fixed_point_fits(float max_abs, int s, int64_t samples) {
  return std::ldexp(static_cast<double>(max_abs), s) < std::ldexp(1.0, limit_bits(samples));
}

}  // namespace anvil
