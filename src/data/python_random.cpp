#include "data/python_random.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "core/error.h"

namespace anvil {

namespace {
constexpr int kN = 624, kM = 397;
}  // namespace

PythonRandom::PythonRandom(uint64_t seed) {
  // init_genrand(19650218), then init_by_array over the seed's 32-bit words, lowest first.
  std::vector<uint32_t> key;
  do {
    key.push_back(static_cast<uint32_t>(seed));
    seed >>= 32;
  } while (seed);
  mt_[0] = 19650218u;
  for (int i = 1; i < kN; i++) mt_[i] = 1812433253u * (mt_[i - 1] ^ (mt_[i - 1] >> 30)) + static_cast<uint32_t>(i);
  int i = 1;
  size_t j = 0;
  for (int k = std::max<int>(kN, static_cast<int>(key.size())); k; k--) {
    mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1664525u)) + key[j] + static_cast<uint32_t>(j);
    i++;
    j++;
    if (i >= kN) {
      mt_[0] = mt_[kN - 1];
      i = 1;
    }
    if (j >= key.size()) j = 0;
  }
  for (int k = kN - 1; k; k--) {
    mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1566083941u)) - static_cast<uint32_t>(i);
    i++;
    if (i >= kN) {
      mt_[0] = mt_[kN - 1];
      i = 1;
    }
  }
  mt_[0] = 0x80000000u;
  index_ = kN;
}

uint32_t PythonRandom::next() {
  if (index_ >= kN) {
    for (int k = 0; k < kN; k++) {
      const uint32_t y = (mt_[k] & 0x80000000u) | (mt_[(k + 1) % kN] & 0x7fffffffu);
      mt_[k] = mt_[(k + kM) % kN] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
    }
    index_ = 0;
  }
  uint32_t y = mt_[index_++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

uint32_t PythonRandom::bits(int k) {
  ANVIL_CHECK(k > 0 && k <= 32, "getrandbits({}) is drawn here for 1 to 32 bits only", k);
  return next() >> (32 - k);
}

int64_t PythonRandom::below(int64_t n) {
  ANVIL_CHECK(n > 0 && n < (int64_t{1} << 32), "a draw below {} (expected 1 to 2^32 - 1)", n);
  const int k = std::bit_width(static_cast<uint64_t>(n));
  int64_t r = bits(k);
  while (r >= n) r = bits(k);
  return r;
}

std::vector<int64_t> PythonRandom::sample_range(int64_t n, int64_t k) {
  ANVIL_CHECK(k >= 0 && k <= n, "a sample of {} from {} (expected 0 to {})", k, n, n);
  std::vector<int64_t> result(static_cast<size_t>(k));
  // Python keeps a pool (a list) for small populations and a set of those drawn otherwise; the
  // two consume the generator differently.
  int64_t setsize = 21;
  if (k > 5) setsize += static_cast<int64_t>(std::pow(4.0, std::ceil(std::log(static_cast<double>(k * 3)) / std::log(4.0))));
  if (n <= setsize) {
    std::vector<int64_t> pool(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; i++) pool[i] = i;
    for (int64_t i = 0; i < k; i++) {
      const int64_t j = below(n - i);
      result[i] = pool[j];
      pool[j] = pool[n - i - 1];
    }
  } else {
    std::vector<int64_t> drawn;
    for (int64_t i = 0; i < k; i++) {
      int64_t j = below(n);
      while (std::find(drawn.begin(), drawn.end(), j) != drawn.end()) j = below(n);
      drawn.push_back(j);
      result[i] = j;
    }
  }
  return result;
}

namespace {
constexpr size_t kLinearProbes = 9;
constexpr int kPerturbShift = 5;
}  // namespace

size_t PythonIntSet::find(int64_t key) const {
  const size_t mask = slots_.size() - 1;
  size_t i = static_cast<size_t>(key) & mask;
  uint64_t perturb = static_cast<uint64_t>(key);
  while (true) {
    const size_t probes = i + kLinearProbes <= mask ? kLinearProbes : 0;
    for (size_t p = 0; p <= probes; p++) {
      if (slots_[i + p] == kEmpty) return slots_.size();
      if (slots_[i + p] == key) return i + p;
    }
    perturb >>= kPerturbShift;
    i = (i * 5 + 1 + perturb) & mask;
  }
}

bool PythonIntSet::contains(int64_t key) const { return find(key) < slots_.size(); }

void PythonIntSet::add(int64_t key) {
  ANVIL_CHECK(key >= 0, "a Python set of non-negative integers cannot hold {}", key);
  const size_t mask = slots_.size() - 1;
  size_t i = static_cast<size_t>(key) & mask;
  uint64_t perturb = static_cast<uint64_t>(key);
  size_t free_slot = slots_.size();  // the last removed slot passed, reused (setobject.c's freeslot)
  while (true) {
    const size_t probes = i + kLinearProbes <= mask ? kLinearProbes : 0;
    for (size_t p = 0; p <= probes; p++) {
      const int64_t s = slots_[i + p];
      if (s == key) return;
      if (s == kDummy) free_slot = i + p;
      if (s != kEmpty) continue;
      if (free_slot < slots_.size()) {
        slots_[free_slot] = key;
        used_++;
        return;
      }
      slots_[i + p] = key;
      fill_++;
      used_++;
      if (static_cast<size_t>(fill_) * 5 >= mask * 3) resize(static_cast<size_t>(used_ > 50000 ? used_ * 2 : used_ * 4));
      return;
    }
    perturb >>= kPerturbShift;
    i = (i * 5 + 1 + perturb) & mask;
  }
}

void PythonIntSet::remove(int64_t key) {
  const size_t at = find(key);
  ANVIL_CHECK(at < slots_.size(), "{} is not in the set", key);
  slots_[at] = kDummy;
  used_--;
}

void PythonIntSet::resize(size_t min_used) {
  size_t size = 8;
  while (size <= min_used) size <<= 1;
  const std::vector<int64_t> old = std::move(slots_);
  slots_.assign(size, kEmpty);
  const size_t mask = size - 1;
  for (const int64_t key : old) {
    if (key < 0) continue;
    size_t i = static_cast<size_t>(key) & mask;
    uint64_t perturb = static_cast<uint64_t>(key);
    while (true) {
      size_t found = size;
      if (slots_[i] == kEmpty) {
        found = i;
      } else if (i + kLinearProbes <= mask) {
        for (size_t p = 1; p <= kLinearProbes && found == size; p++)
          if (slots_[i + p] == kEmpty) found = i + p;
      }
      if (found < size) {
        slots_[found] = key;
        break;
      }
      perturb >>= kPerturbShift;
      i = (i * 5 + 1 + perturb) & mask;
    }
  }
  fill_ = used_;
}

std::vector<int64_t> PythonIntSet::items() const {
  std::vector<int64_t> out;
  for (const int64_t key : slots_)
    if (key >= 0) out.push_back(key);
  return out;
}

std::vector<int64_t> fewshot_indices(int64_t n, int64_t num_fewshot, int64_t example_index, PythonRandom& rng) {
  const int64_t k = std::min(n - 1, num_fewshot);
  PythonIntSet picked;
  for (const int64_t i : rng.sample_range(n, std::max<int64_t>(k, 0))) picked.add(i);
  if (picked.contains(example_index)) {
    picked.remove(example_index);
    if (picked.size() < n - 1) {
      int64_t r = rng.choice_range(n);
      while (picked.contains(r) || r == example_index) r = rng.choice_range(n);
      picked.add(r);
    }
  }
  return picked.items();
}

}  // namespace anvil
