// The BLAS half of the vendor mapping (device/runtime.h holds the runtime half): cuBLASLt on
// NVIDIA, hipBLASLt on AMD, under gpublasLt names.
#pragma once
#include "device/runtime.h"

#if defined(ANVIL_GPU_EMULATION)
#include "device/emulated/blas_emulation.h"
#elif defined(ANVIL_HIP)
#include <hipblaslt/hipblaslt.h>
using gpublasStatus_t = hipblasStatus_t;
using gpublasLtHandle_t = hipblasLtHandle_t;
using gpublasLtMatmulDesc_t = hipblasLtMatmulDesc_t;
using gpublasLtMatrixLayout_t = hipblasLtMatrixLayout_t;
using gpublasLtMatmulPreference_t = hipblasLtMatmulPreference_t;
using gpublasLtMatmulHeuristicResult_t = hipblasLtMatmulHeuristicResult_t;
using gpublasLtMatmulAlgo_t = hipblasLtMatmulAlgo_t;
using gpublasLtEpilogue_t = hipblasLtEpilogue_t;
using gpublasComputeType_t = hipblasComputeType_t;
using gpublasDataType_t = hipDataType;
#define GPUBLAS_STATUS_SUCCESS HIPBLAS_STATUS_SUCCESS
#define GPUBLAS_OP_N HIPBLAS_OP_N
#define GPUBLAS_OP_T HIPBLAS_OP_T
#define GPUBLAS_COMPUTE_32F HIPBLAS_COMPUTE_32F
#define GPU_R_32F HIP_R_32F
#define GPU_R_16BF HIP_R_16BF
#define GPU_R_16F HIP_R_16F
#define GPUBLASLT_EPILOGUE_DEFAULT HIPBLASLT_EPILOGUE_DEFAULT
#define GPUBLASLT_EPILOGUE_BIAS HIPBLASLT_EPILOGUE_BIAS
#define GPUBLASLT_MATMUL_DESC_TRANSA HIPBLASLT_MATMUL_DESC_TRANSA
#define GPUBLASLT_MATMUL_DESC_TRANSB HIPBLASLT_MATMUL_DESC_TRANSB
#define GPUBLASLT_MATMUL_DESC_EPILOGUE HIPBLASLT_MATMUL_DESC_EPILOGUE
#define GPUBLASLT_MATMUL_DESC_BIAS_POINTER HIPBLASLT_MATMUL_DESC_BIAS_POINTER
#define GPUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES HIPBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES
#define GPUBLASLT_MATRIX_LAYOUT_BATCH_COUNT HIPBLASLT_MATRIX_LAYOUT_BATCH_COUNT
#define GPUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET HIPBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET
#define gpublasLtMatrixLayoutSetAttribute hipblasLtMatrixLayoutSetAttribute
#define gpublasLtCreate hipblasLtCreate
#define gpublasLtMatmulDescCreate hipblasLtMatmulDescCreate
#define gpublasLtMatmulDescDestroy hipblasLtMatmulDescDestroy
#define gpublasLtMatmulDescSetAttribute hipblasLtMatmulDescSetAttribute
#define gpublasLtMatrixLayoutCreate hipblasLtMatrixLayoutCreate
#define gpublasLtMatrixLayoutDestroy hipblasLtMatrixLayoutDestroy
#define gpublasLtMatmulPreferenceCreate hipblasLtMatmulPreferenceCreate
#define gpublasLtMatmulPreferenceDestroy hipblasLtMatmulPreferenceDestroy
#define gpublasLtMatmulPreferenceSetAttribute hipblasLtMatmulPreferenceSetAttribute
#define gpublasLtMatmulAlgoGetHeuristic hipblasLtMatmulAlgoGetHeuristic
#define gpublasLtMatmulAlgoCheck hipblasLtMatmulAlgoCheck
#define gpublasLtMatmul hipblasLtMatmul
#define gpublasLtGetVersion hipblasLtGetVersion
#else
#include <cublasLt.h>
using gpublasStatus_t = cublasStatus_t;
using gpublasLtHandle_t = cublasLtHandle_t;
using gpublasLtMatmulDesc_t = cublasLtMatmulDesc_t;
using gpublasLtMatrixLayout_t = cublasLtMatrixLayout_t;
using gpublasLtMatmulPreference_t = cublasLtMatmulPreference_t;
using gpublasLtMatmulHeuristicResult_t = cublasLtMatmulHeuristicResult_t;
using gpublasLtMatmulAlgo_t = cublasLtMatmulAlgo_t;
using gpublasLtEpilogue_t = cublasLtEpilogue_t;
using gpublasComputeType_t = cublasComputeType_t;
using gpublasDataType_t = cudaDataType_t;
#define GPUBLAS_STATUS_SUCCESS CUBLAS_STATUS_SUCCESS
#define GPUBLAS_OP_N CUBLAS_OP_N
#define GPUBLAS_OP_T CUBLAS_OP_T
#define GPUBLAS_COMPUTE_32F CUBLAS_COMPUTE_32F
#define GPU_R_32F CUDA_R_32F
#define GPU_R_16BF CUDA_R_16BF
#define GPU_R_16F CUDA_R_16F
#define GPUBLASLT_EPILOGUE_DEFAULT CUBLASLT_EPILOGUE_DEFAULT
#define GPUBLASLT_EPILOGUE_BIAS CUBLASLT_EPILOGUE_BIAS
#define GPUBLASLT_MATMUL_DESC_TRANSA CUBLASLT_MATMUL_DESC_TRANSA
#define GPUBLASLT_MATMUL_DESC_TRANSB CUBLASLT_MATMUL_DESC_TRANSB
#define GPUBLASLT_MATMUL_DESC_EPILOGUE CUBLASLT_MATMUL_DESC_EPILOGUE
#define GPUBLASLT_MATMUL_DESC_BIAS_POINTER CUBLASLT_MATMUL_DESC_BIAS_POINTER
#define GPUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES
#define GPUBLASLT_MATRIX_LAYOUT_BATCH_COUNT CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT
#define GPUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET
#define gpublasLtMatrixLayoutSetAttribute cublasLtMatrixLayoutSetAttribute
#define gpublasLtCreate cublasLtCreate
#define gpublasLtMatmulDescCreate cublasLtMatmulDescCreate
#define gpublasLtMatmulDescDestroy cublasLtMatmulDescDestroy
#define gpublasLtMatmulDescSetAttribute cublasLtMatmulDescSetAttribute
#define gpublasLtMatrixLayoutCreate cublasLtMatrixLayoutCreate
#define gpublasLtMatrixLayoutDestroy cublasLtMatrixLayoutDestroy
#define gpublasLtMatmulPreferenceCreate cublasLtMatmulPreferenceCreate
#define gpublasLtMatmulPreferenceDestroy cublasLtMatmulPreferenceDestroy
#define gpublasLtMatmulPreferenceSetAttribute cublasLtMatmulPreferenceSetAttribute
#define gpublasLtMatmulAlgoGetHeuristic cublasLtMatmulAlgoGetHeuristic
#define gpublasLtMatmulAlgoCheck cublasLtMatmulAlgoCheck
#define gpublasLtMatmul cublasLtMatmul
#define gpublasLtGetVersion cublasLtGetVersion
#endif

#define GPUBLAS_CHECK(expr)                                                                  \
  do {                                                                                       \
    gpublasStatus_t anvil_blas_status_ = (expr);                                             \
    if (anvil_blas_status_ != GPUBLAS_STATUS_SUCCESS)                                        \
      ::anvil::gpu_fail(#expr, "BLAS status not success", __FILE__, __LINE__);               \
  } while (0)
