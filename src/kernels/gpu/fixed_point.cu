// Fixed-point accumulation on the GPU (one source for CUDA and HIP); see kernels/fixed_point.h.
// Each element is rounded on its own, so the integers are the CPU's bit for bit. The two
// reductions are order-free by nature: the maximum is exact, and the sum of squares adds
// integers, so neither depends on how the threads are scheduled.
#include <algorithm>
#include <cstdint>

#include "device/arch.h"
#include "device/device.h"
#include "device/stream.h"
#include "kernels/fixed_point.h"

namespace anvil::gpu {
namespace {

using u128 = unsigned __int128;
constexpr int kThreads = 256;
constexpr int kMaxSquareBlocks = 1024;

// round(x · scale) to nearest even, as the CPU computes it: adding 1.5 · 2^52 leaves the integer
// part in the low mantissa bits (exact for |x · scale| < 2^51, wrapping beyond like the CPU's).
__device__ int64_t round_scaled(float x, double scale) {
  constexpr double kMagic = 6755399441055744.0;  // 1.5 · 2^52
  const double d = static_cast<double>(x) * scale + kMagic;  // the product is exact: a fused add rounds the same
  return static_cast<int64_t>(static_cast<unsigned long long>(__double_as_longlong(d)) -
                              static_cast<unsigned long long>(__double_as_longlong(kMagic)));
}

__device__ int64_t wrapping_add(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<unsigned long long>(a) + static_cast<unsigned long long>(b));
}

// |x|, with NaN as infinity so that a non-finite gradient is never lost in a maximum.
__device__ float magnitude(float x) { return isnan(x) ? INFINITY : fabsf(x); }

// *max_abs = max(*max_abs, the block's largest m). Non-negative floats order as their bit
// patterns do, so an integer atomic maximum is exact and the same whatever the block order.
__device__ void block_max_into(float m, float* max_abs) {
  __shared__ float shared[kThreads];
  shared[threadIdx.x] = m;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half >>= 1) {
    if (static_cast<int>(threadIdx.x) < half) shared[threadIdx.x] = fmaxf(shared[threadIdx.x], shared[threadIdx.x + half]);
    __syncthreads();
  }
  if (threadIdx.x == 0 && shared[0] > 0.0f)
    atomicMax(reinterpret_cast<unsigned int*>(max_abs), __float_as_uint(shared[0]));
}

// Each block takes kPerThread · kThreads consecutive elements (a thread every kThreads of them,
// so that a warp's reads stay contiguous): the block's maximum and its atomic are paid once per
// kPerThread elements. A thread issues all its loads before its first store: x and acc are
// distinct arrays (__restrict__), and loads in flight, not arithmetic, bound this pass.
constexpr int kPerThread = 8;

__global__ void accumulate_kernel(int64_t* __restrict__ acc, float* __restrict__ x, size_t n, double scale,
                                  float* max_abs) {
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x * kPerThread + threadIdx.x;
  float v[kPerThread];
  int64_t a[kPerThread];
  ANVIL_UNROLL
  for (int k = 0; k < kPerThread; k++) {
    const size_t i = first + static_cast<size_t>(k) * blockDim.x;
    v[k] = i < n ? x[i] : 0.0f;
    a[k] = i < n ? acc[i] : 0;
  }
  float m = 0.0f;
  ANVIL_UNROLL
  for (int k = 0; k < kPerThread; k++) {
    const size_t i = first + static_cast<size_t>(k) * blockDim.x;
    if (i >= n) break;
    m = fmaxf(m, magnitude(v[k]));
    acc[i] = wrapping_add(a[k], round_scaled(v[k], scale));
    x[i] = 0.0f;
  }
  block_max_into(m, max_abs);
}

// Two int64 accumulators, moved as one 16-byte access.
struct alignas(16) AccPair {
  int64_t first, second;
};

// The pass above over an x and acc that both start on 16 bytes, four elements a thread per round
// in 16-byte accesses (one of x, two of acc): 4-byte accesses drew about half the copy rate.
constexpr int kQuadRounds = 2;

__device__ AccPair accumulated(AccPair a, float v0, float v1, double scale) {
  return {wrapping_add(a.first, round_scaled(v0, scale)), wrapping_add(a.second, round_scaled(v1, scale))};
}

__global__ void accumulate_quads_kernel(int64_t* __restrict__ acc, float* __restrict__ x, size_t quads, double scale,
                                        float* max_abs) {
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x * kQuadRounds + threadIdx.x;
  auto* xq = reinterpret_cast<float4*>(x);
  auto* pairs = reinterpret_cast<AccPair*>(acc);
  float4 v[kQuadRounds];
  AccPair lo[kQuadRounds], hi[kQuadRounds];
  ANVIL_UNROLL
  for (int k = 0; k < kQuadRounds; k++) {
    const size_t q = first + static_cast<size_t>(k) * blockDim.x;
    v[k] = q < quads ? xq[q] : float4{0.0f, 0.0f, 0.0f, 0.0f};
    lo[k] = q < quads ? pairs[2 * q] : AccPair{0, 0};
    hi[k] = q < quads ? pairs[2 * q + 1] : AccPair{0, 0};
  }
  float m = 0.0f;
  ANVIL_UNROLL
  for (int k = 0; k < kQuadRounds; k++) {
    const size_t q = first + static_cast<size_t>(k) * blockDim.x;
    if (q >= quads) break;
    m = fmaxf(fmaxf(m, fmaxf(magnitude(v[k].x), magnitude(v[k].y))), fmaxf(magnitude(v[k].z), magnitude(v[k].w)));
    pairs[2 * q] = accumulated(lo[k], v[k].x, v[k].y, scale);
    pairs[2 * q + 1] = accumulated(hi[k], v[k].z, v[k].w, scale);
    xq[q] = float4{0.0f, 0.0f, 0.0f, 0.0f};
  }
  block_max_into(m, max_abs);
}

