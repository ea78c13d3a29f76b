// anvil's own CPU matrix product. Every output element is computed the same way whatever M or
// N, however the product is cut into blocks or threads, and whichever instruction set runs it
// (AVX-512, AVX2+FMA and the portable path agree bit for bit): k is taken in fixed blocks of
// kGemmKc; within a block the products are one chain of fused multiply-adds from zero in k
// order, and the blocks' sums are added to C in order. So an element's bits depend on its row of
// A and column of B alone, which is what lets a matrix product span a whole microbatch and still
// give the result of one sequence at a time.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace anvil::cpu {

// fp32: a block's chain is s = fma(a[k], b[k], s) for its k in order.
// bf16: the operands are rounded to bf16 (nearest even) and taken in pairs, the odd k first:
//   s = fma(a[2p+1], b[2p+1], s); s = fma(a[2p], b[2p], s)   for the block's pairs p in order,
// with bf16 subnormal inputs read as zero and subnormal results (the adds to C included) flushed
// to zero; an odd K is padded with a zero pair member. This is exactly what AVX512-BF16's
// VDPBF16PS computes, so the native instruction and the emulation on other CPUs agree.
// bf16 on AMX tiles (GemmIsa::amx) has its own order, the one TDPBF16PS computes: a block's k
// go in chunks of 16 pairs (the last zero-padded), each chunk's even products summed in one fma
// chain from zero and its odd products in another, the two sums added, and that added to s:
//   e = fma(a[2p], b[2p], e); o = fma(a[2p+1], b[2p+1], o)   for the chunk's pairs p in order,
//   s = s + (e + o)
// with the same rounding to bf16 and flushing of subnormals. No ordering of the pair chain can
// reproduce that, so AMX's products have bits of their own (still fixed per element, whatever
// M, N, the blocking or the threads).
enum class GemmPrecision { fp32, bf16 };

// The instruction sets the microkernels are built for. bf16 products run on VDPBF16PS under
// avx512bf16, on AMX tiles under amx (whose fp32 products are avx512's), and elsewhere on the
// fp32 kernel with the operands rounded.
enum class GemmIsa { portable, avx2, avx512, avx512bf16, amx };
bool gemm_isa_supported(GemmIsa isa);    // whether this CPU runs it (for amx: Linux grants the tiles)
std::string gemm_isa_name(GemmIsa isa);  // "avx2", ...
// The instruction set training's products of a precision run on: for fp32 the widest vectors;
// for bf16 AMX where the CPU has it (always: a run's bits must not depend on a timing), else the
// faster of the pair chain's paths, timed once on a product of training's size (those give the
// same bits, so the choice changes only the speed).
GemmIsa gemm_isa(GemmPrecision precision);
// The instruction sets bf16 products can run on here: fp32's, then avx512bf16 and amx where
// supported (`anvil bench gemm` times each).
std::vector<GemmIsa> gemm_bf16_isas();

// A matrix operand: element (r, c) is at data[r * row_stride + c * col_stride].
struct GemmOperand {
  const float* data;
  long row_stride, col_stride;
};

// C (M×N, row stride ldc) = A (M×K) · B (K×N), or C += A · B when accumulate. Single-threaded;
// uses thread-local packing buffers sized once.
void gemm(GemmPrecision precision, int M, int N, int K, GemmOperand a, GemmOperand b, float* c, long ldc,
          bool accumulate, GemmIsa isa);
void gemm(GemmPrecision precision, int M, int N, int K, GemmOperand a, GemmOperand b, float* c, long ldc,
          bool accumulate);  // on gemm_isa(precision)
// gemm() on all OpenMP threads, the output cut into blocks (each one gemm() call): the same bits
// as a single call, whatever the thread count.
void parallel_gemm(GemmPrecision precision, int M, int N, int K, GemmOperand a, GemmOperand b, float* c, long ldc,
                   bool accumulate, GemmIsa isa);
void parallel_gemm(GemmPrecision precision, int M, int N, int K, GemmOperand a, GemmOperand b, float* c, long ldc,
                   bool accumulate);  // on gemm_isa(precision)

// B packed ahead, for a weight that many products in a row multiply by (the tied LM head: every
// sequence of a step): the panels each product would otherwise pack (and, in bf16, convert)
// from B, formed once. A product on a part of it gives the bits of the same product on B itself.
class GemmPackedB {
 public:
  // Packs B (K × N) for isa's kernels in precision's mode, on all threads. The storage is kept
  // and reused by later packs of the same or a smaller size.
  void pack(GemmPrecision precision, int K, int N, GemmOperand b, GemmIsa isa);
  void pack(GemmPrecision precision, int K, int N, GemmOperand b) { pack(precision, K, N, b, gemm_isa(precision)); }
  void clear() { K_ = N_ = 0; }
  bool empty() const { return K_ == 0; }

 private:
  friend void parallel_gemm(GemmPrecision, int, int, int, GemmOperand, const GemmPackedB&, int, int, float*, long,
                            bool);
  struct Free {
    void operator()(void* p) const;
  };
  GemmPrecision precision_ = GemmPrecision::fp32;
  GemmIsa isa_ = GemmIsa::portable;
  int K_ = 0, N_ = 0;
  int nr_ = 0;         // columns per panel of the kernels packed for
  long panels_ = 0;    // panels per block of kGemmKc k
  long slot_ = 0;      // 32-bit words per panel and k block
  size_t capacity_ = 0;  // bytes
  std::unique_ptr<void, Free> data_;
};

// parallel_gemm with rows [k0, k0 + K) × columns [j0, j0 + N) of a packed B: k0 a multiple of
// kGemmKc, j0 of the kernel's panel width (kGemmNc's divisors that are multiples of 32 are);
// in bf16 an odd K only where the part reaches B's last k (where B's own pair padding is).
void parallel_gemm(GemmPrecision precision, int M, int N, int K, GemmOperand a, const GemmPackedB& b, int k0, int j0,
                   float* c, long ldc, bool accumulate);

// Internals: one blocked implementation per instruction set (gemm_kernels_*.cpp, from the
// templates of gemm_blocked.h), which gemm() chooses from.
constexpr int kGemmKc = 256;   // k values per block (even: bf16 pairs never straddle blocks)
constexpr int kGemmMc = 96;    // rows of A per packed block: a multiple of every MR (4, 6, 12, 32)
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
  const void* packed_b;       // B's panels packed ahead (bt unused), or null
  long packed_panels;         // panels per k block of packed_b
};
// The layout of a B packed ahead (GemmPackedB): for each block of kGemmKc k, for each panel of
// NR columns, that block's steps of the panel (as the product packs them) in a slot of a whole
// block's size; packed_b points at the product's first block and panel.
struct GemmKernels {
  void (*fp32)(const GemmCall&);   // fp32 products, and bf16 ones when bf16_operands
  void (*pairs)(const GemmCall&);  // bf16 on VDPBF16PS or AMX tiles; null on instruction sets without
  // Pack all of a call's B (bt, K, N, bf16_operands) into dst, on the calling team's threads.
  void (*fp32_pack_b)(const GemmCall&, void* dst);
  void (*pairs_pack_b)(const GemmCall&, void* dst);
  int fp32_nr, pairs_nr;           // their panels' widths
};
const GemmKernels& gemm_kernels_portable();
const GemmKernels& gemm_kernels_avx2();
const GemmKernels& gemm_kernels_avx512();
const GemmKernels& gemm_kernels_avx512bf16();
const GemmKernels& gemm_kernels_amx();

}  // namespace anvil::cpu
