// Linear layer: a matrix product with an optional bias, weights stored (out, in) as in PyTorch.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "kernels/op.h"

namespace anvil {

// How one model's matrix products run: the kernel implementation, the dtype their operands hold
// (amp rounds them so) and a weight held for reuse. The model owns it and passes it to every
// product, so that two models in one process (an eval model beside a training one, a base and its
// adapter) share nothing.
class MatmulContext {
 public:
  explicit MatmulContext(KernelImpl impl, ComputeDtype operand_dtype = ComputeDtype::kFp32);
  KernelImpl impl() const { return impl_; }
  ~MatmulContext();
  MatmulContext(const MatmulContext&) = delete;
  MatmulContext& operator=(const MatmulContext&) = delete;

  // A promise that every operand of the products that follow is a value of dtype d. GPU GEMMs
  // then multiply the operands narrowed to d on tensor cores, the CPU's bf16 products in bf16
  // pairs (AMX tiles or AVX512-BF16 where the CPU has them, kernels/cpu/gemm.h); both accumulate
  // in fp32. Releases a held weight.
  void set_operand_dtype(ComputeDtype d);
  ComputeDtype operand_dtype() const { return dtype_; }

  // A weight (OC,C) that the products to come use many times over, unchanged: the tied LM head,
  // once per sequence forward and backward. Until release_weight, matmul_forward with this
  // weight, and the input gradient of matmul_backward with it or with a block of its rows
  // starting at a multiple of kMatmulSumBlock, use a copy prepared once in the operand dtype: on
  // the CPU under bf16 operands the GEMM's packed bf16 panels (each product would otherwise
  // convert the weight again: 51 MB of fp32 per sequence for GPT-2's vocabulary at d_model
  // 256); on the GPU under 16-bit operands the weight in 16 bits (the whole weight only). The
  // same bits as without. Elsewhere (fp32, whose packing is a copy; the CPU's fp16; ref) it does
  // nothing.
  void hold_weight(const float* weight, int OC, int C);
  void release_weight();
  // The weight held now (null when none), its shape, and a number no other hold has had.
  struct HeldWeight {
    const float* weight = nullptr;
    int OC = 0, C = 0;
    uint64_t hold = 0;
  };
  HeldWeight held_weight() const;
  // Whether a held weight is rounded to the operand dtype by the hold itself (the CPU's bf16
  // packing rounds), so that its holder need not round it first.
  bool hold_rounds_weight() const;

  // The CPU's packed copies of the held weight (kernels/cpu/matmul.cpp).
  struct Held;
  Held& held() { return *held_; }

