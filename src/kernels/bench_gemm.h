// `anvil bench gemm`: the CPU's matrix products as training runs them (anvil's GEMM on all
// threads, kernels/cpu/gemm.h) beside OpenBLAS's sgemm on the same shapes, alternating in one run.
#pragma once
#include <string>
#include <vector>

namespace anvil {

struct BenchGemmRow {
  std::string name;       // e.g. "bench-16m LM head, forward"
  int M = 0, N = 0, K = 0;
  double anvil_fp32 = 0;  // GFLOP/s, best of the rounds
  double anvil_bf16 = 0;  // the bf16 mode (amp_bf16's products)
  double openblas = 0;    // sgemm, fp32
};

// Each of `rounds` alternating rounds times every product for at least min_seconds; a row keeps
// each side's best.
std::vector<BenchGemmRow> bench_gemm(int rounds, double min_seconds);

}  // namespace anvil
