// The GPU runtime and kernel language emulated on the CPU, so that the kernel sources' logic is
// tested on machines without a GPU: runtime.h includes this instead of the vendor's headers when
// the build defines ANVIL_GPU_EMULATION (the emulated backend of the CPU build's tests: the
// emulated op tests and anvil_gpu_emulated; never a release binary).
//
// A launch runs its blocks one after another on the calling thread. Each GPU thread of a block
// that meets a barrier (__syncthreads, a warp shuffle or sync) runs as a fiber of its own, switched
// at the barriers, so block- and warp-synchronous code behaves as on a GPU; a block whose first
// thread ends without meeting one runs its threads as plain calls. Warps are 32 lanes, or 64 with
// ANVIL_HIP (AMD's wavefronts), so both branches of device/arch.h are exercised. The threads run
// from one barrier to the next in ascending and descending order by turns, so a missing barrier
// between a write and another thread's read gives a stale read. What emulation cannot show:
// races between blocks, the device's own math library (expf, rsqrtf differ in the last bits),
// the vendor libraries' own algorithms (blas_emulation.h stands in for cuBLASLt), and speed.
#pragma once
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

// ---- the runtime (host side)

enum gpuError_t {
  gpuSuccess = 0,
  gpuErrorInvalidValue = 1,
  gpuErrorMemoryAllocation = 2,
  gpuErrorInvalidConfiguration = 9,
  gpuErrorNotReady = 600,
  gpuErrorIllegalAddress = 700,
  gpuErrorBarrierNotReached = 1000,  // emulation only: the kernel would hang on a GPU
};
enum gpuMemcpyKind { gpuMemcpyHostToDevice, gpuMemcpyDeviceToHost, gpuMemcpyDeviceToDevice };
constexpr unsigned gpuStreamNonBlocking = 1;
constexpr unsigned gpuEventDisableTiming = 2;
using gpuStream_t = struct EmulatedStream*;
using gpuEvent_t = struct EmulatedEvent*;
struct gpuDeviceProp_t {
  char name[256];
  char gcnArchName[256];
  size_t totalGlobalMem;
  int major, minor, multiProcessorCount;
};

const char* gpuGetErrorString(gpuError_t error);
gpuError_t gpuGetLastError();
gpuError_t gpuGetDeviceCount(int* count);
gpuError_t gpuGetDeviceProperties(gpuDeviceProp_t* prop, int device);
gpuError_t gpuSetDevice(int device);
gpuError_t gpuGetDevice(int* device);
gpuError_t gpuDriverGetVersion(int* version);
gpuError_t gpuRuntimeGetVersion(int* version);
gpuError_t gpuMemGetInfo(size_t* free_bytes, size_t* total_bytes);
gpuError_t gpuDeviceGetPCIBusId(char* id, int length, int device);
gpuError_t gpuMalloc(void** p, size_t bytes);
gpuError_t gpuFree(void* p);
// Page-locked host memory: host memory like any other here.
gpuError_t gpuMallocHost(void** p, size_t bytes);
gpuError_t gpuFreeHost(void* p);
// Work is done when it is issued: streams and events only order what is already ordered.
gpuError_t gpuMemcpyAsync(void* dst, const void* src, size_t bytes, gpuMemcpyKind kind, gpuStream_t stream);
gpuError_t gpuMemsetAsync(void* dst, int value, size_t bytes, gpuStream_t stream);
gpuError_t gpuStreamCreateWithFlags(gpuStream_t* stream, unsigned flags);
gpuError_t gpuStreamDestroy(gpuStream_t stream);
gpuError_t gpuStreamSynchronize(gpuStream_t stream);
gpuError_t gpuStreamQuery(gpuStream_t stream);
gpuError_t gpuStreamWaitEvent(gpuStream_t stream, gpuEvent_t event, unsigned flags);
gpuError_t gpuEventCreate(gpuEvent_t* event);
gpuError_t gpuEventCreateWithFlags(gpuEvent_t* event, unsigned flags);
gpuError_t gpuEventDestroy(gpuEvent_t event);
gpuError_t gpuEventRecord(gpuEvent_t event, gpuStream_t stream);
gpuError_t gpuEventSynchronize(gpuEvent_t event);
gpuError_t gpuEventElapsedTime(float* ms, gpuEvent_t start, gpuEvent_t end);
// No profiler watches the emulated GPU.
gpuError_t gpuProfilerStart();
gpuError_t gpuProfilerStop();

// ---- the kernel language

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
// Blocks run one at a time, so one static instance per declaration is each block's own.
#define __shared__ static

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
// The vector types kernels load and store whole, with CUDA's sizes and alignments.
#define __align__(n) __attribute__((aligned(n)))
struct alignas(8) float2 {
  float x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned x, y;
};
struct alignas(16) longlong2 {
  long long x, y;
};

