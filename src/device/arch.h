// Architecture facts the kernels depend on, in one place: the warp (wavefront) width and the
// warp-level reductions built on it. NVIDIA warps are 32 lanes; AMD CDNA wavefronts (gfx90a,
// gfx94x) are 64.
#pragma once
#include "device/runtime.h"

// Fully unrolls the loop that follows, so that the register arrays of tensor-core fragments it
// indexes stay in registers (a dynamically indexed array goes to local memory). The emulator runs
// loops as written.
// ANVIL_UNROLL_BY(n) unrolls n iterations at a time (a loop of a run-time count whose iterations'
// loads should be in flight together).
#if defined(ANVIL_GPU_EMULATION)
#define ANVIL_UNROLL
#define ANVIL_UNROLL_BY(n)
#else
#define ANVIL_UNROLL _Pragma("unroll")
#define ANVIL_PRAGMA(x) _Pragma(#x)
#define ANVIL_UNROLL_BY(n) ANVIL_PRAGMA(unroll n)
#endif

namespace anvil::gpu {

#if defined(ANVIL_HIP)
constexpr int kWarpSize = 64;
__device__ inline float shfl_xor(float v, int mask) { return __shfl_xor(v, mask, kWarpSize); }
__device__ inline float shfl(float v, int lane) { return __shfl(v, lane, kWarpSize); }
// A wavefront runs in lockstep; this orders its shared-memory writes before the reads after it.
__device__ inline void sync_warp() { __builtin_amdgcn_wave_barrier(); }
#else
constexpr int kWarpSize = 32;
__device__ inline float shfl_xor(float v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask, kWarpSize); }
__device__ inline float shfl(float v, int lane) { return __shfl_sync(0xffffffffu, v, lane, kWarpSize); }
__device__ inline void sync_warp() { __syncwarp(); }
#endif

// Butterfly reductions: every lane ends with the result, summed in the same order on every run.
__device__ inline float warp_sum(float v) {
  for (int m = kWarpSize / 2; m > 0; m >>= 1) v += shfl_xor(v, m);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int m = kWarpSize / 2; m > 0; m >>= 1) v = fmaxf(v, shfl_xor(v, m));
  return v;
}

}  // namespace anvil::gpu
