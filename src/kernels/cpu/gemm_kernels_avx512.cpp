// The GEMM microkernel for AVX-512 (F, BW, VL, DQ; compiled with those flags, run only where
// the CPU has them): 12 × 32 tiles, 24 accumulators. bf16 products use it too on CPUs without
// AVX512-BF16 (gemm.cpp); gemm_kernels_avx512bf16.cpp has the instruction itself.
#include "kernels/cpu/gemm_avx512.h"
#include "kernels/cpu/gemm_blocked.h"

namespace anvil::cpu {

const GemmKernels& gemm_kernels_avx512() {
  static const GemmKernels kernels = fp32_kernels<Avx512, 12, 2>();
  return kernels;
}

}  // namespace anvil::cpu
