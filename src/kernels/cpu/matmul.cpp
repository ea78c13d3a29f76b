// Matmuls on anvil's GEMM (gemm.h), which gives the same bits for any blocking, thread count or
// instruction set; the bias gradient is a column sum over row blocks owned by threads so its
// order is fixed. OpenBLAS stays as the yardstick for the machine's peak (blas.h).
#include <cblas.h>
#include <unistd.h>

#include <algorithm>
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

namespace cpu {
namespace {
GemmPrecision g_precision = GemmPrecision::fp32;
}

void set_matmul_operand_dtype(ComputeDtype d) {
  g_precision = d == ComputeDtype::kBf16 ? GemmPrecision::bf16 : GemmPrecision::fp32;
}

double matmul_peak_gflops() {
  // The faster of OpenBLAS's sgemm and anvil's own product in the current mode, so that MFU is
  // never measured against a slow denominator (amp_bf16's peak is VDPBF16PS's where the CPU has it).
  static double peak[2] = {0, 0};
  double& p = peak[static_cast<int>(g_precision)];
  if (p == 0) {
    const int n = kPeakN;
    std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a), c(a.size());
    p = std::max(openblas_peak_gflops(), best_gflops(kPeakFlops, 1.0, 3, [&] {
                   matmul_forward(c.data(), a.data(), b.data(), nullptr, n, n, n);
                 }));
  }
  return p;
}

std::string matmul_backend_description() {
  return fmt::format("anvil GEMM ({} kernels, {} threads)", gemm_isa_name(gemm_best_isa()), cpu_info().threads);
}

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC) {
  if (bias) {
    // The products are added onto the bias: one pass over out instead of two.
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) std::memcpy(out + static_cast<long>(n) * OC, bias, sizeof(float) * OC);
  }
  parallel_gemm(g_precision, N, OC, C, {inp, C, 1}, {weight, 1, C}, out, OC, bias != nullptr);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, long ld_dout, const float* inp,
                     const float* weight, int N, int C, int OC, bool accumulate_dinp) {
  if (dinp) {
    parallel_gemm(g_precision, N, C, OC, {dout, ld_dout, 1}, {weight, C, 1}, dinp, C, accumulate_dinp);
  }
  parallel_gemm(g_precision, OC, C, N, {dout, 1, ld_dout}, {inp, C, 1}, dweight, C, true);
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
