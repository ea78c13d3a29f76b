// Python's random draws and set order, where anvil must choose as a Python tool chooses: LLM
// Foundry's in-context-learning evaluation picks each question's few-shot examples with
// random.Random(seed).sample and .choice over one generator per task, and writes them in the
// iteration order of the Python set that holds them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace anvil {

// random.Random(seed) for a non-negative integer seed: MT19937 seeded by init_by_array over the
// seed's 32-bit words, as CPython seeds it.
class PythonRandom {
 public:
  explicit PythonRandom(uint64_t seed);
  // random.getrandbits(k) for 0 < k <= 32.
  uint32_t bits(int k);
  // random._randbelow(n): getrandbits(n.bit_length()) until below n (n < 2^32).
  int64_t below(int64_t n);
  // random.sample(range(n), k), in the order Python returns it.
  std::vector<int64_t> sample_range(int64_t n, int64_t k);
  // random.choice(range(n)).
  int64_t choice_range(int64_t n) { return below(n); }

 private:
  uint32_t next();
  uint32_t mt_[624];
  int index_ = 624;
};

// A CPython set of non-negative integers (hash(i) == i < 2^61 - 1): adds and removes probe and
// resize as setobject.c does, so that items() is the order a Python loop over the set sees.
class PythonIntSet {
 public:
  PythonIntSet() : slots_(8, kEmpty) {}
  void add(int64_t key);
  void remove(int64_t key);  // key must be present
  bool contains(int64_t key) const;
  int64_t size() const { return used_; }
  std::vector<int64_t> items() const;

 private:
  static constexpr int64_t kEmpty = -1, kDummy = -2;
  size_t find(int64_t key) const;  // the key's slot, or slots_.size()
  void resize(size_t min_used);
  std::vector<int64_t> slots_;
  int64_t fill_ = 0, used_ = 0;
};

// LLM Foundry's few-shot indices for the question at example_index of a dataset of n examples
// (llmfoundry/eval/datasets/utils.py, get_fewshot_sample_idxs): num_fewshot distinct indices other
// than example_index, drawn from rng, in the set's iteration order.
std::vector<int64_t> fewshot_indices(int64_t n, int64_t num_fewshot, int64_t example_index, PythonRandom& rng);

}  // namespace anvil
