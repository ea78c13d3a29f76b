// The GEMM microkernel in portable C++ (std::fma per lane), for CPUs without AVX2+FMA: slow,
// but the same bits as the vector kernels.
#include "kernels/cpu/gemm_blocked.h"
#include "kernels/cpu/gemm_portable.h"

namespace anvil::cpu {

const GemmKernels& gemm_kernels_portable() {
  static const GemmKernels kernels = fp32_kernels<PortableLanes<8>, 4, 1>();
  return kernels;
}

}  // namespace anvil::cpu
