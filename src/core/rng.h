// Random numbers as pure functions of (seed, stream, counter): the same value whichever thread,
// rank or order asks for it, which the determinism contract needs for init, shuffles and sampling.
#pragma once
#include <cstdint>

namespace anvil {

// A strong 64-bit mix (SplitMix64's finaliser); the building block of everything below.
uint64_t mix64(uint64_t x);

// Uniform in [0, 1) and standard normal for element `counter` of stream `stream` under `seed`.
double uniform_at(uint64_t seed, uint64_t stream, uint64_t counter);
double normal_at(uint64_t seed, uint64_t stream, uint64_t counter);

// A sequential generator for code that draws one value after another (sampling, shuffles).
class Rng {
 public:
  Rng(uint64_t seed, uint64_t stream) : seed_(seed), stream_(stream) {}
  double uniform() { return uniform_at(seed_, stream_, counter_++); }
  uint64_t next_u64();
  uint64_t below(uint64_t n);  // uniform in [0, n), unbiased

 private:
  uint64_t seed_, stream_, counter_ = 0;
};

}  // namespace anvil
