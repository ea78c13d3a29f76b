// The bf16 GEMM microkernel on VDPBF16PS (AVX512-BF16: compiled with that flag, run only where
// the CPU has it): one instruction per pair of k, twice the products of fp32 FMAs per cycle.
// Its fp32 kernel is the AVX-512 one.
#include "kernels/cpu/gemm_avx512.h"
#include "kernels/cpu/gemm_blocked.h"

namespace anvil::cpu {
namespace {

struct Avx512Bf16 : Avx512 {
  using Pairs = __m512bh;
  using PairScalar = __m512bh;
  static Pairs load_pairs(const uint32_t* p) { return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p)); }
  static PairScalar bcast_pair(uint32_t w) {
    return reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(w)));
  }
  static Vec dot_pair(PairScalar a, Pairs b, Vec acc) { return _mm512_dpbf16_ps(acc, a, b); }
};

}  // namespace

const GemmKernels& gemm_kernels_avx512bf16() {
  static const GemmKernels kernels = with_pairs<Avx512Bf16, 12, 2>(gemm_kernels_avx512());
  return kernels;
}

}  // namespace anvil::cpu