// blockIdx.y: the row; the rows are distinct, so no two threads touch the same element.
__global__ void accumulate_rows_kernel(int64_t* acc, float* x, const int32_t* rows, size_t row_len, double scale,
                                       float* max_abs) {
  const size_t c = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  float m = 0.0f;
  if (c < row_len) {
    const size_t i = static_cast<size_t>(rows[blockIdx.y]) * row_len + c, xi = blockIdx.y * row_len + c;
    const float v = x[xi];
    m = magnitude(v);
    acc[i] = wrapping_add(acc[i], round_scaled(v, scale));
    x[xi] = 0.0f;
  }
  block_max_into(m, max_abs);
}


__device__ u128 block_sum(u128 v) {
  __shared__ u128 shared[kThreads];
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half >>= 1) {
    if (static_cast<int>(threadIdx.x) < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  return shared[0];
}

// Each block's part of the sum of squares (grid-stride over a fixed grid).
__global__ void squares_kernel(u128* partial, const int64_t* acc, size_t n) {
  u128 s = 0;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int64_t v = acc[i];
    const unsigned long long a = v < 0 ? 0ull - static_cast<unsigned long long>(v) : static_cast<unsigned long long>(v);
    s += (static_cast<u128>(a) * a) >> kSquareShift;
  }
  const u128 total = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

__global__ void sum_partials_kernel(u128* sum, const u128* partial, int count) {
  u128 s = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  const u128 total = block_sum(s);
  if (threadIdx.x == 0) *sum = total;
}

__global__ void add_arrays_kernel(int64_t* acc, const int64_t* x, size_t n) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) acc[i] = wrapping_add(acc[i], x[i]);
}

unsigned blocks_for(size_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

GpuScratch square_partials;

}  // namespace

void fixed_point_accumulate(int64_t* acc, float* x, size_t n, int s, float* max_abs) {
  // The quads where both arrays start on 16 bytes, then the elements after them (or all of them)
  // one at a time: the same integers either way, and the maximum is order-free.
  const bool aligned = reinterpret_cast<uintptr_t>(acc) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const size_t quads = aligned ? n / 4 : 0, rest = n - 4 * quads;
  if (quads > 0) {
    const auto blocks = static_cast<unsigned>((quads + kThreads * kQuadRounds - 1) / (kThreads * kQuadRounds));
    GPU_LAUNCH(accumulate_quads_kernel, blocks, kThreads)(acc, x, quads, ldexp(1.0, s), max_abs);
    GPU_CHECK_LAUNCH();
  }
  if (rest > 0) {
    const auto blocks = static_cast<unsigned>((rest + kThreads * kPerThread - 1) / (kThreads * kPerThread));
    GPU_LAUNCH(accumulate_kernel, blocks, kThreads)(acc + 4 * quads, x + 4 * quads, rest, ldexp(1.0, s), max_abs);
    GPU_CHECK_LAUNCH();
  }
}

void fixed_point_accumulate_rows(int64_t* acc, float* x, const int32_t* rows, size_t n_rows, size_t row_len, int s,
                                 float* max_abs) {
  constexpr size_t kMaxGridRows = 65535;  // the grid's y extent
  for (size_t r = 0; r < n_rows && row_len > 0; r += kMaxGridRows) {
    const dim3 grid(blocks_for(row_len), static_cast<unsigned>(std::min(kMaxGridRows, n_rows - r)));
    GPU_LAUNCH(accumulate_rows_kernel, grid, kThreads)(acc, x + r * row_len, rows + r, row_len,
                                                       ldexp(1.0, s), max_abs);
    GPU_CHECK_LAUNCH();
  }
}

void fixed_point_squares(const int64_t* acc, size_t n, unsigned __int128* squares) {
  const int blocks = static_cast<int>(std::min<size_t>(std::max<size_t>(blocks_for(n), 1), kMaxSquareBlocks));
  u128* partial = static_cast<u128*>(square_partials.get(blocks * sizeof(u128)));
  GPU_LAUNCH(squares_kernel, blocks, kThreads)(partial, acc, n);
  GPU_CHECK_LAUNCH();
  GPU_LAUNCH(sum_partials_kernel, 1, kThreads)(squares, partial, blocks);
  GPU_CHECK_LAUNCH();
}

void fixed_point_add_arrays(int64_t* acc, const int64_t* x, size_t n) {
  if (n == 0) return;
  GPU_LAUNCH(add_arrays_kernel, blocks_for(n), kThreads)(acc, x, n);
  GPU_CHECK_LAUNCH();
}

}  // namespace anvil::gpu
