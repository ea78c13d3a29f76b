// The one header that maps anvil's GPU vocabulary to the vendor's: CUDA runtime, cuBLASLt and
// NCCL on NVIDIA; HIP, hipBLASLt and RCCL on AMD. Kernel and host sources write gpuX and never
// name a vendor; the build defines ANVIL_HIP for AMD, and ANVIL_GPU_EMULATION where the GPU code
// runs on the CPU (device/emulated/emulation.h: the emulated backend of the CPU build's tests).
#pragma once

#if defined(ANVIL_GPU_EMULATION)
#include "device/emulated/emulation.h"
#elif defined(ANVIL_HIP)
#include <hip/hip_bfloat16.h>
#include <hip/hip_runtime.h>
using gpuError_t = hipError_t;
using gpuStream_t = hipStream_t;
using gpuEvent_t = hipEvent_t;
using gpuDeviceProp_t = hipDeviceProp_t;
using gpu_bf16 = hip_bfloat16;
#define gpuSuccess hipSuccess
#define gpuGetErrorString hipGetErrorString
#define gpuGetLastError hipGetLastError
#define gpuGetDeviceCount hipGetDeviceCount
#define gpuGetDeviceProperties hipGetDeviceProperties
#define gpuSetDevice hipSetDevice
#define gpuGetDevice hipGetDevice
#define gpuDriverGetVersion hipDriverGetVersion
#define gpuRuntimeGetVersion hipRuntimeGetVersion
#define gpuMemGetInfo hipMemGetInfo
#define gpuMalloc hipMalloc
#define gpuFree hipFree
#define gpuMallocHost hipHostMalloc
#define gpuFreeHost hipHostFree
#define gpuMemcpyAsync hipMemcpyAsync
#define gpuMemsetAsync hipMemsetAsync
#define gpuMemcpyHostToDevice hipMemcpyHostToDevice
#define gpuMemcpyDeviceToHost hipMemcpyDeviceToHost
#define gpuMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define gpuStreamCreateWithFlags hipStreamCreateWithFlags
#define gpuStreamNonBlocking hipStreamNonBlocking
#define gpuStreamDestroy hipStreamDestroy
#define gpuStreamSynchronize hipStreamSynchronize
#define gpuStreamWaitEvent hipStreamWaitEvent
#define gpuEventCreate hipEventCreate
#define gpuEventDestroy hipEventDestroy
#define gpuEventRecord hipEventRecord
#define gpuEventSynchronize hipEventSynchronize
#define gpuEventElapsedTime hipEventElapsedTime
#define gpuEventCreateWithFlags hipEventCreateWithFlags
#define gpuEventDisableTiming hipEventDisableTiming
#define gpuStreamQuery hipStreamQuery
#define gpuDeviceGetPCIBusId hipDeviceGetPCIBusId
#define gpuErrorNotReady hipErrorNotReady
#else
#include <cuda_bf16.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
using gpuError_t = cudaError_t;
using gpuStream_t = cudaStream_t;
using gpuEvent_t = cudaEvent_t;
using gpuDeviceProp_t = cudaDeviceProp;
using gpu_bf16 = __nv_bfloat16;
#define gpuSuccess cudaSuccess
#define gpuGetErrorString cudaGetErrorString
#define gpuGetLastError cudaGetLastError
#define gpuGetDeviceCount cudaGetDeviceCount
#define gpuGetDeviceProperties cudaGetDeviceProperties
#define gpuSetDevice cudaSetDevice
#define gpuGetDevice cudaGetDevice
#define gpuDriverGetVersion cudaDriverGetVersion
#define gpuRuntimeGetVersion cudaRuntimeGetVersion
#define gpuMemGetInfo cudaMemGetInfo
#define gpuMalloc cudaMalloc
#define gpuFree cudaFree
#define gpuMallocHost cudaMallocHost
#define gpuFreeHost cudaFreeHost
#define gpuMemcpyAsync cudaMemcpyAsync
#define gpuMemsetAsync cudaMemsetAsync
#define gpuMemcpyHostToDevice cudaMemcpyHostToDevice
#define gpuMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define gpuMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define gpuStreamCreateWithFlags cudaStreamCreateWithFlags
#define gpuStreamNonBlocking cudaStreamNonBlocking
#define gpuStreamDestroy cudaStreamDestroy
#define gpuStreamSynchronize cudaStreamSynchronize
#define gpuStreamWaitEvent cudaStreamWaitEvent
#define gpuEventCreate cudaEventCreate
#define gpuEventDestroy cudaEventDestroy
#define gpuEventRecord cudaEventRecord
#define gpuEventSynchronize cudaEventSynchronize
#define gpuEventElapsedTime cudaEventElapsedTime
#define gpuEventCreateWithFlags cudaEventCreateWithFlags
#define gpuEventDisableTiming cudaEventDisableTiming
#define gpuStreamQuery cudaStreamQuery
#define gpuDeviceGetPCIBusId cudaDeviceGetPCIBusId
#define gpuErrorNotReady cudaErrorNotReady
#define gpuProfilerStart cudaProfilerStart
#define gpuProfilerStop cudaProfilerStop
#endif

namespace anvil {
// Throws the anvil::Error that GPU_CHECK reports (defined in device.cpp, so that kernel sources
// need not compile the formatting library).
[[noreturn]] void gpu_fail(const char* expr, const char* message, const char* file, int line);
}  // namespace anvil

// Wraps a runtime call: on failure, an anvil::Error naming the call, the vendor's message and
// file:line.
#define GPU_CHECK(expr)                                                                      \
  do {                                                                                       \
    gpuError_t anvil_gpu_err_ = (expr);                                                      \
    if (anvil_gpu_err_ != gpuSuccess)                                                        \
      ::anvil::gpu_fail(#expr, gpuGetErrorString(anvil_gpu_err_), __FILE__, __LINE__);       \
  } while (0)
// After a kernel launch: a bad configuration is reported at once, not at the next sync.
#define GPU_CHECK_LAUNCH() GPU_CHECK(gpuGetLastError())
