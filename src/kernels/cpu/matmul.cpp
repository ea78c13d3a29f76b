// Matmuls on anvil's GEMM (gemm.h), which gives the same bits for any blocking, thread count or
// instruction set; the bias gradient is a column sum over row blocks owned by threads so its
// order is fixed. OpenBLAS stays as the yardstick for the machine's peak (blas.h).
#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/cpu.h"
#include "core/error.h"
#include "kernels/blas.h"
#include "kernels/cpu/gemm.h"
#include "kernels/matmul.h"

extern "C" char* openblas_get_corename(void);
extern "C" char* openblas_get_config(void);
extern "C" int openblas_get_num_threads(void);

namespace anvil {

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

namespace {
// The best rate of repeated 2048³ products over at least a second: shorter windows on a shared
// machine catch a slow moment and inflate MFU.
template <class Product>
double best_rate_gflops(const Product& product) {
  const int n = 2048;
  product(n);  // warm up threads and caches
  double best = 0, spent = 0;
  for (int rep = 0; rep < 3 || spent < 1.0; rep++) {
    auto t0 = std::chrono::steady_clock::now();
    product(n);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    spent += s;
    best = std::max(best, 2.0 * n * n * static_cast<double>(n) / s / 1e9);
  }
  return best;
}
}  // namespace

double openblas_peak_gflops() {
  static const double peak = [] {
    std::vector<float> a(2048 * 2048, 0.5f), b(a), c(a.size());
    return best_rate_gflops([&](int n) {
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
    std::vector<float> a(2048 * 2048, 0.5f), b(a), c(a.size());
    p = std::max(openblas_peak_gflops(),
                 best_rate_gflops([&](int n) { matmul_forward(c.data(), a.data(), b.data(), nullptr, n, n, n); }));
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

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC) {
  if (dinp) {
    parallel_gemm(g_precision, N, C, OC, {dout, OC, 1}, {weight, C, 1}, dinp, C, false);
  }
  parallel_gemm(g_precision, OC, C, N, {dout, 1, OC}, {inp, C, 1}, dweight, C, true);
  if (dbias) {
    constexpr int kChunk = 64;
    const int chunks = (OC + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
    for (int ch = 0; ch < chunks; ch++) {
      const int o0 = ch * kChunk, o1 = std::min(OC, o0 + kChunk);
      float acc[kChunk] = {};
      for (int n = 0; n < N; n++) {
        const float* d = dout + static_cast<long>(n) * OC;
#pragma omp simd
        for (int o = o0; o < o1; o++) acc[o - o0] += d[o];
      }
      for (int o = o0; o < o1; o++) dbias[o] += acc[o - o0];
    }
  }
}

}  // namespace cpu
}  // namespace anvil
