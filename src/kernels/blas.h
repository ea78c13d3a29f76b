// OpenBLAS, the CPU's yardstick: its sgemm rate is one side of the machine's measured peak (the
// MFU denominator, kernels/matmul.h) and the comparison of `anvil bench gemm`.
#pragma once
#include <string>

namespace anvil {

// OpenBLAS picks its kernels when it is loaded, from OPENBLAS_CORETYPE, and Debian's 0.3.21
// mistakes AVX-512 Zen CPUs for Haswell (AVX2). Call first thing in main(): when the CPU has
// AVX-512 and the variable is unset, it sets it and re-executes the program.
void blas_select_kernels(char** argv);

std::string blas_description();  // e.g. "OpenBLAS 0.3.21 (SkylakeX kernels, 2 threads)"

// OpenBLAS's measured sgemm rate on this machine in GFLOP/s (2048³, all threads), cached after
// the first call.
double openblas_peak_gflops();

}  // namespace anvil
