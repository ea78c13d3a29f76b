// Four consecutive values a thread, for the GPU's memory-bound passes (included by .cu sources
// only). Element-wise kernels take a quad a thread (blocks_for(quads(N))): one 16-byte access
// where the quad is whole and starts on 16 bytes, else single ones. These passes are
// memory-bound, and single accesses left a third of an H200's bandwidth unused.
#pragma once
#include <cstdint>

#include "device/arch.h"

namespace anvil::gpu {

inline long quads(long n) { return (n + 3) / 4; }
__device__ inline long quad_start() { return 4 * (static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x); }
// The quad from p[i] (i < n); past n, zeros.
__device__ inline float4 load_quad(const float* p, long i, long n) {
  if (i + 4 <= n && reinterpret_cast<uintptr_t>(p + i) % 16 == 0) return *reinterpret_cast<const float4*>(p + i);
  return {p[i], i + 1 < n ? p[i + 1] : 0.0f, i + 2 < n ? p[i + 2] : 0.0f, i + 3 < n ? p[i + 3] : 0.0f};
}
// The quad's values before n, from p[i] (i < n).
__device__ inline void store_quad(float* p, long i, long n, float4 q) {
  if (i + 4 <= n && reinterpret_cast<uintptr_t>(p + i) % 16 == 0) {
    *reinterpret_cast<float4*>(p + i) = q;
    return;
  }
  p[i] = q.x;
  if (i + 1 < n) p[i + 1] = q.y;
  if (i + 2 < n) p[i + 2] = q.z;
  if (i + 3 < n) p[i + 3] = q.w;
}
// The same for 64-bit integers: two 16-byte accesses.
__device__ inline void load_quad(const int64_t* p, long i, long n, int64_t (&q)[4]) {
  if (i + 4 <= n && reinterpret_cast<uintptr_t>(p + i) % 16 == 0) {
    const longlong2 lo = *reinterpret_cast<const longlong2*>(p + i), hi = *reinterpret_cast<const longlong2*>(p + i + 2);
    q[0] = lo.x;
    q[1] = lo.y;
    q[2] = hi.x;
    q[3] = hi.y;
    return;
  }
  for (int j = 0; j < 4; j++) q[j] = i + j < n ? p[i + j] : 0;
}
__device__ inline void store_quad(int64_t* p, long i, long n, const int64_t (&q)[4]) {
  if (i + 4 <= n && reinterpret_cast<uintptr_t>(p + i) % 16 == 0) {
    *reinterpret_cast<longlong2*>(p + i) = {q[0], q[1]};
    *reinterpret_cast<longlong2*>(p + i + 2) = {q[2], q[3]};
    return;
  }
  for (int j = 0; j < 4 && i + j < n; j++) p[i + j] = q[j];
}

}  // namespace anvil::gpu
