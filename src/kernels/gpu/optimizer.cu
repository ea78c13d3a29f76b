// The optimizer's element-wise work on the GPU (one source for CUDA and HIP). The sum of squares
// reduces fixed 64K-element chunks in double, in a fixed tree, and the host adds the chunks in
// order: the same value on every run.
#include <cmath>
#include <vector>

#include "device/arch.h"
#include "device/device.h"
#include "device/stream.h"
#include "kernels/optimizer.h"

namespace anvil::gpu {
namespace {

constexpr int kThreads = 256;
constexpr size_t kChunk = size_t{1} << 16;

// The gradient as floats, or read from fixed point at its tensor's exponent (kernels/optimizer.h).
struct FloatGradient {
  const float* g;
  __device__ float operator()(size_t i, const AdamWTensor&) const { return g[i]; }
};
struct FixedGradient {
  const int64_t* acc;
  __device__ float operator()(size_t i, const AdamWTensor& t) const {
    return static_cast<float>(static_cast<double>(acc[i]) * ldexp(1.0, -t.exponent));  // exact: a power of two
  }
};

// Every tensor of the step in one launch, a thread per element of [0, n): the block finds the
// tensor holding its first element by bisection, each thread steps on from there to its own.
template <class Gradient>
__global__ void adamw_kernel(float* p, Gradient g, float* m, float* v, size_t n, const AdamWTensor* tensors, int K,
                             AdamWStep s) {
  __shared__ int first;
  const size_t block0 = static_cast<size_t>(blockIdx.x) * blockDim.x;
  if (threadIdx.x == 0) {
    int lo = 0, hi = K - 1;  // the last tensor starting at or before block0 (or tensor 0)
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (tensors[mid].offset <= block0)
        lo = mid;
      else
        hi = mid - 1;
    }
    first = lo;
  }
  __syncthreads();
  const size_t i = block0 + threadIdx.x;
  if (i >= n) return;
  int k = first;
  while (k + 1 < K && tensors[k + 1].offset <= i) k++;
  const AdamWTensor t = tensors[k];
  if (i < t.offset || i >= t.offset + t.count) return;  // between tensors
  const float gi = g(i, t) * s.grad_scale;
  const float mi = s.beta1 * m[i] + (1.0f - s.beta1) * gi;
  const float vi = s.beta2 * v[i] + (1.0f - s.beta2) * gi * gi;
  m[i] = mi;
  v[i] = vi;
  p[i] = p[i] * t.keep - s.step_size * mi / (sqrtf(vi) / s.bc2_sqrt + s.eps);
}

__global__ void chunk_squares_kernel(double* partial, const float* x, size_t n) {
  __shared__ double shared[kThreads];
  const size_t lo = static_cast<size_t>(blockIdx.x) * kChunk, hi = min(n, lo + kChunk);
  double s = 0;
  for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) s += static_cast<double>(x[i]) * x[i];
  shared[threadIdx.x] = s;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half >>= 1) {
    if (static_cast<int>(threadIdx.x) < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = shared[0];
}

__global__ void scale_kernel(float* x, size_t n, float coef, int* bad) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float y = x[i] * coef;
  x[i] = y;
  if (!isfinite(y)) *bad = 1;  // every writer writes the same value: no race on the result
}

int blocks_for(size_t n) { return static_cast<int>((n + kThreads - 1) / kThreads); }

GpuScratch chunk_sums, nonfinite_flag;

}  // namespace

void adamw_update(float* p, const float* g, float* m, float* v, size_t n, const AdamWTensor* tensors, int n_tensors,
                  const AdamWStep& s) {
  if (n == 0 || n_tensors == 0) return;
  GPU_LAUNCH(adamw_kernel<FloatGradient>, blocks_for(n), kThreads)(p, FloatGradient{g}, m, v, n, tensors, n_tensors,
                                                                   s);
  GPU_CHECK_LAUNCH();
}

void adamw_update_fixed(float* p, const int64_t* acc, float* m, float* v, size_t n, const AdamWTensor* tensors,
                        int n_tensors, const AdamWStep& s) {
  if (n == 0 || n_tensors == 0) return;
  GPU_LAUNCH(adamw_kernel<FixedGradient>, blocks_for(n), kThreads)(p, FixedGradient{acc}, m, v, n, tensors, n_tensors,
                                                                   s);
  GPU_CHECK_LAUNCH();
}

double sum_of_squares(const float* x, size_t n) {
  if (n == 0) return 0.0;
  const size_t chunks = (n + kChunk - 1) / kChunk;
  double* partial = static_cast<double*>(chunk_sums.get(chunks * sizeof(double)));
  GPU_LAUNCH(chunk_squares_kernel, static_cast<unsigned>(chunks), kThreads)(partial, x, n);
  GPU_CHECK_LAUNCH();
  thread_local std::vector<double> host;
  host.resize(chunks);
  gpu_copy_to_host(host.data(), partial, chunks * sizeof(double));
  double sum = 0;
  for (double c : host) sum += c;
  return sum;
}

bool scale_values_check_finite(float* x, size_t n, float coef) {
  if (n == 0) return true;
  int* bad = static_cast<int*>(nonfinite_flag.get(sizeof(int)));
  gpu_zero(bad, sizeof(int));
  GPU_LAUNCH(scale_kernel, blocks_for(n), kThreads)(x, n, coef, bad);
  GPU_CHECK_LAUNCH();
  int host = 0;
  gpu_copy_to_host(&host, bad, sizeof(int));
  return host == 0;
}

}  // namespace anvil::gpu
