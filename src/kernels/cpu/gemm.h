// anvil's own CPU matrix product. Every output element is one chain of fused multiply-adds over
// k in ascending order, so its bits depend on the element's row of A and column of B alone: not
// on M or N, on how the product is cut into blocks or threads, nor on which instruction set runs
// it (AVX-512, AVX2+FMA and the portable path agree bit for bit). That is what lets a matrix
// product span a whole microbatch and still give the result of one sequence at a time.
#pragma once
#include <cstdint>
#include <string>

namespace anvil::cpu {

// fp32: c = fma(a[k], b[k], c) for k = 0, 1, ..., K-1.
// bf16: the operands are rounded to bf16 (nearest even) and taken in pairs, the odd k first:
//   c = fma(a[2p+1], b[2p+1], c); c = fma(a[2p], b[2p], c)   for p = 0, 1, ...
// with bf16 subnormal inputs read as zero and subnormal results flushed to zero (an odd K is
// padded with a zero pair member). This is exactly what AVX512-BF16's VDPBF16PS computes, so the
// native instruction and the emulation on other CPUs give the same bits.
enum class GemmPrecision { fp32, bf16 };

// The instruction sets the microkernels are built for, best last.
enum class GemmIsa { portable, avx2, avx512, avx512bf16 };
GemmIsa gemm_best_isa();                 // the best this CPU runs
bool gemm_isa_supported(GemmIsa isa);    // whether this CPU runs it
std::string gemm_isa_name(GemmIsa isa);  // "avx2", ...

// A matrix operand: element (r, c) is at data[r * row_stride + c * col_stride].
struct GemmOperand {
  const float* data;
  long row_stride, col_stride;
};

// C (M×N, row stride ldc) = A (M×K) · B (K×N), or C += A · B when accumulate (the chain then
// starts from C's value instead of zero). Single-threaded; callers split the output into blocks
// for threads, which changes no bit. Uses thread-local packing buffers sized once.
void gemm(GemmPrecision precision, int M, int N, int K, GemmOperand a, GemmOperand b, float* c, long ldc,
          bool accumulate, GemmIsa isa = gemm_best_isa());
// gemm() on all OpenMP threads, the output cut into blocks (each one gemm() call): the same bits
// as a single call, whatever the thread count.
void parallel_gemm(GemmPrecision precision, int M, int N, int K, GemmOperand a, GemmOperand b, float* c, long ldc,
                   bool accumulate);

// Internals: one blocked implementation per instruction set (gemm_kernels_*.cpp, from the
// templates of gemm_blocked.h), which gemm() chooses from.
constexpr int kGemmKc = 256;   // k values per packed block (even: bf16 pairs never straddle blocks)
constexpr int kGemmMc = 96;    // rows of A per packed block: a multiple of every MR (4, 6, 12)
constexpr int kGemmNc = 2048;  // columns of B per packed block: a multiple of every NR (8, 16, 32)
struct GemmCall {
  int M, N, K;
  GemmOperand a, bt;          // A, and B transposed (Bᵀ's row j is B's column j)
  float* c;
  long ldc;
  bool accumulate;
  bool bf16_operands;         // the fp32 kernel emulating VDPBF16PS (gemm_blocked.h)
  void *a_buffer, *b_buffer;  // this thread's packing space: kGemmMc and kGemmNc rows × kGemmKc floats
};
struct GemmKernels {
  void (*fp32)(const GemmCall&);   // fp32 products, and bf16 ones when bf16_operands
  void (*pairs)(const GemmCall&);  // bf16 on VDPBF16PS; null without AVX512-BF16
};
const GemmKernels& gemm_kernels_portable();
const GemmKernels& gemm_kernels_avx2();
const GemmKernels& gemm_kernels_avx512();
const GemmKernels& gemm_kernels_avx512bf16();

}  // namespace anvil::cpu
