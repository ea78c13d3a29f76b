// The matrix products on the GPU through cuBLASLt / hipBLASLt, with fp32 outputs and fp32
// accumulation. Under amp (16-bit operands, MatmulContext) both operands go to the library in
// 16 bits: every operand is a value of that dtype already, so the narrowing is exact, and the
// library then runs its 16-bit tensor-core kernels (fp32 operands in a "fast 16-bit" mode got
// TF32 kernels on an H100, at half the rate). The bias is fused into the forward GEMM's
// epilogue; the bias gradient is a fixed-order column sum (ops.cu). The same shapes always get
// the same algorithm from the heuristic, so results repeat bit for bit run to run.
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "device/blas_runtime.h"
#include "device/device.h"
#include "device/stream.h"
#include "kernels/columns.h"
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

// A matrix operand: fp32 or 16-bit values, ld elements between columns, stride between the
// matrices of a batch.
struct Operand {
  const void* p;
  int ld;
  long long stride;
};

// A product's descriptors and algorithm, made once per shape: creating them and asking the
// heuristic costs more than a small GEMM, and a step repeats the same few shapes. The heuristic's
// first choice for a shape never changes, which keeps results bit for bit.
struct Plan {
  gpublasLtMatmulDesc_t desc;
  gpublasLtMatrixLayout_t la, lb, ld;
  gpublasLtMatmulAlgo_t algo;
  // False when a batch was to run one matrix's algorithm and the library cannot run it batched,
  // or ran it with other bits than each matrix's own product: the matrices then go one at a time.
  bool batched = true;
  bool checked = false;  // the batched bits compared with each matrix's own product's
};
// (beta: whether the product accumulates, which a batch's first-use check ran with)
using PlanKey =
    std::tuple<int, bool, bool, int, int, int, int, int, int, long long, long long, long long, int, bool, bool, bool>;

// The heuristic's first algorithm for the product the layouts describe now.
gpublasLtMatmulAlgo_t first_algorithm(const Plan& p, int m, int n, int k) {
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
  return heuristic.algo;
}

