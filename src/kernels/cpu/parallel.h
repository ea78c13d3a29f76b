// Work split over the OpenMP threads in one contiguous range each, for element-wise kernels whose
// per-range helper is compiled for several instruction sets (ANVIL_CPU_CLONES): range(lo, hi) runs
// once per thread, inside the parallel region, so it may combine its result under omp critical.
#pragma once
#include <omp.h>

#include <cstddef>

namespace anvil::cpu {

template <class F>
void over_threads(size_t n, F range) {
#pragma omp parallel
  {
    const size_t parts = static_cast<size_t>(omp_get_num_threads()), me = static_cast<size_t>(omp_get_thread_num());
    range(n * me / parts, n * (me + 1) / parts);
  }
}

}  // namespace anvil::cpu
