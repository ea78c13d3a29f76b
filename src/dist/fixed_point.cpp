// Fixed-point accumulation loops; see fixed_point.h.
#include "dist/fixed_point.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/vec_math.h"

namespace anvil {
namespace {

constexpr int kHeadroomBits = 4;
constexpr size_t kParallelMin = size_t{1} << 16;

int limit_bits(int64_t samples) {
  int log2_samples = 0;
  while ((int64_t{1} << log2_samples) < samples) log2_samples++;
  return std::min(50, 62 - log2_samples);
}

// round(x · scale) for |x · scale| < 2^51: adding 1.5 · 2^52 leaves the integer part in the low
// mantissa bits, rounded to nearest even by the addition itself.
inline int64_t round_scaled(float x, double scale) {
  constexpr double kMagic = 6755399441055744.0;  // 1.5 · 2^52
  const double d = static_cast<double>(x) * scale + kMagic;
  int64_t bits, magic_bits;
  std::memcpy(&bits, &d, sizeof bits);
  std::memcpy(&magic_bits, &kMagic, sizeof magic_bits);
  return static_cast<int64_t>(static_cast<uint64_t>(bits) - static_cast<uint64_t>(magic_bits));  // wraps out of range
}

ANVIL_CPU_CLONES float accumulate_range(int64_t* acc, float* x, size_t n, double scale) {
  float m = 0.0f;
#pragma omp simd reduction(max : m)
  for (size_t i = 0; i < n; i++) {
    const float a = std::fabs(x[i]);
    m = std::max(m, a == a ? a : std::numeric_limits<float>::infinity());
    acc[i] = fixed_point_add(acc[i], round_scaled(x[i], scale));
    x[i] = 0.0f;
  }
  return m;
}

}  // namespace

float fixed_point_accumulate(int64_t* acc, float* x, size_t n, int s) {
  const double scale = std::ldexp(1.0, s);
  if (n < kParallelMin) return accumulate_range(acc, x, n, scale);
  float m = 0.0f;
  // Each element is rounded on its own and the maximum is exact, so the split cannot change a bit.
#pragma omp parallel reduction(max : m)
  {
    const size_t parts = static_cast<size_t>(omp_get_num_threads()), me = static_cast<size_t>(omp_get_thread_num());
    const size_t lo = n * me / parts, hi = n * (me + 1) / parts;
    m = std::max(m, accumulate_range(acc + lo, x + lo, hi - lo, scale));
  }
  return m;
}

void fixed_point_to_float(float* out, const int64_t* acc, size_t n, int s) {
  const double inv = std::ldexp(1.0, -s);
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; i++) out[i] = static_cast<float>(static_cast<double>(acc[i]) * inv);
}

unsigned __int128 fixed_point_sum_squares(const int64_t* acc, size_t n) {
  using u128 = unsigned __int128;
  auto range = [&](size_t lo, size_t hi) {
    u128 sum = 0;
    for (size_t i = lo; i < hi; i++) {
      const uint64_t a = acc[i] < 0 ? 0 - static_cast<uint64_t>(acc[i]) : static_cast<uint64_t>(acc[i]);
      sum += (static_cast<u128>(a) * a) >> kSquareShift;
    }
    return sum;
  };
  if (n < kParallelMin) return range(0, n);
  std::vector<u128> partial(static_cast<size_t>(omp_get_max_threads()), 0);
#pragma omp parallel
  {
    const size_t parts = static_cast<size_t>(omp_get_num_threads()), me = static_cast<size_t>(omp_get_thread_num());
    partial[me] = range(n * me / parts, n * (me + 1) / parts);
  }
  u128 sum = 0;
  for (u128 p : partial) sum += p;  // integers: any order gives the same sum
  return sum;
}

int fixed_point_scale(float max_abs, int64_t samples) {
  int e = 0;  // max_abs < 2^e
  if (max_abs > 0.0f) std::frexp(max_abs, &e);
  return limit_bits(samples) - kHeadroomBits - e;
}

bool fixed_point_fits(float max_abs, int s, int64_t samples) {
  return std::ldexp(static_cast<double>(max_abs), s) < std::ldexp(1.0, limit_bits(samples));
}

}  // namespace anvil
