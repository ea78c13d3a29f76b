// Fixed-point accumulation on the CPU: OpenMP over elements, SIMD within; see fixed_point.h.
#include "kernels/fixed_point.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec_math.h"

namespace anvil::cpu {
namespace {

constexpr size_t kParallelMin = size_t{1} << 16;

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

ANVIL_CPU_CLONES float accumulate_range(int64_t* acc, float* x, size_t n, double scale, bool clear) {
  float m = 0.0f;
#pragma omp simd reduction(max : m)
  for (size_t i = 0; i < n; i++) {
    const float a = std::fabs(x[i]);
    m = std::max(m, a == a ? a : std::numeric_limits<float>::infinity());
    acc[i] = fixed_point_add(acc[i], round_scaled(x[i], scale));
    if (clear) x[i] = 0.0f;
  }
  return m;
}

}  // namespace

void fixed_point_accumulate(int64_t* acc, float* x, size_t n, int copies, size_t stride, int s, float* max_abs,
                            bool clear) {
  const double scale = std::ldexp(1.0, s);
  float m = 0.0f;
  // (The CPU's grains are one sequence: copies is 1 there, and a copy at a time costs nothing more.)
  for (int c = 0; c < copies; c++) {
    float* xc = x + c * stride;
    if (n < kParallelMin) {
      m = std::max(m, accumulate_range(acc, xc, n, scale, clear));
    } else {
      // Each element is rounded on its own and the maximum is exact: the split cannot change a bit.
      over_threads(n, [&](size_t lo, size_t hi) {
        const float part = accumulate_range(acc + lo, xc + lo, hi - lo, scale, clear);
#pragma omp critical
        m = std::max(m, part);
      });
    }
  }
  *max_abs = std::max(*max_abs, m);
}

void fixed_point_accumulate_rows(int64_t* acc, float* x, const int32_t* rows, size_t n_rows, size_t row_len, int s,
                                 float* max_abs) {
  const double scale = std::ldexp(1.0, s);
  float m = 0.0f;
  for (size_t r = 0; r < n_rows; r++)
    m = std::max(m, accumulate_range(acc + static_cast<size_t>(rows[r]) * row_len, x + r * row_len, row_len, scale,
                                     true));
  *max_abs = std::max(*max_abs, m);
}

// Σ floor(a² / 2^40) over |acc[i]| = a, exactly, in 64-bit lanes so that the loop vectorises
// (a 64 × 64 → 128-bit product per element does not): a = h·2^32 + l gives a² = H·2^64 + L from
// three 32 × 32-bit products, and each floor(a² / 2^40) < 2^87 is summed as three limbs of 30
// bits in separate 64-bit sums, which cannot overflow within kSquaresBlock elements.
namespace {

static_assert(kSquareShift == 40, "the limbs below are cut for a shift of 40");
constexpr size_t kSquaresBlock = size_t{1} << 32;

ANVIL_CPU_CLONES unsigned __int128 squares_range(const int64_t* acc, size_t n) {
  uint64_t s0 = 0, s1 = 0, s2 = 0;
#pragma omp simd reduction(+ : s0, s1, s2)
  for (size_t i = 0; i < n; i++) {
    const uint64_t v = static_cast<uint64_t>(acc[i]);
    const uint64_t a = acc[i] < 0 ? 0 - v : v;  // <= 2^63
    const uint64_t l = a & 0xFFFFFFFFu, h = a >> 32;
    const uint64_t ll = l * l, m = h * l, hh = h * h;  // a² = hh·2^64 + m·2^33 + ll
    const uint64_t L = ll + (m << 33);
    const uint64_t H = hh + (m >> 31) + (L < ll ? 1 : 0);
    // floor(a² / 2^40) = H·2^24 + (L >> 40), as limbs of 30 bits.
    s0 += ((H & 63) << 24) | (L >> 40);
    s1 += (H >> 6) & 0x3FFFFFFFu;
    s2 += H >> 36;
  }
  using u128 = unsigned __int128;
  return (static_cast<u128>(s2) << 60) + (static_cast<u128>(s1) << 30) + s0;
}

}  // namespace

void fixed_point_squares(const int64_t* acc, size_t, const size_t* bounds, size_t tensors,
                         unsigned __int128* squares) {
  using u128 = unsigned __int128;
  auto range = [&](size_t lo, size_t hi) {
    u128 total = 0;
    for (size_t i = lo; i < hi; i += kSquaresBlock) total += squares_range(acc + i, std::min(kSquaresBlock, hi - i));
    return total;
  };
  for (size_t k = 0; k < tensors; k++) {
    const size_t lo = bounds[k], hi = bounds[k + 1];
    if (hi - lo < kParallelMin) {
      squares[k] = range(lo, hi);
      continue;
    }
    u128 total = 0;
    over_threads(hi - lo, [&](size_t a, size_t b) {
      const u128 part = range(lo + a, lo + b);
#pragma omp critical
      total += part;  // integers: any order gives the same sum
    });
    squares[k] = total;
  }
}

void fixed_point_add_arrays(int64_t* acc, const int64_t* x, size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; i++) acc[i] = fixed_point_add(acc[i], x[i]);
}

}  // namespace anvil::cpu
