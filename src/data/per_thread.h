// One value per OpenMP thread: what lets one tokenizer encode on several threads at once (each
// thread keeps its own cache of encoded pieces; the rest of a tokenizer is read-only).
#pragma once
#include <omp.h>

#include <algorithm>
#include <vector>

#include "core/error.h"

namespace anvil {

template <class T>
class PerThread {
 public:
  PerThread() : values_(static_cast<size_t>(std::max({1, omp_get_max_threads(), omp_get_num_procs()}))) {}
  T& local() {
    const size_t t = static_cast<size_t>(omp_get_thread_num());
    ANVIL_CHECK(t < values_.size(), "thread {} of more than the {} this was made for", t, values_.size());
    return values_[t].value;
  }

 private:
  // Each thread's value on cache lines of its own: a value written by one thread (a cache's
  // counts and ends) must not evict what the others read.
  struct alignas(64) Padded {
    T value;
  };
  std::vector<Padded> values_;
};

}  // namespace anvil
