// Timing a product for its best rate: one warm-up run, then repeats until both min_reps runs and
// min_seconds have passed. The best run, not the mean: on a shared machine a slow moment says
// nothing about the code, and a short window can catch one.
#pragma once
#include <algorithm>
#include <chrono>

namespace anvil::cpu {

template <class Run>
double best_gflops(double flops, double min_seconds, int min_reps, const Run& run) {
  run();
  double best = 0, spent = 0;
  for (int rep = 0; rep < min_reps || spent < min_seconds; rep++) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    spent += s;
    best = std::max(best, flops / s / 1e9);
  }
  return best;
}

}  // namespace anvil::cpu
