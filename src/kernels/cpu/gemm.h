// anvil's own CPU matrix product. Every output element is computed the same way whatever M or
// N, however the product is cut into blocks or threads, and whichever instruction set runs it
// (AVX-512, AVX2+FMA and the portable path agree bit for bit): k is taken in fixed blocks of
// kGemmKc; within a block the products are one chain of fused multiply-adds from zero in k
// order, and the blocks' sums are added to C in order. So an element's bits depend on its row of
// A and column of B alone, which is what lets a matrix product span a whole microbatch and still
// give the result of one sequence at a time.
#pragma once
#include <cstdint>
#include <string>

namespace anvil::cpu {

// fp32: a block's chain is s = fma(a[k], b[k], s) for its k in order.
// bf16: the operands are rounded to bf16 (nearest even) and taken in pairs, the odd k first:
//   s = fma(a[2p+1], b[2p+1], s); s = fma(a[2p], b[2p], s)   for the block's pairs p in order,
// with bf16 subnormal inputs read as zero and subnormal results (the adds to C included) flushed
// to zero; an odd K is padded with a zero pair member. This is exactly what AVX512-BF16's
// VDPBF16PS computes, so the native instruction and the emulation on other CPUs agree.
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

// C (M×N, row stride ldc) = A (M×K) · B (K×N), or C += A · B when accumulate. Single-threaded;
// uses thread-local packing buffers sized once.
void gemm(GemmPrecision precision, int M, int N, int K, GemmOperand a, GemmOperand b, float* c, long ldc,
          bool accumulate, GemmIsa isa = gemm_best_isa());
// gemm() on all OpenMP threads, the output cut into blocks (each one gemm() call): the same bits
// as a single call, whatever the thread count.
void parallel_gemm(GemmPrecision precision, int M, int N, int K, GemmOperand a, GemmOperand b, float* c, long ldc,
                   bool accumulate);

// Internals: one blocked implementation per instruction set (gemm_kernels_*.cpp, from the
// templates of gemm_blocked.h), which gemm() chooses from.
constexpr int kGemmKc = 256;   // k values per block (even: bf16 pairs never straddle blocks)
constexpr int kGemmMc = 96;    // rows of A per packed block: a multiple of every MR (4, 6, 12)
constexpr int kGemmNc = 2048;  // columns of B per packed block: a multiple of every NR (8, 16, 32)
constexpr int kGemmTeamBlocks = 8;    // k blocks of B a thread team packs per barrier pair
constexpr int kGemmTeamMaxN = 512;    // the widest output a team computes (its B buffer's width)
struct GemmCall {
  int M, N, K;
  GemmOperand a, bt;          // A, and B transposed (Bᵀ's row j is B's column j)
  float* c;
  long ldc;
  bool accumulate;
  bool bf16_operands;         // the fp32 kernel emulating VDPBF16PS (gemm_blocked.h)
  void *a_buffer, *b_buffer;  // packing space: kGemmMc and kGemmNc rows × kGemmKc floats; a
                              // team's shared B: kGemmTeamMaxN × kGemmTeamBlocks·kGemmKc floats
  int thread, threads;        // a team call: this thread of how many
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
