// The matrix products on the GPU through cuBLASLt / hipBLASLt, fp32 in and out with fp32
// accumulation. The bias is fused into the forward GEMM's epilogue; the bias gradient is a
// fixed-order column sum (ops.cu). The same shapes always get the same algorithm from the
// heuristic, so results repeat bit for bit run to run.
#include <chrono>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"
#include "device/blas_runtime.h"
#include "device/device.h"
#include "device/stream.h"
#include "kernels/gpu/internal.h"
#include "kernels/matmul.h"

namespace anvil::gpu {

namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

struct Blas {
  gpublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
};

Blas& blas() {
  static Blas b = [] {
    Blas x;
    GPUBLAS_CHECK(gpublasLtCreate(&x.handle));
    x.workspace = gpu_alloc(kWorkspaceBytes);
    return x;
  }();
  return b;
}

// A product's descriptors and algorithm, made once per shape: creating them and asking the
// heuristic costs more than a small GEMM, and a step repeats the same few shapes. The heuristic's
// first choice for a shape never changes, which keeps results bit for bit.
struct Plan {
  gpublasLtMatmulDesc_t desc;
  gpublasLtMatrixLayout_t la, lb, ld;
  gpublasLtMatmulAlgo_t algo;
};
using PlanKey = std::tuple<int, bool, bool, int, int, int, int, int, int, long long, long long, long long, int, bool>;

Plan make_plan(gpublasComputeType_t compute, bool trans_a, bool trans_b, int m, int n, int k, Strided A, Strided B,
               int ldd, long long stride_d, int count, bool bias) {
  Plan p;
  GPUBLAS_CHECK(gpublasLtMatmulDescCreate(&p.desc, compute, GPU_R_32F));
  const auto op_a = trans_a ? GPUBLAS_OP_T : GPUBLAS_OP_N, op_b = trans_b ? GPUBLAS_OP_T : GPUBLAS_OP_N;
  GPUBLAS_CHECK(gpublasLtMatmulDescSetAttribute(p.desc, GPUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  GPUBLAS_CHECK(gpublasLtMatmulDescSetAttribute(p.desc, GPUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  const gpublasLtEpilogue_t epilogue = bias ? GPUBLASLT_EPILOGUE_BIAS : GPUBLASLT_EPILOGUE_DEFAULT;
  GPUBLAS_CHECK(gpublasLtMatmulDescSetAttribute(p.desc, GPUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
  GPUBLAS_CHECK(gpublasLtMatrixLayoutCreate(&p.la, GPU_R_32F, trans_a ? k : m, trans_a ? m : k, A.ld));
  GPUBLAS_CHECK(gpublasLtMatrixLayoutCreate(&p.lb, GPU_R_32F, trans_b ? n : k, trans_b ? k : n, B.ld));
  GPUBLAS_CHECK(gpublasLtMatrixLayoutCreate(&p.ld, GPU_R_32F, m, n, ldd));
  if (count > 1) {
    const std::pair<gpublasLtMatrixLayout_t, long long> layouts[] = {{p.la, A.stride}, {p.lb, B.stride}, {p.ld, stride_d}};
    for (const auto& [layout, stride] : layouts) {
      GPUBLAS_CHECK(gpublasLtMatrixLayoutSetAttribute(layout, GPUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
      GPUBLAS_CHECK(gpublasLtMatrixLayoutSetAttribute(layout, GPUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                      sizeof stride));
    }
  }
  gpublasLtMatmulPreference_t pref;
  GPUBLAS_CHECK(gpublasLtMatmulPreferenceCreate(&pref));
  GPUBLAS_CHECK(gpublasLtMatmulPreferenceSetAttribute(pref, GPUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWorkspaceBytes,
                                                      sizeof kWorkspaceBytes));
  gpublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  GPUBLAS_CHECK(gpublasLtMatmulAlgoGetHeuristic(blas().handle, p.desc, p.la, p.lb, p.ld, p.ld, pref, 1, &heuristic,
                                                &found));
  gpublasLtMatmulPreferenceDestroy(pref);
  ANVIL_CHECK(found > 0, "the GPU BLAS has no algorithm for a {}x{}x{} matrix product", m, n, k);
  p.algo = heuristic.algo;
  return p;
}

// D (m,n) = alpha·op(A) (m,k) · op(B) (k,n) + beta·D [+ bias (m) per column], all column-major
// fp32, count times at the given strides, multiplied in the given compute mode.
void gemm(gpublasComputeType_t compute, bool trans_a, bool trans_b, int m, int n, int k, float alpha, Strided A,
          Strided B, float beta, float* D, int ldd, long long stride_d, int count, const float* bias) {
  static std::map<PlanKey, Plan> plans;
  const PlanKey key{static_cast<int>(compute), trans_a, trans_b, m, n, k, A.ld, B.ld, ldd, A.stride, B.stride,
                    stride_d, count, bias != nullptr};
  auto it = plans.find(key);
  if (it == plans.end())
    it = plans.emplace(key, make_plan(compute, trans_a, trans_b, m, n, k, A, B, ldd, stride_d, count, bias)).first;
  const Plan& p = it->second;
  Blas& b = blas();
  if (bias) GPUBLAS_CHECK(gpublasLtMatmulDescSetAttribute(p.desc, GPUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  GPUBLAS_CHECK(gpublasLtMatmul(b.handle, p.desc, &alpha, A.p, p.la, B.p, p.lb, &beta, D, p.ld, D, p.ld, &p.algo,
                                b.workspace, kWorkspaceBytes, gpu_stream()));
}

// The tensor-core mode for operands of dtype d (fp32 accumulation throughout).
gpublasComputeType_t compute_type(ComputeDtype d) {
  return d == ComputeDtype::kBf16   ? GPUBLAS_COMPUTE_32F_FAST_16BF
         : d == ComputeDtype::kFp16 ? GPUBLAS_COMPUTE_32F_FAST_16F
                                    : GPUBLAS_COMPUTE_32F;
}

// One product with operands of dtype d.
void gemm(ComputeDtype d, bool trans_a, bool trans_b, int m, int n, int k, const float* A, int lda, const float* B,
          int ldb, float* D, int ldd, float beta, const float* bias) {
  gemm(compute_type(d), trans_a, trans_b, m, n, k, 1.0f, {A, lda, 0}, {B, ldb, 0}, beta, D, ldd, 0, 1, bias);
}

}  // namespace

void gemm_fp32_batched(bool trans_a, bool trans_b, int m, int n, int k, float alpha, Strided A, Strided B, float beta,
                       float* D, int ldd, long long stride_d, int count) {
  gemm(GPUBLAS_COMPUTE_32F, trans_a, trans_b, m, n, k, alpha, A, B, beta, D, ldd, stride_d, count, nullptr);
}

double matmul_peak_gflops(ComputeDtype d) {
  static std::map<ComputeDtype, double> measured;
  auto it = measured.find(d);
  if (it != measured.end()) return it->second;
  // Square products of 8192, enough to fill any current GPU, timed after a warm-up. The emulated
  // GPU multiplies on the host, where one of those takes seconds: a small one shows its rate.
#if defined(ANVIL_GPU_EMULATION)
  constexpr int n = 512, reps = 2;
#else
  constexpr int n = 8192, reps = 10;
#endif
  const size_t bytes = size_t{n} * n * sizeof(float);
  float* x = static_cast<float*>(gpu_alloc(bytes));
  float* y = static_cast<float*>(gpu_alloc(bytes));
  float* z = static_cast<float*>(gpu_alloc(bytes));
  gpu_zero(x, bytes);
  gpu_zero(y, bytes);
  gemm(d, true, false, n, n, n, x, n, y, n, z, n, 0.0f, nullptr);
  gpu_synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; r++) gemm(d, true, false, n, n, n, x, n, y, n, z, n, 0.0f, nullptr);
  gpu_synchronize();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  gpu_release(x);
  gpu_release(y);
  gpu_release(z);
  return measured[d] = 2.0 * n * n * static_cast<double>(n) * reps / secs / 1e9;
}

std::string matmul_backend_description() {
  int device = 0;
  GPU_CHECK(gpuGetDevice(&device));
  const std::vector<GpuInfo> gpus = gpu_devices();
  const GpuInfo& g = gpus.at(static_cast<size_t>(device));
#if defined(ANVIL_HIP)
  const char* blas_name = "hipBLASLt";
#else
  const char* blas_name = "cuBLASLt";
#endif
  return fmt::format("{} {} on {} ({}, {} SMs, {:.0f} GiB), {}", blas_name, gpublasLtGetVersion(), g.name, g.arch,
                     g.multiprocessors, g.total_bytes / 1073741824.0, gpu_backend_description());
}

// Row-major (N,C) is column-major (C,N): out^T (OC,N) = W (OC,C) · inp^T (C,N), W being
// column-major (C,OC), hence transposed.
void matmul_forward(MatmulContext& ctx, float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC) {
  gemm(ctx.operand_dtype(), true, false, OC, N, C, weight, C, inp, C, out, OC, 0.0f, bias);
}

void matmul_backward(MatmulContext& ctx, float* dinp, float* dweight, float* dbias, const float* dout, long ld_dout,
                     const float* inp, const float* weight, int N, int C, int OC, bool accumulate_dinp) {
  const ComputeDtype d = ctx.operand_dtype();
  const int ld = static_cast<int>(ld_dout);
  // dinp^T (C,N) = (or +=) W^T (C,OC) · dout^T (OC,N)
  if (dinp) gemm(d, false, false, C, N, OC, weight, C, dout, ld, dinp, C, accumulate_dinp ? 1.0f : 0.0f, nullptr);
  // dweight^T (C,OC) += inp^T (C,N) · dout (N,OC)
  if (dweight) gemm(d, false, true, C, OC, N, inp, C, dout, ld, dweight, C, 1.0f, nullptr);
  if (dbias) column_sums_accumulate(dbias, dout, ld, N, OC);
}

}  // namespace anvil::gpu