namespace anvil::emulation {

#if defined(ANVIL_HIP)
constexpr int kWarpLanes = 64;
#else
constexpr int kWarpLanes = 32;
#endif

// The indices of the GPU thread running now.
struct Position {
  dim3 thread, block, block_dim, grid_dim;
};
extern Position position;

// Runs thread_body once for every thread of the grid (see the file comment). A bad configuration
// or a barrier that not every thread of a block reaches becomes the next gpuGetLastError.
void run_grid(dim3 grid, dim3 block, const std::function<void()>& thread_body);

// Whether p lies in (or just past) a live gpuMalloc allocation. Memory is host memory here, so
// the emulator checks what a GPU would fault on: a kernel argument, BLAS operand or copy that
// points to host memory where device memory is meant.
bool on_device(const void* p);
// Records an illegal address as the next gpuGetLastError (as a GPU reports the fault).
void fail_illegal_address();

// Block and warp barriers, and a warp's exchange of 8-byte values: each lane gives `bits` and
// receives lane `source`'s.
void block_barrier();
void warp_barrier();
uint64_t warp_exchange(uint64_t bits, int source);
// Every lane of the warp gives `words` values and receives all lanes' (all[lane · words + i],
// lanes in order): what `words` rounds of shuffles from every lane would give, in one exchange.
void warp_gather(const uint64_t* mine, int words, uint64_t* all);

template <class T>
T shuffle(T v, int source) {
  static_assert(sizeof(T) <= sizeof(uint64_t));
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = warp_exchange(bits, source);
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}
inline int lane() {
  const Position& p = position;
  return static_cast<int>((p.thread.z * p.block_dim.y + p.thread.y) * p.block_dim.x + p.thread.x) % kWarpLanes;
}

// A kernel argument a GPU could read: not a pointer, null, or a pointer to device memory.
template <class T>
bool device_or_not_pointer(const T& x) {
  if constexpr (std::is_pointer_v<T>)
    return x == nullptr || on_device(x);
  else
    return true;
}

// kernel<<<grid, block>>>(args...) as launch(kernel, grid, block)(args...): the arguments are
// converted to the kernel's parameter types once, as a launch copies them.

template <class... P>
class Launch {
 public:
  Launch(void (*kernel)(P...), dim3 grid, dim3 block) : kernel_(kernel), grid_(grid), block_(block) {}
  template <class... A>
  void operator()(A&&... args) const {
    const std::tuple<P...> params(std::forward<A>(args)...);
    const bool readable = std::apply([](const auto&... p) { return (device_or_not_pointer(p) && ...); }, params);
    if (!readable) {
      fail_illegal_address();
      return;
    }
    run_grid(grid_, block_, [&] { std::apply(kernel_, params); });
  }

 private:
  void (*kernel_)(P...);
  dim3 grid_, block_;
};
template <class... P>
Launch<P...> launch(void (*kernel)(P...), dim3 grid, dim3 block) {
  return Launch<P...>(kernel, grid, block);
}

}  // namespace anvil::emulation

#define threadIdx (::anvil::emulation::position.thread)
#define blockIdx (::anvil::emulation::position.block)
#define blockDim (::anvil::emulation::position.block_dim)
#define gridDim (::anvil::emulation::position.grid_dim)

inline void __syncthreads() { anvil::emulation::block_barrier(); }
inline void __syncwarp(unsigned = 0xffffffffu) { anvil::emulation::warp_barrier(); }
template <class T>
T __shfl_xor_sync(unsigned, T v, int mask, int = anvil::emulation::kWarpLanes) {
  return anvil::emulation::shuffle(v, anvil::emulation::lane() ^ mask);
}
template <class T>
T __shfl_sync(unsigned, T v, int source, int = anvil::emulation::kWarpLanes) {
  return anvil::emulation::shuffle(v, source % anvil::emulation::kWarpLanes);
}
template <class T>
T __shfl_xor(T v, int mask, int = anvil::emulation::kWarpLanes) {
  return anvil::emulation::shuffle(v, anvil::emulation::lane() ^ mask);
}
template <class T>
T __shfl(T v, int source, int = anvil::emulation::kWarpLanes) {
  return anvil::emulation::shuffle(v, source % anvil::emulation::kWarpLanes);
}
#define __builtin_amdgcn_wave_barrier() ::anvil::emulation::warp_barrier()

// Threads run one at a time: an atomic is a plain read-modify-write.
inline unsigned atomicMax(unsigned* p, unsigned v) {
  const unsigned old = *p;
  if (v > old) *p = v;
  return old;
}
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
inline long long __double_as_longlong(double x) { return std::bit_cast<long long>(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
using std::isfinite;
using std::isnan;
inline int min(int a, int b) { return a < b ? a : b; }
inline size_t min(size_t a, size_t b) { return a < b ? a : b; }