 private:
  KernelImpl impl_;
  ComputeDtype dtype_;
  std::unique_ptr<Held> held_;
};

// out (N,OC) = inp (N,C) · weight (OC,C)ᵀ + bias (OC); bias may be null. With accumulate,
// out += inp · weightᵀ (no bias): on the CPU a product whose k is cut at multiples of
// kMatmulSumBlock, its parts accumulated in order, has the whole product's bits (tensor
// parallelism's row-parallel products chain their ranks' parts so).
void matmul_forward(MatmulContext& ctx, float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC, bool accumulate = false);
// out (B·T, OC) = inp (B·T, C) · weight (OC,C)ᵀ + bias for B sequences of T rows, each sequence's
// rows the bits that matmul_forward of those T rows alone gives, whatever B (what
// microbatch-invariant training needs): on the CPU one product, its rows being independent; on
// the GPU one batched product that runs the algorithm the library picks for one sequence.
void matmul_forward_sequences(MatmulContext& ctx, float* out, const float* inp, const float* weight, const float* bias,
                              int B, int T, int C, int OC);
// dinp (N,C) = dout · weight, or += with accumulate_dinp (dinp may be null: not needed);
// dweight (OC,C) += doutᵀ · inp (may be null: a frozen weight); dbias (OC) += column sums of dout
// (dbias may be null). dout's
// rows are ld_dout >= OC apart, so it may be a block of columns of a wider matrix: the LM head's
// backward goes a vocabulary chunk at a time, its input gradient accumulating over the chunks.
void matmul_backward(MatmulContext& ctx, float* dinp, float* dweight, float* dbias, const float* dout, long ld_dout,
                     const float* inp, const float* weight, int N, int C, int OC, bool accumulate_dinp);
// matmul_backward of B sequences of T rows (dout's rows OC apart), each sequence forming its own
// parameter gradient: sequence b's rows of dinp = dout · weight (dinp may be null), and
// dweight + b·grads_stride (OC,C) += its doutᵀ · inp, dbias + b·grads_stride (OC) += its column
// sums (either may be null); with write_grads = instead of += (UnitAccess::grads_to_write: the
// spans' old values are not read). Each the bits of that sequence alone, whatever B
// (microbatch-invariant training's backward): on the GPU batched products that run the algorithm
// the library picks for one sequence (as matmul_forward_sequences), elsewhere a sequence at a
// time (matmul_backward's bits; written spans cleared first).
void matmul_backward_sequences(MatmulContext& ctx, float* dinp, float* dweight, float* dbias, size_t grads_stride,
                               const float* dout, const float* inp, const float* weight, int B, int T, int C, int OC,
                               bool write_grads);

// The CPU's products sum k in blocks of this many (kernels/cpu/gemm.h), each added to the output
// in order: a product split along k at multiples of it, the parts accumulated in order, has
// the bits of the whole on the CPU.
constexpr int kMatmulSumBlock = 256;

// Whether each output row's bits depend on that row's input alone, not on how many rows share
// the call: true of the CPU's GEMM (kernels/cpu/gemm.h), which lets the model run a whole
// microbatch in one product; GPU BLAS libraries choose algorithms by shape, so there a product
// whose rows vary in number goes a sequence at a time (matmul_forward_sequences when they do not).
bool matmul_rows_independent(KernelImpl impl);

// How many of a product's `columns` output columns a caller that splits it into column blocks (the
// LM head's backward) gives each block: on the CPU `preferred`, whose gradient rows stay in cache
// while they are accumulated; on a GPU all of them, since each product is a launch that must fill
// the device on its own (GPT-2's head in blocks of 2048 is 48 output tiles a product).
int matmul_column_block(KernelImpl impl, int columns, int preferred);

// The measured rate of large matrix products with operands of dtype d, in GFLOP/s (the MFU
// denominator), cached per dtype: on the CPU the faster of OpenBLAS's sgemm (kernels/blas.h)
// and anvil's GEMM, on all threads; cuBLASLt / hipBLASLt on the GPU.
double matmul_peak_gflops(KernelImpl impl, ComputeDtype d);
// What runs the matrix products: "anvil GEMM (avx2 kernels, bf16 on avx2, 2 threads)" or the GPU's BLAS,
// device and runtime.
std::string matmul_backend_description(KernelImpl impl);

// ref: in double, ignoring ctx; cpu: anvil's GEMM (kernels/cpu/gemm.h), using and filling ctx's
// held weight; gpu: cuBLASLt / hipBLASLt, on operands narrowed to ctx's operand dtype.
ANVIL_CONTEXT_OP_IMPLEMENTATIONS(matmul_forward)
ANVIL_CONTEXT_OP_IMPLEMENTATIONS(matmul_backward)

namespace gpu {
decltype(::anvil::matmul_forward_sequences) matmul_forward_sequences;
decltype(::anvil::matmul_backward_sequences) matmul_backward_sequences;
}

// The backend queries behind matmul_peak_gflops and matmul_backend_description.
namespace cpu {
double matmul_peak_gflops(ComputeDtype);
std::string matmul_backend_description();
}  // namespace cpu
namespace gpu {
double matmul_peak_gflops(ComputeDtype);
std::string matmul_backend_description();
}  // namespace gpu

}  // namespace anvil
