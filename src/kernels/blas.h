// The BLAS underneath the CPU matmuls (OpenBLAS): choosing its AVX-512 kernels, describing it,
// and measuring the machine's peak GEMM rate, the denominator of MFU on CPU.
#pragma once
#include <string>

namespace anvil {

// OpenBLAS picks its kernels when it is loaded, from OPENBLAS_CORETYPE, and Debian's 0.3.21
// mistakes AVX-512 Zen CPUs for Haswell (AVX2). Call first thing in main(): when the CPU has
// AVX-512 and the variable is unset, it sets it and re-executes the program.
void blas_select_kernels(char** argv);

std::string blas_description();  // e.g. "OpenBLAS 0.3.21 (SkylakeX kernels, 2 threads)"

// Measured fp32 GEMM rate of this machine in GFLOP/s (large square sgemm, all threads),
// cached after the first call.
double measured_peak_gflops();

}  // namespace anvil
