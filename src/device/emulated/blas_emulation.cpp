// The emulated cuBLASLt / hipBLASLt subset (see blas_emulation.h): descriptors are plain
// structs, and a product is the host's sgemm (OpenBLAS) on the operands widened to fp32.
#include <cblas.h>

#include <cstdint>
#include <cstring>
#include <list>
#include <mutex>
#include <vector>

#include "core/dtype.h"
#include "device/blas_runtime.h"

struct EmulatedBlasHandle {};
struct EmulatedMatmulDesc {
  gpublasOperation_t trans_a = GPUBLAS_OP_N, trans_b = GPUBLAS_OP_N;
  gpublasLtEpilogue_t epilogue = GPUBLASLT_EPILOGUE_DEFAULT;
  const float* bias = nullptr;
};
struct EmulatedMatrixLayout {
  gpublasDataType_t type = GPU_R_32F;
  long rows = 0, cols = 0, ld = 0;
  int batch = 1;
  long long stride = 0;
};
struct EmulatedMatmulPreference {};

namespace {

// Descriptors live in pools that are never destroyed: those anvil keeps for the whole process
// (matmul.cpp's plans) stay reachable at exit, as a vendor library's do.
std::mutex pools_mutex;
template <class T>
std::list<T>& pool() {
  static auto* objects = new std::list<T>;
  return *objects;
}
template <class T>
T* make() {
  std::lock_guard<std::mutex> lock(pools_mutex);
  return &pool<T>().emplace_back();
}
template <class T>
gpublasStatus_t destroy(T* x) {
  std::lock_guard<std::mutex> lock(pools_mutex);
  pool<T>().remove_if([x](const T& e) { return &e == x; });
  return GPUBLAS_STATUS_SUCCESS;
}

template <class T>
gpublasStatus_t read_attribute(T* out, const void* value, size_t bytes) {
  if (bytes != sizeof(T)) return GPUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(out, value, sizeof(T));
  return GPUBLAS_STATUS_SUCCESS;
}

// A 16-bit operand of the layout's (rows, cols, ld) widened to fp32 into `copy`, same ld.
const float* widened(const void* x, const EmulatedMatrixLayout& l, int batch, std::vector<float>& copy) {
  if (l.type == GPU_R_32F) return static_cast<const float*>(x) + batch * l.stride;
  const uint16_t* h = static_cast<const uint16_t*>(x) + batch * l.stride;
  copy.assign(static_cast<size_t>(l.ld * l.cols), 0.0f);
  for (long j = 0; j < l.cols; j++)
    for (long i = 0; i < l.rows; i++) {
      const uint16_t v = h[i + j * l.ld];
      copy[i + j * l.ld] = l.type == GPU_R_16BF ? anvil::bf16_to_float(v) : anvil::fp16_to_float(v);
    }
  return copy.data();
}

}  // namespace

gpublasStatus_t gpublasLtCreate(gpublasLtHandle_t* handle) {
  *handle = make<EmulatedBlasHandle>();
  return GPUBLAS_STATUS_SUCCESS;
}

size_t gpublasLtGetVersion() { return 0; }

// fp32 accumulation, the one compute type there is (operands are widened to fp32 exactly).
gpublasStatus_t gpublasLtMatmulDescCreate(gpublasLtMatmulDesc_t* desc, gpublasComputeType_t, gpublasDataType_t) {
  *desc = make<EmulatedMatmulDesc>();
  return GPUBLAS_STATUS_SUCCESS;
}

gpublasStatus_t gpublasLtMatmulDescDestroy(gpublasLtMatmulDesc_t desc) { return destroy(desc); }

gpublasStatus_t gpublasLtMatmulDescSetAttribute(gpublasLtMatmulDesc_t desc, gpublasLtMatmulDescAttribute_t attribute,
                                                const void* value, size_t bytes) {
  switch (attribute) {
    case GPUBLASLT_MATMUL_DESC_TRANSA: return read_attribute(&desc->trans_a, value, bytes);
    case GPUBLASLT_MATMUL_DESC_TRANSB: return read_attribute(&desc->trans_b, value, bytes);
    case GPUBLASLT_MATMUL_DESC_EPILOGUE: return read_attribute(&desc->epilogue, value, bytes);
    case GPUBLASLT_MATMUL_DESC_BIAS_POINTER: return read_attribute(&desc->bias, value, bytes);
  }
  return GPUBLAS_STATUS_INVALID_VALUE;
}

gpublasStatus_t gpublasLtMatrixLayoutCreate(gpublasLtMatrixLayout_t* layout, gpublasDataType_t type,
                                            unsigned long rows, unsigned long cols, long ld) {
  if (ld < static_cast<long>(rows)) return GPUBLAS_STATUS_INVALID_VALUE;
  *layout = make<EmulatedMatrixLayout>();
  **layout = EmulatedMatrixLayout{type, static_cast<long>(rows), static_cast<long>(cols), ld};
  return GPUBLAS_STATUS_SUCCESS;
}

gpublasStatus_t gpublasLtMatrixLayoutDestroy(gpublasLtMatrixLayout_t layout) { return destroy(layout); }

