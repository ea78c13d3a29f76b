// `anvil bench gemm`: the CPU's matrix products as training runs them (anvil's GEMM on all
// threads, kernels/cpu/gemm.h) beside OpenBLAS's sgemm on the same shapes, alternating in one
// run; bf16 products on each instruction set this CPU has for them; and oneDNN's matmul (what
// PyTorch's CPU autocast runs), fp32 and bf16, where libdnnl is installed.
#pragma once
#include <string>
#include <vector>

namespace anvil {

// A bf16 product on one instruction set (kernels/cpu/gemm.h: the same bits on each but AMX).
struct BenchGemmPath {
  std::string isa;  // "avx512" (fp32 FMAs on rounded operands), "avx512_bf16" (VDPBF16PS), "amx"
  double gflops = 0;
};

struct BenchGemmRow {
  std::string name;       // e.g. "bench-16m LM head, forward"
  int M = 0, N = 0, K = 0;
  double anvil_fp32 = 0;  // GFLOP/s, best of the rounds
  double anvil_bf16 = 0;  // the bf16 mode (amp_bf16's products) on the path training takes
  std::vector<BenchGemmPath> bf16_paths;  // each path this CPU has, training's among them
  double openblas = 0;    // sgemm, fp32
  double onednn_fp32 = 0, onednn_bf16 = 0;  // oneDNN's matmul, where libdnnl is installed
  std::string onednn_bf16_kernel;           // the implementation oneDNN chose for bf16
};

// The instruction set amp_bf16's products take in training (gemm_isa).
std::string bench_gemm_bf16_training_isa();
// Empty where oneDNN is timed too; otherwise why it is not (libdnnl.so.2 missing).
std::string bench_gemm_onednn_missing();

// Each of `rounds` alternating rounds times every product for at least min_seconds; a row keeps
// each side's best.
std::vector<BenchGemmRow> bench_gemm(int rounds, double min_seconds);

}  // namespace anvil
