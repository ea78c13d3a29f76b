// Matmuls on anvil's GEMM (gemm.h), which gives the same bits for any blocking, thread count or
// instruction set (AMX's bf16 apart: its own order); the bias gradient is a column sum over row
// blocks owned by threads so its order is fixed. OpenBLAS stays as the yardstick for the
// machine's peak (blas.h).
#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/cpu.h"
#include "core/error.h"
#include "kernels/blas.h"
#include "kernels/cpu/best_rate.h"
#include "kernels/cpu/gemm.h"
#include "kernels/matmul.h"

extern "C" char* openblas_get_corename(void);
extern "C" char* openblas_get_config(void);
extern "C" int openblas_get_num_threads(void);

namespace anvil {

static_assert(cpu::kGemmKc == kMatmulSumBlock, "matmul.h promises the GEMM's k block");

void blas_select_kernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") || !cpu_info().avx512) return;
  setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
  execv("/proc/self/exe", argv);
  // If re-execution is impossible the program still runs, with OpenBLAS's own choice.
}

std::string blas_description() {
  return fmt::format("{} ({} kernels, {} threads)", openblas_get_config(), openblas_get_corename(),
                     openblas_get_num_threads());
}

// The MFU denominator: the best 2048³ product over at least a second (shorter windows on a shared
// machine catch a slow moment and inflate MFU).
constexpr int kPeakN = 2048;
constexpr double kPeakFlops = 2.0 * kPeakN * kPeakN * kPeakN;

double openblas_peak_gflops() {
  static const double peak = [] {
    const int n = kPeakN;
    std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a), c(a.size());
    return cpu::best_gflops(kPeakFlops, 1.0, 3, [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(),
                  n);
    });
  }();
  return peak;
}

struct MatmulContext::Held {
  // The weight hold_weight names, and its packed forms, each packed on its first use (an eval
  // pass needs only the forward's); their storage stays for the next hold.
  const float* weight = nullptr;
  int OC = 0, C = 0;
  uint64_t hold = 0;
  cpu::GemmPackedB forward;   // B = weightᵀ (C × OC)
  cpu::GemmPackedB backward;  // B = weight (OC × C), for the input gradient
};

MatmulContext::MatmulContext(KernelImpl impl, ComputeDtype operand_dtype)
    : impl_(impl), dtype_(operand_dtype), held_(std::make_unique<Held>()) {}
MatmulContext::~MatmulContext() = default;

void MatmulContext::set_operand_dtype(ComputeDtype d) {
  dtype_ = d;
  release_weight();
}

void MatmulContext::hold_weight(const float* weight, int OC, int C) {
  static std::atomic<uint64_t> holds = 0;
  release_weight();
  const bool gpu_16bit = dtype_ != ComputeDtype::kFp32 && impl_ == KernelImpl::kGpu;
  if (!hold_rounds_weight() && !gpu_16bit) return;
  held_->weight = weight, held_->OC = OC, held_->C = C, held_->hold = ++holds;
}

MatmulContext::HeldWeight MatmulContext::held_weight() const {
  return {held_->weight, held_->OC, held_->C, held_->hold};
}

void MatmulContext::release_weight() {
  held_->weight = nullptr;
  held_->forward.clear();
  held_->backward.clear();
}

// Packing for VDPBF16PS, or for the fp32 kernel's bf16 emulation, rounds every value to bf16;
// only the CPU's products hold a weight.
bool MatmulContext::hold_rounds_weight() const { return dtype_ == ComputeDtype::kBf16 && impl_ == KernelImpl::kCpu; }

