// Counter-based random numbers: every value is a hash of (seed, stream, counter).
#include "core/rng.h"

#include <cmath>

namespace anvil {

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

namespace {
uint64_t key(uint64_t seed, uint64_t stream, uint64_t counter) {
  return mix64(mix64(mix64(seed) ^ stream) ^ counter);
}
double to_unit(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }
}  // namespace

double uniform_at(uint64_t seed, uint64_t stream, uint64_t counter) {
  return to_unit(key(seed, stream, counter));
}

double normal_at(uint64_t seed, uint64_t stream, uint64_t counter) {
  // Box-Muller on two independent uniforms derived from the same counter.
  uint64_t k = key(seed, stream, counter);
  double u1 = (static_cast<double>(k >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]: log is finite
  double u2 = to_unit(mix64(k ^ 0x5851f42d4c957f2dULL));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

uint64_t Rng::next_u64() { return key(seed_, stream_, counter_++); }

uint64_t Rng::below(uint64_t n) {
  // Rejection sampling removes the modulo bias.
  uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do x = next_u64(); while (x >= limit);
  return x % n;
}

}  // namespace anvil
