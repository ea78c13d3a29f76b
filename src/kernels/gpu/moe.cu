// The mixture-of-experts ops on the GPU (kernels/moe.h; one source for CUDA and HIP): a thread per
// token for the router (E is small), a thread per output element for the rest, every sum over a
// token's choices in order and no atomics.
#include <algorithm>
#include <cstdint>

#include "device/arch.h"
#include "device/device.h"
#include "device/stream.h"
#include "kernels/moe.h"

namespace anvil::gpu {
namespace {

constexpr int kThreads = 256;
inline int blocks_for(long n) { return static_cast<int>((n + kThreads - 1) / kThreads); }
__device__ inline long thread_index() { return static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x; }

__device__ float choice_norm(const float* probs, const int32_t* experts, int k, float norm_p) {
  if (norm_p <= 0) return 1.0f;
  float sum = 0;
  for (int j = 0; j < k; j++) sum += powf(probs[experts[j]], norm_p);
  return powf(sum, 1.0f / norm_p);
}

__global__ void moe_route_kernel(float* probs, int32_t* experts, float* weights, const float* logits, int N, int E,
                                 int k, float norm_p) {
  const long t = thread_index();
  if (t >= N) return;
  const float* x = logits + t * E;
  float* p = probs + t * E;
  float max = x[0];
  for (int e = 1; e < E; e++) max = fmaxf(max, x[e]);
  float sum = 0;
  for (int e = 0; e < E; e++) sum += p[e] = expf(x[e] - max);
  for (int e = 0; e < E; e++) p[e] /= sum;
  int32_t* chosen = experts + t * k;
  moe_top_k(chosen, x, E, k);
  const float norm = choice_norm(p, chosen, k, norm_p);
  for (int j = 0; j < k; j++) weights[t * k + j] = p[chosen[j]] / norm;
}

__global__ void moe_route_backward_kernel(float* dlogits, const float* probs, const int32_t* experts,
                                          const float* weights, const float* dweights, const float* dprobs, int N,
                                          int E, int k, float norm_p) {
  const long t = thread_index();
  if (t >= N) return;
  const float* p = probs + t * E;
  float* d = dlogits + t * E;
  for (int e = 0; e < E; e++) d[e] = dprobs ? dprobs[t * E + e] : 0.0f;
  const int32_t* chosen = experts + t * k;
  const float *w = weights + t * k, *dw = dweights + t * k;
  float dot = 0;
  for (int j = 0; j < k; j++) dot += dw[j] * w[j];
  const float norm = choice_norm(p, chosen, k, norm_p);
  for (int j = 0; j < k; j++) d[chosen[j]] += (dw[j] - (norm_p > 0 ? dot * powf(w[j], norm_p - 1.0f) : 0.0f)) / norm;
  float s = 0;
  for (int e = 0; e < E; e++) s += p[e] * d[e];
  for (int e = 0; e < E; e++) d[e] = p[e] * (d[e] - s);
}

__global__ void gather_rows_kernel(float* out, const float* inp, const int32_t* rows, long n, int C) {
  const long i = thread_index();
  if (i < n) out[i] = inp[static_cast<long>(rows[i / C]) * C + i % C];
}

__global__ void moe_combine_kernel(float* out, const float* y, const int32_t* slots, const float* weights, long n,
                                   int k, int C, bool accumulate) {
  const long i = thread_index();
  if (i >= n) return;
  const long t = i / C, c = i % C;
  float sum = accumulate ? out[i] : 0.0f;
  for (int j = 0; j < k; j++) {
    const long s = slots[t * k + j];
    if (s >= 0) sum += (weights ? weights[t * k + j] : 1.0f) * y[s * C + c];
  }
  out[i] = sum;
}

__global__ void moe_dispatch_grad_kernel(float* dy, const float* dout, const int32_t* slot_tokens,
                                         const int32_t* slot_choices, const float* weights, long n, int k, int C) {
  const long i = thread_index();
  if (i >= n) return;
  const long s = i / C, t = slot_tokens[s];
  dy[i] = weights[t * k + slot_choices[s]] * dout[t * C + i % C];
}

__global__ void moe_weight_grad_kernel(float* dweights, const float* dout, const float* y, const int32_t* slots,
                                       long n, int k, int C) {
  const long i = thread_index();
  if (i >= n) return;
  const long t = i / k, s = slots[i];
  float dot = 0;
  if (s >= 0)
    for (int c = 0; c < C; c++) dot += dout[t * C + c] * y[s * C + c];
  dweights[i] = dot;
}

}  // namespace

void moe_route(float* probs, int32_t* experts, float* weights, const float* logits, int N, int E, int k,
               float norm_p) {
  GPU_LAUNCH(moe_route_kernel, blocks_for(N), kThreads)(probs, experts, weights, logits, N, E, k, norm_p);
  GPU_CHECK_LAUNCH();
}

void moe_route_backward(float* dlogits, const float* probs, const int32_t* experts, const float* weights,
                        const float* dweights, const float* dprobs, int N, int E, int k, float norm_p) {
  GPU_LAUNCH(moe_route_backward_kernel, blocks_for(N), kThreads)(dlogits, probs, experts, weights, dweights, dprobs, N,
                                                                 E, k, norm_p);
  GPU_CHECK_LAUNCH();
}

void gather_rows(float* out, const float* inp, const int32_t* rows, long n_rows, int C) {
  const long n = n_rows * C;
  if (n == 0) return;
  GPU_LAUNCH(gather_rows_kernel, blocks_for(n), kThreads)(out, inp, rows, n, C);
  GPU_CHECK_LAUNCH();
}

void moe_combine(float* out, const float* y, const int32_t* slots, const float* weights, int N, int k, int C,
                 bool accumulate) {
  const long n = static_cast<long>(N) * C;
  if (n == 0) return;
  GPU_LAUNCH(moe_combine_kernel, blocks_for(n), kThreads)(out, y, slots, weights, n, k, C, accumulate);
  GPU_CHECK_LAUNCH();
}

void moe_combine_backward(float* dy, float* dweights, const float* dout, const float* y, const int32_t* slots,
                          const int32_t* slot_tokens, const int32_t* slot_choices, const float* weights, int N, int k,
                          int C, long S) {
  if (S > 0) {
    GPU_LAUNCH(moe_dispatch_grad_kernel, blocks_for(S * C), kThreads)(dy, dout, slot_tokens, slot_choices, weights,
                                                                      S * C, k, C);
    GPU_CHECK_LAUNCH();
  }
  const long n = static_cast<long>(N) * k;
  if (n == 0) return;
  GPU_LAUNCH(moe_weight_grad_kernel, blocks_for(n), kThreads)(dweights, dout, y, slots, n, k, C);
  GPU_CHECK_LAUNCH();
}

}  // namespace anvil::gpu