gpublasStatus_t gpublasLtMatrixLayoutSetAttribute(gpublasLtMatrixLayout_t layout,
                                                  gpublasLtMatrixLayoutAttribute_t attribute, const void* value,
                                                  size_t bytes) {
  switch (attribute) {
    case GPUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return read_attribute(&layout->batch, value, bytes);
    case GPUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return read_attribute(&layout->stride, value, bytes);
  }
  return GPUBLAS_STATUS_INVALID_VALUE;
}

gpublasStatus_t gpublasLtMatmulPreferenceCreate(gpublasLtMatmulPreference_t* pref) {
  *pref = make<EmulatedMatmulPreference>();
  return GPUBLAS_STATUS_SUCCESS;
}

gpublasStatus_t gpublasLtMatmulPreferenceDestroy(gpublasLtMatmulPreference_t pref) { return destroy(pref); }

gpublasStatus_t gpublasLtMatmulPreferenceSetAttribute(gpublasLtMatmulPreference_t,
                                                      gpublasLtMatmulPreferenceAttribute_t, const void*, size_t) {
  return GPUBLAS_STATUS_SUCCESS;
}

// One algorithm for every product whose shapes agree.
gpublasStatus_t gpublasLtMatmulAlgoGetHeuristic(gpublasLtHandle_t, gpublasLtMatmulDesc_t desc,
                                                gpublasLtMatrixLayout_t a, gpublasLtMatrixLayout_t b,
                                                gpublasLtMatrixLayout_t c, gpublasLtMatrixLayout_t d,
                                                gpublasLtMatmulPreference_t, int requested,
                                                gpublasLtMatmulHeuristicResult_t* results, int* found) {
  *found = 0;
  const bool ta = desc->trans_a == GPUBLAS_OP_T, tb = desc->trans_b == GPUBLAS_OP_T;
  const long m = ta ? a->cols : a->rows, k = ta ? a->rows : a->cols;
  const long kb = tb ? b->cols : b->rows, n = tb ? b->rows : b->cols;
  if (requested < 1 || k != kb || d->rows != m || d->cols != n || c->rows != m || c->cols != n ||
      a->batch != d->batch || b->batch != d->batch || a->type != b->type || c->type != GPU_R_32F ||
      d->type != GPU_R_32F)
    return GPUBLAS_STATUS_INVALID_VALUE;
  results[0].algo.id = 0;
  results[0].workspaceSize = 0;
  *found = 1;
  return GPUBLAS_STATUS_SUCCESS;
}

gpublasStatus_t gpublasLtMatmulAlgoCheck(gpublasLtHandle_t handle, gpublasLtMatmulDesc_t desc,
                                         gpublasLtMatrixLayout_t a, gpublasLtMatrixLayout_t b,
                                         gpublasLtMatrixLayout_t c, gpublasLtMatrixLayout_t d,
                                         const gpublasLtMatmulAlgo_t* algo, gpublasLtMatmulHeuristicResult_t* result) {
  int found = 0;
  const gpublasStatus_t status = gpublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, c, d, nullptr, 1, result, &found);
  if (status != GPUBLAS_STATUS_SUCCESS || algo->id != result->algo.id) return GPUBLAS_STATUS_INVALID_VALUE;
  return GPUBLAS_STATUS_SUCCESS;
}

gpublasStatus_t gpublasLtMatmul(gpublasLtHandle_t, gpublasLtMatmulDesc_t desc, const void* alpha, const void* A,
                                gpublasLtMatrixLayout_t a, const void* B, gpublasLtMatrixLayout_t b, const void* beta,
                                const void* C, gpublasLtMatrixLayout_t c, void* D, gpublasLtMatrixLayout_t d,
                                const gpublasLtMatmulAlgo_t*, void*, size_t, gpuStream_t) {
  const float* bias = desc->epilogue == GPUBLASLT_EPILOGUE_BIAS ? desc->bias : nullptr;
  using anvil::emulation::on_device;
  if (!on_device(A) || !on_device(B) || !on_device(C) || !on_device(D) || (bias && !on_device(bias)))
    return GPUBLAS_STATUS_INVALID_VALUE;  // an operand in host memory: a GPU would fault
  const bool ta = desc->trans_a == GPUBLAS_OP_T, tb = desc->trans_b == GPUBLAS_OP_T;
  const long m = d->rows, n = d->cols, k = ta ? a->rows : a->cols;
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  std::vector<float> a32, b32;
  for (int batch = 0; batch < d->batch; batch++) {
    const float* pa = widened(A, *a, batch, a32);
    const float* pb = widened(B, *b, batch, b32);
    const float* pc = static_cast<const float*>(C) + batch * c->stride;
    float* pd = static_cast<float*>(D) + batch * d->stride;
    if (pc != pd && be != 0.0f)
      for (long j = 0; j < n; j++) std::memcpy(pd + j * d->ld, pc + j * c->ld, static_cast<size_t>(m) * sizeof(float));
    const auto i32 = [](long v) { return static_cast<int>(v); };
    cblas_sgemm(CblasColMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, i32(m), i32(n), i32(k),
                al, pa, i32(a->ld), pb, i32(b->ld), be, pd, i32(d->ld));
    if (bias)
      for (long j = 0; j < n; j++)
        for (long i = 0; i < m; i++) pd[i + j * d->ld] += bias[i];
  }
  return GPUBLAS_STATUS_SUCCESS;
}
