// The part of cuBLASLt / hipBLASLt that anvil uses (src/kernels/gpu/matmul.cpp), emulated on the
// CPU for the emulated runtime (device/emulated/emulation.h): blas_runtime.h includes this instead of the
// vendor's header when the build defines ANVIL_GPU_EMULATION. Products are column-major, strided-
// batched, with the bias epilogue, computed by the host's sgemm in fp32; operands may be bf16 or
// fp16 (widened exactly), the output fp32.
#pragma once
#include <cstddef>

#include "device/runtime.h"

enum gpublasStatus_t { GPUBLAS_STATUS_SUCCESS = 0, GPUBLAS_STATUS_INVALID_VALUE = 7 };
enum gpublasOperation_t { GPUBLAS_OP_N, GPUBLAS_OP_T };
enum gpublasComputeType_t { GPUBLAS_COMPUTE_32F };
enum gpublasDataType_t { GPU_R_32F, GPU_R_16BF, GPU_R_16F };
enum gpublasLtEpilogue_t { GPUBLASLT_EPILOGUE_DEFAULT, GPUBLASLT_EPILOGUE_BIAS };
enum gpublasLtMatmulDescAttribute_t {
  GPUBLASLT_MATMUL_DESC_TRANSA,
  GPUBLASLT_MATMUL_DESC_TRANSB,
  GPUBLASLT_MATMUL_DESC_EPILOGUE,
  GPUBLASLT_MATMUL_DESC_BIAS_POINTER,
};
enum gpublasLtMatrixLayoutAttribute_t {
  GPUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
  GPUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
};
enum gpublasLtMatmulPreferenceAttribute_t { GPUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES };

using gpublasLtHandle_t = struct EmulatedBlasHandle*;
using gpublasLtMatmulDesc_t = struct EmulatedMatmulDesc*;
using gpublasLtMatrixLayout_t = struct EmulatedMatrixLayout*;
using gpublasLtMatmulPreference_t = struct EmulatedMatmulPreference*;
struct gpublasLtMatmulAlgo_t {
  int id;
};
struct gpublasLtMatmulHeuristicResult_t {
  gpublasLtMatmulAlgo_t algo;
  size_t workspaceSize;
};

gpublasStatus_t gpublasLtCreate(gpublasLtHandle_t* handle);
size_t gpublasLtGetVersion();
gpublasStatus_t gpublasLtMatmulDescCreate(gpublasLtMatmulDesc_t* desc, gpublasComputeType_t compute,
                                          gpublasDataType_t scale_type);
gpublasStatus_t gpublasLtMatmulDescDestroy(gpublasLtMatmulDesc_t desc);
gpublasStatus_t gpublasLtMatmulDescSetAttribute(gpublasLtMatmulDesc_t desc, gpublasLtMatmulDescAttribute_t attribute,
                                                const void* value, size_t bytes);
gpublasStatus_t gpublasLtMatrixLayoutCreate(gpublasLtMatrixLayout_t* layout, gpublasDataType_t type, unsigned long rows,
                                            unsigned long cols, long ld);
gpublasStatus_t gpublasLtMatrixLayoutDestroy(gpublasLtMatrixLayout_t layout);
gpublasStatus_t gpublasLtMatrixLayoutSetAttribute(gpublasLtMatrixLayout_t layout,
                                                  gpublasLtMatrixLayoutAttribute_t attribute, const void* value,
                                                  size_t bytes);
gpublasStatus_t gpublasLtMatmulPreferenceCreate(gpublasLtMatmulPreference_t* pref);
gpublasStatus_t gpublasLtMatmulPreferenceDestroy(gpublasLtMatmulPreference_t pref);
gpublasStatus_t gpublasLtMatmulPreferenceSetAttribute(gpublasLtMatmulPreference_t pref,
                                                      gpublasLtMatmulPreferenceAttribute_t attribute, const void* value,
                                                      size_t bytes);
gpublasStatus_t gpublasLtMatmulAlgoGetHeuristic(gpublasLtHandle_t handle, gpublasLtMatmulDesc_t desc,
                                                gpublasLtMatrixLayout_t a, gpublasLtMatrixLayout_t b,
                                                gpublasLtMatrixLayout_t c, gpublasLtMatrixLayout_t d,
                                                gpublasLtMatmulPreference_t pref, int requested,
                                                gpublasLtMatmulHeuristicResult_t* results, int* found);
// Whether algo runs the product these descriptors describe (the emulation's one algorithm runs
// every product whose shapes agree), and the workspace it needs there.
gpublasStatus_t gpublasLtMatmulAlgoCheck(gpublasLtHandle_t handle, gpublasLtMatmulDesc_t desc,
                                         gpublasLtMatrixLayout_t a, gpublasLtMatrixLayout_t b,
                                         gpublasLtMatrixLayout_t c, gpublasLtMatrixLayout_t d,
                                         const gpublasLtMatmulAlgo_t* algo, gpublasLtMatmulHeuristicResult_t* result);
// D = alpha · op(A) · op(B) + beta · C [+ bias per row of D], for each matrix of the batch.
gpublasStatus_t gpublasLtMatmul(gpublasLtHandle_t handle, gpublasLtMatmulDesc_t desc, const void* alpha, const void* A,
                                gpublasLtMatrixLayout_t a, const void* B, gpublasLtMatrixLayout_t b, const void* beta,
                                const void* C, gpublasLtMatrixLayout_t c, void* D, gpublasLtMatrixLayout_t d,
                                const gpublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                                gpuStream_t stream);
