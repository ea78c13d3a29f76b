// Fixed-point accumulation on the GPU (one source for CUDA and HIP); see kernels/fixed_point.h.
// Each element is rounded on its own, so the integers are the CPU's bit for bit. The two
// reductions are order-free by nature: the maximum is exact, and the sum of squares adds
// integers, so neither depends on how the threads are scheduled.
#include <algorithm>

#include "device/arch.h"
#include "device/device.h"
#include "device/stream.h"
#include "kernels/fixed_point.h"
#include "kernels/gpu/quads.h"

namespace anvil::gpu {
namespace {

using u128 = unsigned __int128;
constexpr int kThreads = 256;

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

// Each thread takes kQuads quads (four consecutive values, 16-byte accesses: kernels/gpu/quads.h)
// kThreads quads apart, so that a warp's accesses stay contiguous and the block's maximum and its
// atomic are paid once per kQuads · 4 · kThreads values. A thread holds its accumulators while it
// adds every copy's values (each accumulator read and written once for all the copies), and reads
// every copy before it clears any (x and acc are distinct arrays: __restrict__; the copies' loads,
// unrolled, are in flight together, not each behind the last copy's stores). GPT-2 124M's passes
// of a step on an H200 (microbatch 8, a probe of this kernel's shapes): 7.0 ms with a value a
// thread (eight, 64 registers), 4.6 with four, 3.7 with two quads (42 registers).
constexpr int kQuads = 2;
constexpr size_t kBlockValues = static_cast<size_t>(kQuads) * 4 * kThreads;

__global__ void accumulate_kernel(int64_t* __restrict__ acc, float* __restrict__ x, size_t n, int copies,
                                  size_t stride, double scale, float* max_abs, bool clear) {
  const long first = 4 * (static_cast<long>(blockIdx.x) * blockDim.x * kQuads + threadIdx.x), len = n;
  auto at = [&](int q) { return first + 4L * q * blockDim.x; };
  int64_t a[kQuads][4];
  ANVIL_UNROLL
  for (int q = 0; q < kQuads; q++)
    if (at(q) < len) load_quad(acc, at(q), len, a[q]);
  float m = 0.0f;
  ANVIL_UNROLL_BY(2)
  for (int c = 0; c < copies; c++) {
    const float* xc = x + c * stride;
    ANVIL_UNROLL
    for (int q = 0; q < kQuads; q++) {
      if (at(q) >= len) continue;
      const float4 v = load_quad(xc, at(q), len);
      m = fmaxf(fmaxf(m, fmaxf(magnitude(v.x), magnitude(v.y))), fmaxf(magnitude(v.z), magnitude(v.w)));
      a[q][0] = wrapping_add(a[q][0], round_scaled(v.x, scale));
      a[q][1] = wrapping_add(a[q][1], round_scaled(v.y, scale));
      a[q][2] = wrapping_add(a[q][2], round_scaled(v.z, scale));
      a[q][3] = wrapping_add(a[q][3], round_scaled(v.w, scale));
    }
  }
  ANVIL_UNROLL
  for (int q = 0; q < kQuads; q++)
    if (at(q) < len) store_quad(acc, at(q), len, a[q]);
  for (int c = 0; c < copies && clear; c++)
    ANVIL_UNROLL
    for (int q = 0; q < kQuads; q++)
      if (at(q) < len) store_quad(x + c * stride, at(q), len, float4{0.0f, 0.0f, 0.0f, 0.0f});
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


// The block's total of v, returned to every thread, each of which may call it again at once.
__device__ u128 block_sum(u128 v) {
  __shared__ u128 shared[kThreads];
  __syncthreads();  // the last call's total read
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half >>= 1) {
    if (static_cast<int>(threadIdx.x) < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  return shared[0];
}

// The sums of squares, every tensor in one pass: block b takes the chunk of kSquaresChunk elements
// from b · kSquaresChunk. Its part of the tensor that holds the chunk's first element goes to
// lead[b], and its part of each tensor that starts inside the chunk to head[k]; a tensor's sum is
// then the leads of the chunks that start in it and its own head (squares_sums_kernel). All are
// integers, so the sums are the same however the blocks run.
constexpr size_t kSquaresChunk = kThreads * 16;

__device__ u128 range_squares(const int64_t* acc, size_t lo, size_t hi) {
  u128 s = 0;
  for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    const int64_t v = acc[i];
    const unsigned long long a = v < 0 ? 0ull - static_cast<unsigned long long>(v) : static_cast<unsigned long long>(v);
    s += (static_cast<u128>(a) * a) >> kSquareShift;
  }
  return s;
}

__global__ void squares_chunks_kernel(u128* lead, u128* head, const int64_t* acc, size_t n, const size_t* bounds,
                                      size_t tensors) {
  const size_t c0 = static_cast<size_t>(blockIdx.x) * kSquaresChunk, c1 = min(n, c0 + kSquaresChunk);
  size_t k = 0, end = tensors;  // the last range that starts at or before c0 (bounds[0] = 0 <= c0 < bounds[tensors])
  while (end - k > 1) {
    const size_t mid = (k + end) / 2;
    if (bounds[mid] <= c0) k = mid;
    else end = mid;
  }
  const u128 first = block_sum(range_squares(acc, c0, min(c1, bounds[k + 1])));
  if (threadIdx.x == 0) lead[blockIdx.x] = first;
  for (k++; k < tensors && bounds[k] < c1; k++) {
    const u128 part = block_sum(range_squares(acc, bounds[k], min(c1, bounds[k + 1])));
    if (threadIdx.x == 0) head[k] = part;
  }
}

// Block k: tensor k's leads (the chunks b with bounds[k] <= b · kSquaresChunk < bounds[k + 1]) and
// its head where the tensor starts inside a chunk (written by that chunk's block).
__global__ void squares_sums_kernel(u128* squares, const u128* lead, const u128* head, const size_t* bounds) {
  const size_t k = blockIdx.x, lo = bounds[k], hi = bounds[k + 1];
  u128 s = 0;
  for (size_t b = (lo + kSquaresChunk - 1) / kSquaresChunk + threadIdx.x; b < (hi + kSquaresChunk - 1) / kSquaresChunk;
       b += blockDim.x)
    s += lead[b];
  const u128 total = block_sum(s);
  if (threadIdx.x == 0) squares[k] = total + (lo < hi && lo % kSquaresChunk != 0 ? head[k] : 0);
}

__global__ void add_arrays_kernel(int64_t* acc, const int64_t* x, size_t n) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) acc[i] = wrapping_add(acc[i], x[i]);
}

unsigned blocks_for(size_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

GpuScratch square_partials;

}  // namespace

void fixed_point_accumulate(int64_t* acc, float* x, size_t n, int copies, size_t stride, int s, float* max_abs,
                            bool clear) {
  if (n == 0) return;
  const auto blocks = static_cast<unsigned>((n + kBlockValues - 1) / kBlockValues);
  GPU_LAUNCH(accumulate_kernel, blocks, kThreads)(acc, x, n, copies, stride, ldexp(1.0, s), max_abs, clear);
  GPU_CHECK_LAUNCH();
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

void fixed_point_squares(const int64_t* acc, size_t n, const size_t* bounds, size_t tensors,
                         unsigned __int128* squares) {
  if (tensors == 0) return;
  const size_t chunks = (n + kSquaresChunk - 1) / kSquaresChunk;
  u128* lead = static_cast<u128*>(square_partials.get((chunks + tensors) * sizeof(u128)));
  u128* head = lead + chunks;
  if (chunks > 0) {
    GPU_LAUNCH(squares_chunks_kernel, static_cast<unsigned>(chunks), kThreads)(lead, head, acc, n, bounds, tensors);
    GPU_CHECK_LAUNCH();
  }
  GPU_LAUNCH(squares_sums_kernel, static_cast<unsigned>(tensors), kThreads)(squares, lead, head, bounds);
  GPU_CHECK_LAUNCH();
}

void fixed_point_add_arrays(int64_t* acc, const int64_t* x, size_t n) {
  if (n == 0) return;
  GPU_LAUNCH(add_arrays_kernel, blocks_for(n), kThreads)(acc, x, n);
  GPU_CHECK_LAUNCH();
}

}  // namespace anvil::gpu