// algo_of_one: a batch runs the algorithm the heuristic picks for one of its matrices, so that
// each matrix gets the bits a product of it alone gets (the library's batched kernels run each
// matrix's tiles as the single product does: gemm checks it on a plan's first use, and
// test_gpu_matmul on the hardware).
Plan make_plan(gpublasDataType_t operands, bool trans_a, bool trans_b, int m, int n, int k, Operand A, Operand B,
               int ldd, long long stride_d, int count, bool bias, bool algo_of_one) {
  Plan p;
  GPUBLAS_CHECK(gpublasLtMatmulDescCreate(&p.desc, GPUBLAS_COMPUTE_32F, GPU_R_32F));
  const auto op_a = trans_a ? GPUBLAS_OP_T : GPUBLAS_OP_N, op_b = trans_b ? GPUBLAS_OP_T : GPUBLAS_OP_N;
  GPUBLAS_CHECK(gpublasLtMatmulDescSetAttribute(p.desc, GPUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  GPUBLAS_CHECK(gpublasLtMatmulDescSetAttribute(p.desc, GPUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  const gpublasLtEpilogue_t epilogue = bias ? GPUBLASLT_EPILOGUE_BIAS : GPUBLASLT_EPILOGUE_DEFAULT;
  GPUBLAS_CHECK(gpublasLtMatmulDescSetAttribute(p.desc, GPUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
  GPUBLAS_CHECK(gpublasLtMatrixLayoutCreate(&p.la, operands, trans_a ? k : m, trans_a ? m : k, A.ld));
  GPUBLAS_CHECK(gpublasLtMatrixLayoutCreate(&p.lb, operands, trans_b ? n : k, trans_b ? k : n, B.ld));
  GPUBLAS_CHECK(gpublasLtMatrixLayoutCreate(&p.ld, GPU_R_32F, m, n, ldd));
  const bool one_first = algo_of_one && count > 1;
  if (one_first) p.algo = first_algorithm(p, m, n, k);
  if (count > 1) {
    const std::pair<gpublasLtMatrixLayout_t, long long> layouts[] = {{p.la, A.stride}, {p.lb, B.stride}, {p.ld, stride_d}};
    for (const auto& [layout, stride] : layouts) {
      GPUBLAS_CHECK(gpublasLtMatrixLayoutSetAttribute(layout, GPUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
      GPUBLAS_CHECK(gpublasLtMatrixLayoutSetAttribute(layout, GPUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                      sizeof stride));
    }
  }
  if (!one_first) {
    p.algo = first_algorithm(p, m, n, k);
    return p;
  }
  gpublasLtMatmulHeuristicResult_t check{};
  p.batched = gpublasLtMatmulAlgoCheck(blas().handle, p.desc, p.la, p.lb, p.ld, p.ld, &p.algo, &check) ==
                  GPUBLAS_STATUS_SUCCESS &&
              check.workspaceSize <= kWorkspaceBytes;
  return p;
}

size_t element_bytes(gpublasDataType_t type) { return type == GPU_R_32F ? sizeof(float) : sizeof(uint16_t); }

bool split_batches = false;   // matmul_split_batches
bool batches_differ = false;  // matmul_batches_differ

// The matrices of D (each m of its n columns, ldd apart, stride_d between matrices) in host
// memory, in order.
std::vector<float> written(const float* D, int m, int n, int ldd, long long stride_d, int count) {
  std::vector<float> all(static_cast<size_t>((count - 1) * stride_d + static_cast<long long>(n - 1) * ldd + m)),
      out;
  gpu_copy_to_host(all.data(), D, all.size() * sizeof(float));
  out.reserve(static_cast<size_t>(count) * n * m);
  for (int i = 0; i < count; i++)
    for (int j = 0; j < n; j++) {
      const float* column = all.data() + i * stride_d + static_cast<long long>(j) * ldd;
      out.insert(out.end(), column, column + m);
    }
  return out;
}

// D (m,n) = alpha·op(A) (m,k) · op(B) (k,n) + beta·D [+ bias (m) per column], column-major, A and
// B of type `operands`, D fp32, count times at the given strides; with algo_of_one, each of the
// count products the bits it has alone (make_plan).
void gemm(gpublasDataType_t operands, bool trans_a, bool trans_b, int m, int n, int k, float alpha, Operand A,
          Operand B, float beta, float* D, int ldd, long long stride_d, int count, const float* bias,
          bool algo_of_one = false) {
  static std::map<PlanKey, Plan> plans;
  const bool one_each = algo_of_one && count > 1;
  // A single matrix's strides mean nothing: its plan is every single product's of that shape.
  if (count == 1) A.stride = B.stride = stride_d = 0;
  const PlanKey key{static_cast<int>(operands), trans_a, trans_b, m, n, k, A.ld, B.ld, ldd, A.stride, B.stride,
                    stride_d, count, bias != nullptr, one_each, beta != 0.0f};
  auto it = plans.find(key);
  if (it == plans.end())
    it = plans.emplace(key, make_plan(operands, trans_a, trans_b, m, n, k, A, B, ldd, stride_d, count, bias,
                                      algo_of_one)).first;
  Plan& p = it->second;
  const size_t bytes = element_bytes(operands);
  auto one_at_a_time = [&](float* out) {
    for (int i = 0; i < count; i++)
      gemm(operands, trans_a, trans_b, m, n, k, alpha, {static_cast<const char*>(A.p) + i * A.stride * bytes, A.ld, 0},
           {static_cast<const char*>(B.p) + i * B.stride * bytes, B.ld, 0}, beta, out + i * stride_d, ldd, 0, 1,
           bias);
  };
  if (one_each && (!p.batched || split_batches)) return one_at_a_time(D);
  // The library's check says that the algorithm runs the batch, not that each matrix gets the
  // bits of its own product: on first use, the batch's output against the products one at a
  // time on the same operands into a copy of the outputs as they were (what accumulates, and what
  // lies between the matrices).
  const bool check = one_each && !p.checked;
  const size_t extent = static_cast<size_t>((count - 1) * stride_d + static_cast<long long>(n - 1) * ldd + m);
  float* alone = nullptr;
  if (check) {
    alone = static_cast<float*>(gpu_alloc(extent * sizeof(float)));  // once per shape: not kept
    gpu_copy_on_device(alone, D, extent * sizeof(float));
  }
  Blas& b = blas();
  if (bias) GPUBLAS_CHECK(gpublasLtMatmulDescSetAttribute(p.desc, GPUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  GPUBLAS_CHECK(gpublasLtMatmul(b.handle, p.desc, &alpha, A.p, p.la, B.p, p.lb, &beta, D, p.ld, D, p.ld, &p.algo,
                                b.workspace, kWorkspaceBytes, gpu_stream()));
  if (!check) return;
  p.checked = true;
  if (batches_differ) gpu_zero(D, extent * sizeof(float));  // other bits, as a library might give
  one_at_a_time(alone);
  const std::vector<float> together = written(D, m, n, ldd, stride_d, count),
                           apart = written(alone, m, n, ldd, stride_d, count);
  if (std::memcmp(together.data(), apart.data(), together.size() * sizeof(float)) == 0) {
    gpu_release(alone);
    return;
  }
  p.batched = false;
  log_warn("the GPU BLAS gave a batch of {} {}x{}x{} products other bits than each product alone: they run one at "
           "a time", count, m, n, k);
  gpu_copy_on_device(D, alone, extent * sizeof(float));  // the products one at a time
  gpu_release(alone);
}

gpublasDataType_t data_type(ComputeDtype d) {
  return d == ComputeDtype::kBf16 ? GPU_R_16BF : d == ComputeDtype::kFp16 ? GPU_R_16F : GPU_R_32F;
}

// The libraries pick their fast kernels only for matrices whose columns start on 16 bytes and
// whose contiguous extent is a multiple of 8 16-bit or 4 fp32 values. GPT-2's 50257-wide head
// otherwise gets Turing's one-element-aligned kernels on Hopper (94 TFLOP/s on an H200, against
// about 550 for the blocks' products): under amp its vocabulary is padded to a multiple of 8 with
// zero rows of the weight and zero columns of the gradient, which add exact zeros to every sum.
int aligned_ld(int len, int values) { return (len + values - 1) / values * values; }

// The operands of one product in the operand dtype: an fp32 array as it is, else narrowed to 16
// bits into scratch: len values per vector, vectors aligned_ld apart, vectors_out vectors of
// which those past `vectors` are zero. Scratch for a product's A, B, aligned output and padded
// bias; requests are in stream order, so the next product's narrowing waits for this one's reads.
GpuScratch scratch_a, scratch_b, scratch_out, scratch_bias;

Operand operand(GpuScratch& scratch, ComputeDtype d, const float* x, long vectors, int len, long ld,
                long vectors_out) {
  if (d == ComputeDtype::kFp32) return {x, static_cast<int>(ld), 0};
  const int ld_out = aligned_ld(len, 8);
  auto* narrow = static_cast<uint16_t*>(scratch.get(static_cast<size_t>(vectors_out) * ld_out * sizeof(uint16_t)));
  narrow_to_16(narrow, ld_out, x, ld, vectors, len, vectors_out, d);
  return {narrow, ld_out, 0};
}

// The output width of a product with OC outputs, padded under amp (aligned_ld says why).
int padded_outputs(ComputeDtype d, int OC) { return d == ComputeDtype::kFp32 ? OC : aligned_ld(OC, 8); }

// A weight (OC,C) as an operand of padded_outputs(OC) rows: the held weight's 16-bit copy, made
// on its first use in a hold (MatmulContext::hold_weight), or narrowed like any operand.
struct HeldCopy {
  uint64_t hold = 0;
  GpuScratch copy;
} held_copy;

Operand weight_operand(MatmulContext& ctx, GpuScratch& scratch, const float* w, int OC, int C) {
  const ComputeDtype d = ctx.operand_dtype();
  const MatmulContext::HeldWeight h = ctx.held_weight();
  const int rows = padded_outputs(d, OC);
  if (d == ComputeDtype::kFp32 || h.weight != w || h.OC != OC || h.C != C)
    return operand(scratch, d, w, OC, C, C, rows);
  const int ld = aligned_ld(C, 8);
  auto* copy = static_cast<uint16_t*>(held_copy.copy.get(static_cast<size_t>(rows) * ld * sizeof(uint16_t)));
  if (held_copy.hold != h.hold) {
    narrow_to_16(copy, ld, w, C, OC, C, rows, d);
    held_copy.hold = h.hold;
  }
  return {copy, ld, 0};
}

}  // namespace

void gemm_fp32_batched(bool trans_a, bool trans_b, int m, int n, int k, float alpha, Strided A, Strided B, float beta,
                       float* D, int ldd, long long stride_d, int count) {
  gemm(GPU_R_32F, trans_a, trans_b, m, n, k, alpha, {A.p, A.ld, A.stride}, {B.p, B.ld, B.stride}, beta, D, ldd,
       stride_d, count, nullptr);
}

double matmul_peak_gflops(ComputeDtype d) {
  static std::map<ComputeDtype, double> measured;
  auto it = measured.find(d);
  if (it != measured.end()) return it->second;
  // Square products of 8192, enough to fill any current GPU, of operands in the dtype training
  // gives the library, timed after a warm-up. Random values: zeros multiply faster. The
  // emulated GPU multiplies on the host, where one of those takes seconds: a small one shows its
  // rate.
#if defined(ANVIL_GPU_EMULATION)
  constexpr int n = 512, reps = 2;
#else
  constexpr int n = 8192, reps = 10;
#endif
  const size_t count = size_t{n} * n;
  std::vector<float> host(count);
  uint32_t state = 12345;
  for (float& v : host) {
    state = state * 1664525u + 1013904223u;
    v = static_cast<float>(state >> 8) / 16777216.0f - 0.5f;
  }
  auto* values = static_cast<float*>(gpu_alloc(count * sizeof(float)));
  auto* z = static_cast<float*>(gpu_alloc(count * sizeof(float)));
  gpu_copy_to_device(values, host.data(), count * sizeof(float));
  const Operand x = operand(scratch_a, d, values, n, n, n, n), y = operand(scratch_b, d, values, n, n, n, n);
  const auto product = [&] { gemm(data_type(d), true, false, n, n, n, 1.0f, x, y, 0.0f, z, n, 0, 1, nullptr); };
  product();
  gpu_synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; r++) product();
  gpu_synchronize();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  gpu_release(values);
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

namespace {

// Row-major (N,C) is column-major (C,N): out^T (OC,N) = W (OC,C) · inp^T (C,N), W being
// column-major (C,OC), hence transposed. B sequences of T rows, each with the bits of a product
// of its rows alone (one batched product running one sequence's algorithm).
void forward(MatmulContext& ctx, float* out, const float* inp, const float* weight, const float* bias, int B, int T,
             int C, int OC, bool accumulate) {
  const ComputeDtype d = ctx.operand_dtype();
  const int N = B * T;
  const Operand w = weight_operand(ctx, scratch_a, weight, OC, C), x = operand(scratch_b, d, inp, N, C, C, N);
  const Operand xs{x.p, x.ld, static_cast<long long>(T) * x.ld};
  const int M = padded_outputs(d, OC);
  if (M == OC)
    return gemm(data_type(d), true, false, OC, T, C, 1.0f, w, xs, accumulate ? 1.0f : 0.0f, out, OC,
                static_cast<long long>(T) * OC, B, bias, true);
  ANVIL_CHECK(!accumulate, "matmul_forward: accumulating into {} outputs, which 16-bit products pad to {}, is not "
              "built", OC, M);
  // Padded outputs: the product into rows of M in scratch (the bias padded with zeros), then one
  // pass to copy the OC that are the output.
  const float* bias_m = nullptr;
  if (bias) {
    auto* padded = static_cast<float*>(scratch_bias.get(static_cast<size_t>(M) * sizeof(float)));
    gpu_copy_on_device(padded, bias, static_cast<size_t>(OC) * sizeof(float));
    gpu_zero(padded + OC, static_cast<size_t>(M - OC) * sizeof(float));
    bias_m = padded;
  }
  auto* aligned = static_cast<float*>(scratch_out.get(static_cast<size_t>(N) * M * sizeof(float)));
  gemm(data_type(d), true, false, M, T, C, 1.0f, w, xs, 0.0f, aligned, M, static_cast<long long>(T) * M, B, bias_m,
       true);
  copy_columns(out, OC, 0, aligned, M, 0, N, OC, 1);
}

}  // namespace

void matmul_forward(MatmulContext& ctx, float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC, bool accumulate) {
  forward(ctx, out, inp, weight, bias, 1, N, C, OC, accumulate);
}

void matmul_forward_sequences(MatmulContext& ctx, float* out, const float* inp, const float* weight, const float* bias,
                              int B, int T, int C, int OC) {
  forward(ctx, out, inp, weight, bias, B, T, C, OC, false);
}

void matmul_split_batches(bool split) { split_batches = split; }
void matmul_batches_differ(bool differ) { batches_differ = differ; }

void matmul_backward_sequences(MatmulContext& ctx, float* dinp, float* dweight, float* dbias, size_t grads_stride,
                               const float* dout, const float* inp, const float* weight, int B, int T, int C, int OC,
                               bool write_grads) {
  const ComputeDtype d = ctx.operand_dtype();
  const int K = padded_outputs(d, OC), N = B * T;
  // As matmul_backward, each product a batch of B that runs one sequence's algorithm.
  const Operand g = operand(scratch_b, d, dout, N, OC, OC, N);
  const Operand gs{g.p, g.ld, static_cast<long long>(T) * g.ld};
  // dinp^T (C,T) = W^T (C,K) · dout^T (K,T), a sequence's columns
  if (dinp)
    gemm(data_type(d), false, false, C, T, K, 1.0f, weight_operand(ctx, scratch_a, weight, OC, C), gs, 0.0f, dinp, C,
         static_cast<long long>(T) * C, B, nullptr, true);
  // dweight^T (C,OC) = (or +=) inp^T (C,T) · dout (T,OC), each sequence's into its own
  if (dweight) {
    const Operand x = operand(scratch_a, d, inp, N, C, C, N);
    gemm(data_type(d), false, true, C, OC, T, 1.0f, {x.p, x.ld, static_cast<long long>(T) * x.ld}, gs,
         write_grads ? 0.0f : 1.0f, dweight, C, static_cast<long long>(grads_stride), B, nullptr, true);
  }
  if (dbias) column_sums(dbias, dout, OC, B, T, OC, grads_stride, !write_grads);
}

void matmul_backward(MatmulContext& ctx, float* dinp, float* dweight, float* dbias, const float* dout, long ld_dout,
                     const float* inp, const float* weight, int N, int C, int OC, bool accumulate_dinp) {
  const ComputeDtype d = ctx.operand_dtype();
  // dout in the operand dtype once, for both products, its columns padded to K with zeros: in
  // scratch_b while dinp's product uses scratch_a for the weight (K rows, the padding zero), then
  // dweight's product narrows inp into scratch_a.
  const int K = padded_outputs(d, OC);
  const Operand g = operand(scratch_b, d, dout, N, OC, ld_dout, N);
  // dinp^T (C,N) = (or +=) W^T (C,K) · dout^T (K,N)
  if (dinp)
    gemm(data_type(d), false, false, C, N, K, 1.0f, weight_operand(ctx, scratch_a, weight, OC, C), g,
         accumulate_dinp ? 1.0f : 0.0f, dinp, C, 0, 1, nullptr);
  // dweight^T (C,OC) += inp^T (C,N) · dout (N,OC)
  if (dweight)
    gemm(data_type(d), false, true, C, OC, N, 1.0f, operand(scratch_a, d, inp, N, C, C, N), g, 1.0f, dweight, C, 0, 1,
         nullptr);
  if (dbias) column_sums(dbias, dout, ld_dout, 1, N, OC, 0, true);
}

}  // namespace anvil::gpu
