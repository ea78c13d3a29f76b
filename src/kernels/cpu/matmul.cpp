// Matmuls through OpenBLAS's sgemm in fixed blocks; the bias gradient is a column sum over row
// blocks owned by threads so its order is fixed. Results do not depend on the thread count.
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

double measured_peak_gflops() {
  // The best of repeated 2048³ sgemms over at least a second: shorter windows on a shared
  // machine catch a slow moment and inflate MFU.
  static const double peak = [] {
    const int n = 2048;
    std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a), c(a.size());
    auto run = [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                  0.0f, c.data(), n);
    };
    run();  // warm up threads and caches
    double best = 0, spent = 0;
    for (int rep = 0; rep < 3 || spent < 1.0; rep++) {
      auto t0 = std::chrono::steady_clock::now();
      run();
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      spent += s;
      best = std::max(best, 2.0 * n * n * static_cast<double>(n) / s / 1e9);
    }
    return best;
  }();
  return peak;
}

namespace cpu {

// OpenBLAS rounds an element differently depending on how its threads split the matrix (an
// element at the edge of a thread's tile goes through an edge kernel), so the thread count would
// change results. Instead the output is cut into a fixed grid of blocks, each a single-threaded
// sgemm (OpenBLAS runs serially inside an OpenMP region), shared out over OpenMP threads: every
// element is computed by the same call whatever the thread count. Blocks are kBlock × kBlock;
// when that gives fewer than kMinBlocks, the rows are cut finer (down to kMinBandRows), so that a
// narrow product (d_model columns, or the LM head's input gradient) still keeps every core
// busy. The grid is a function of the shape alone.
constexpr int kBlock = 256, kMinBlocks = 4, kMinBandRows = 64;

// Calls block(r0, rows, c0, cols) for each block of a rows × cols output, in parallel.
template <typename Block>
void for_each_block(int rows, int cols, const Block& block) {
  const int col_blocks = (cols + kBlock - 1) / kBlock;
  const int wanted_row_blocks = (kMinBlocks + col_blocks - 1) / col_blocks;
  int band = kBlock;
  if ((rows + band - 1) / band < wanted_row_blocks)
    band = std::max(kMinBandRows, (rows + wanted_row_blocks - 1) / wanted_row_blocks);
  const int row_blocks = (rows + band - 1) / band;
#pragma omp parallel for schedule(dynamic)
  for (int t = 0; t < row_blocks * col_blocks; t++) {
    const int r0 = (t / col_blocks) * band, c0 = (t % col_blocks) * kBlock;
    block(r0, std::min(band, rows - r0), c0, std::min(kBlock, cols - c0));
  }
}

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC) {
  float beta = 0.0f;
  if (bias) {
    // Start from the bias and let sgemm accumulate onto it: one pass over out instead of two.
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) std::memcpy(out + static_cast<long>(n) * OC, bias, sizeof(float) * OC);
    beta = 1.0f;
  }
  for_each_block(N, OC, [&](int n0, int nb, int o0, int ob) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nb, ob, C, 1.0f, inp + static_cast<long>(n0) * C, C,
                weight + static_cast<long>(o0) * C, C, beta, out + static_cast<long>(n0) * OC + o0, OC);
  });
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC) {
  if (dinp) {
    for_each_block(N, C, [&](int n0, int nb, int c0, int cb) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nb, cb, OC, 1.0f, dout + static_cast<long>(n0) * OC,
                  OC, weight + c0, C, 0.0f, dinp + static_cast<long>(n0) * C + c0, C);
    });
  }
  for_each_block(OC, C, [&](int o0, int ob, int c0, int cb) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ob, cb, N, 1.0f, dout + o0, OC, inp + c0, C, 1.0f,
                dweight + static_cast<long>(o0) * C + c0, C);
  });
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