namespace cpu {
namespace {
GemmPrecision gemm_precision(const MatmulContext& ctx) {
  return ctx.operand_dtype() == ComputeDtype::kBf16 ? GemmPrecision::bf16 : GemmPrecision::fp32;
}

// The packed forward B, or null where weight is not the held one.
const GemmPackedB* held_forward(MatmulContext& ctx, const float* weight, int C, int OC) {
  MatmulContext::Held& h = ctx.held();
  if (!h.weight || weight != h.weight || C != h.C || OC != h.OC) return nullptr;
  if (h.forward.empty()) h.forward.pack(gemm_precision(ctx), C, OC, {weight, 1, C});
  return &h.forward;
}

// The packed backward B and the first of weight's rows in it, or null where weight is not the
// held one or a block of its rows that a packed part can stand for (gemm.h).
const GemmPackedB* held_backward(MatmulContext& ctx, const float* weight, int C, int OC, int* row0) {
  MatmulContext::Held& h = ctx.held();
  if (!h.weight || C != h.C) return nullptr;
  const auto at = reinterpret_cast<uintptr_t>(weight), start = reinterpret_cast<uintptr_t>(h.weight);
  const uintptr_t row_bytes = sizeof(float) * static_cast<uintptr_t>(C);
  if (at < start || (at - start) % row_bytes != 0) return nullptr;
  const uintptr_t rows = (at - start) / row_bytes, end = static_cast<uintptr_t>(h.OC);
  if (rows % kGemmKc != 0 || rows + OC > end || (OC % 2 != 0 && rows + OC != end)) return nullptr;
  *row0 = static_cast<int>(rows);
  if (h.backward.empty()) h.backward.pack(gemm_precision(ctx), h.OC, C, {h.weight, C, 1});
  return &h.backward;
}
}  // namespace

double matmul_peak_gflops(ComputeDtype d) {
  // The faster of OpenBLAS's sgemm and anvil's own product in this mode, so that MFU is never
  // measured against a slow denominator (amp_bf16's peak is VDPBF16PS's where the CPU has it).
  static double peak[3] = {0, 0, 0};
  double& p = peak[static_cast<int>(d)];
  if (p == 0) {
    const int n = kPeakN;
    std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a), c(a.size());
    MatmulContext ctx(KernelImpl::kCpu, d);
    p = std::max(openblas_peak_gflops(), best_gflops(kPeakFlops, 1.0, 3, [&] {
                   cpu::matmul_forward(ctx, c.data(), a.data(), b.data(), nullptr, n, n, n, false);
                 }));
  }
  return p;
}

std::string matmul_backend_description() {
  return fmt::format("anvil GEMM ({} kernels, bf16 on {}, {} threads)", gemm_isa_name(gemm_isa(GemmPrecision::fp32)),
                     gemm_isa_name(gemm_isa(GemmPrecision::bf16)), cpu_info().threads);
}

void matmul_forward(MatmulContext& ctx, float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC, bool accumulate) {
  if (bias) {
    // The products are added onto the bias: one pass over out instead of two.
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) std::memcpy(out + static_cast<long>(n) * OC, bias, sizeof(float) * OC);
  }
  const GemmPrecision precision = gemm_precision(ctx);
  if (const GemmPackedB* packed = held_forward(ctx, weight, C, OC))
    parallel_gemm(precision, N, OC, C, {inp, C, 1}, *packed, 0, 0, out, OC, accumulate || bias);
  else
    parallel_gemm(precision, N, OC, C, {inp, C, 1}, {weight, 1, C}, out, OC, accumulate || bias);
}

void matmul_backward(MatmulContext& ctx, float* dinp, float* dweight, float* dbias, const float* dout, long ld_dout,
                     const float* inp, const float* weight, int N, int C, int OC, bool accumulate_dinp) {
  const GemmPrecision precision = gemm_precision(ctx);
  if (dinp) {
    int row0 = 0;
    if (const GemmPackedB* packed = held_backward(ctx, weight, C, OC, &row0))
      parallel_gemm(precision, N, C, OC, {dout, ld_dout, 1}, *packed, row0, 0, dinp, C, accumulate_dinp);
    else
      parallel_gemm(precision, N, C, OC, {dout, ld_dout, 1}, {weight, C, 1}, dinp, C, accumulate_dinp);
  }
  if (dweight) parallel_gemm(precision, OC, C, N, {dout, 1, ld_dout}, {inp, C, 1}, dweight, C, true);
  if (dbias) {
    constexpr int kChunk = 64;
    const int chunks = (OC + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
    for (int ch = 0; ch < chunks; ch++) {
      const int o0 = ch * kChunk, o1 = std::min(OC, o0 + kChunk);
      float acc[kChunk] = {};
      for (int n = 0; n < N; n++) {
        const float* d = dout + n * ld_dout;
#pragma omp simd
        for (int o = o0; o < o1; o++) acc[o - o0] += d[o];
      }
      for (int o = o0; o < o1; o++) dbias[o] += acc[o - o0];
    }
  }
}

}  // namespace cpu
}  // namespace anvil
