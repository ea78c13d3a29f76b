// GPU kernels for every op but the GEMMs (matmul.cpp, attention.cpp): one source, compiled as CUDA
// or as HIP. Every reduction runs in a fixed order (warp butterflies, per-chunk partial sums
// added in chunk order), with no atomics, so a run repeats bit for bit.
#include <algorithm>
#include <cstdint>

#include "core/error.h"
#include "core/targets.h"
#include "device/arch.h"
#include "device/device.h"
#include "device/half.h"
#include "device/stream.h"
#include "kernels/attention.h"
#include "kernels/columns.h"
#include "kernels/crossentropy.h"
#include "kernels/encoder.h"
#include "kernels/gelu.h"
#include "kernels/gpu/internal.h"
#include "kernels/gpu/quads.h"
#include "kernels/layernorm.h"
#include "kernels/dropout.h"
#include "kernels/lora.h"
#include "kernels/residual.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/round.h"
#include "kernels/swiglu.h"

namespace anvil::gpu {
namespace {

constexpr int kThreads = 256;
constexpr long kMaxGridY = 65535;  // a grid's y extent
inline int blocks_for(long n, int threads = kThreads) { return static_cast<int>((n + threads - 1) / threads); }

template <class F>
__device__ inline float4 map_quad(float4 a, F f) {
  return {f(a.x), f(a.y), f(a.z), f(a.w)};
}
template <class F>
__device__ inline float4 map_quads(float4 a, float4 b, F f) {
  return {f(a.x, b.x), f(a.y, b.y), f(a.z, b.z), f(a.w, b.w)};
}

// The partial sums of the column reductions.
GpuScratch partials;
double* scratch(size_t doubles) { return static_cast<double*>(partials.get(doubles * sizeof(double))); }
// The token embedding gradient's chains (encoder_backward).
GpuScratch token_chains;

// A running (max, sum of exp(x - max)) over values seen one at a time, merged in a fixed order:
// the log-sum-exp of a row without a second pass. An empty one is (-inf, 0) and merges as nothing.
struct MaxSum {
  float m = -INFINITY, s = 0.0f;
  __device__ void add(float x) {
    const float m_new = fmaxf(m, x);
    s = s * expf(m - m_new) + expf(x - m_new);
    m = m_new;
  }
  __device__ void merge(float m2, float s2) {
    const float m_new = fmaxf(m, m2);
    s = (m == -INFINITY ? 0.0f : s * expf(m - m_new)) + (m2 == -INFINITY ? 0.0f : s2 * expf(m2 - m_new));
    m = m_new;
  }
  __device__ void merge_warp() {
    for (int off = kWarpSize / 2; off > 0; off >>= 1) merge(shfl_xor(m, off), shfl_xor(s, off));
  }
  __device__ float logsumexp() const { return m + logf(s); }
};

// ---- embeddings

__global__ void encoder_forward_kernel(float* out, const int32_t* tokens, const int32_t* positions, const float* wte,
                                       const float* wpe, int T, int C, long N) {
  const long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * C) return;
  const long n = i / C;
  const int c = static_cast<int>(i % C), t = positions ? positions[n] : static_cast<int>(n % T);
  const float e = wte[static_cast<long>(tokens[n]) * C + c];
  out[i] = wpe ? e + wpe[static_cast<long>(t) * C + c] : e;
}

// The token embedding's gradient: each token's row gathers the gradients of the positions that
// hold it, in position order, as the reference does, with no atomics. First each position's next
// position of the same token (N for none) and whether it is a later one (some position's next):
// a thread per position, scanning forward. The next positions are distinct, so no two threads
// mark one position.
__global__ void token_chains_kernel(int32_t* next, int32_t* later, const int32_t* tokens, long N) {
  const long n = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const int32_t token = tokens[n];
  long m = n + 1;
  while (m < N && tokens[m] != token) m++;
  next[n] = static_cast<int32_t>(m);
  if (m < N) later[m] = 1;
}

// Then a block per position (blockIdx.y) and block of channels: the block of a token's first
// position owns its row and follows the chain; the blocks of later positions have nothing to do.
__global__ void encoder_backward_wte_kernel(float* dwte, const float* dout, const int32_t* tokens,
                                            const int32_t* next, const int32_t* later, int C, long N, long n0) {
  const long n = n0 + blockIdx.y;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (later[n] || c >= C) return;
  float* row = dwte + static_cast<long>(tokens[n]) * C + c;
  float s = *row;
  for (long m = n; m < N; m = next[m]) s += dout[m * C + c];
  *row = s;
}

// blockIdx.y: the row; the rows are distinct, so no two threads touch the same element.
__global__ void add_rows_kernel(float* dst, const float* x, const int32_t* rows, size_t row_len) {
  const size_t c = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c < row_len) dst[static_cast<size_t>(rows[blockIdx.y]) * row_len + c] += x[blockIdx.y * row_len + c];
}

__global__ void encoder_backward_wpe_kernel(float* dwpe, const float* dout, int B, int T, int C) {
  const long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<long>(T) * C) return;
  float s = dwpe[i];
  for (int b = 0; b < B; b++) s += dout[static_cast<long>(b) * T * C + i];
  dwpe[i] = s;
}

// Packed examples: position p's row gathers every token at p, in (b, t) order (a token at
// position p sits at t >= p), with no atomics.
__global__ void encoder_backward_wpe_positions_kernel(float* dwpe, const float* dout, const int32_t* positions, int B,
                                                      int T, int C) {
  const long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<long>(T) * C) return;
  const int p = static_cast<int>(i / C), c = static_cast<int>(i % C);
  float s = dwpe[i];
  for (int b = 0; b < B; b++)
    for (int t = p; t < T; t++)
      if (positions[static_cast<long>(b) * T + t] == p) s += dout[(static_cast<long>(b) * T + t) * C + c];
  dwpe[i] = s;
}

// ---- layer norm: a warp per row

__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                         const float* bias, int N, int C) {
  const int lane = threadIdx.x % kWarpSize;
  const int row = (blockIdx.x * blockDim.x + threadIdx.x) / kWarpSize;
  if (row >= N) return;
  const float* x = inp + static_cast<long>(row) * C;
  float s = 0;
  for (int c = lane; c < C; c += kWarpSize) s += x[c];
  const float m = warp_sum(s) / C;
  float v = 0;
  for (int c = lane; c < C; c += kWarpSize) v += (x[c] - m) * (x[c] - m);
  const float r = rsqrtf(warp_sum(v) / C + kLayerNormEps);
  float* o = out + static_cast<long>(row) * C;
  for (int c = lane; c < C; c += kWarpSize) o[c] = (x[c] - m) * r * weight[c] + (bias ? bias[c] : 0.0f);
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// ---- RMSNorm: a warp per row

__global__ void rmsnorm_forward_kernel(float* out, float* rstd, const float* inp, const float* weight, float eps, int N,
                                       int C) {
  const int lane = threadIdx.x % kWarpSize;
  const int row = (blockIdx.x * blockDim.x + threadIdx.x) / kWarpSize;
  if (row >= N) return;
  const float* x = inp + static_cast<long>(row) * C;
  float ss = 0;
  for (int c = lane; c < C; c += kWarpSize) ss += x[c] * x[c];
  const float r = rsqrtf(warp_sum(ss) / C + eps);
  float* o = out + static_cast<long>(row) * C;
  for (int c = lane; c < C; c += kWarpSize) o[c] = x[c] * r * weight[c];
  if (lane == 0) rstd[row] = r;
}

__global__ void rmsnorm_backward_dinp_kernel(float* dinp, const float* dout, const float* inp, const float* weight,
                                             const float* rstd, int N, int C) {
  const int lane = threadIdx.x % kWarpSize;
  const int row = (blockIdx.x * blockDim.x + threadIdx.x) / kWarpSize;
  if (row >= N) return;
  const long base = static_cast<long>(row) * C;
  const float r = rstd[row];
  float gx_sum = 0;
  for (int c = lane; c < C; c += kWarpSize) gx_sum += weight[c] * dout[base + c] * inp[base + c] * r;
  const float gx_mean = warp_sum(gx_sum) / C;
  for (int c = lane; c < C; c += kWarpSize)
    dinp[base + c] += (weight[c] * dout[base + c] - inp[base + c] * r * gx_mean) * r;
}

// A thread per column, its rows in order (rmsnorm_weight_sums: a chain of ranks continues the sums).
__global__ void rmsnorm_weight_sums_kernel(double* sums, const float* dout, const float* inp, const float* rstd,
                                           int N, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  double s = sums[c];
  for (int n = 0; n < N; n++) {
    const long i = static_cast<long>(n) * C + c;
    s += static_cast<double>(dout[i] * inp[i] * rstd[n]);
  }
  sums[c] = s;
}

__global__ void layernorm_backward_dinp_kernel(float* dinp, const float* dout, const float* inp, const float* weight,
                                               const float* mean, const float* rstd, int N, int C) {
  const int lane = threadIdx.x % kWarpSize;
  const int row = (blockIdx.x * blockDim.x + threadIdx.x) / kWarpSize;
  if (row >= N) return;
  const long base = static_cast<long>(row) * C;
  const float m = mean[row], r = rstd[row];
  float dnorm_sum = 0, dnorm_norm_sum = 0;
  for (int c = lane; c < C; c += kWarpSize) {
    const float norm = (inp[base + c] - m) * r, dnorm = weight[c] * dout[base + c];
    dnorm_sum += dnorm;
    dnorm_norm_sum += dnorm * norm;
  }
  const float dnorm_mean = warp_sum(dnorm_sum) / C, dnorm_norm_mean = warp_sum(dnorm_norm_sum) / C;
  for (int c = lane; c < C; c += kWarpSize) {
    const float norm = (inp[base + c] - m) * r, dnorm = weight[c] * dout[base + c];
    dinp[base + c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * r;
  }
}

// Column sums in two fixed-order stages (mean null: RMSNorm's, no mean subtracted): each block sums kRowsPerChunk rows of its columns into
// partial[chunk], then sum_partials_kernel adds the chunks in a fixed order. The sums are in double: the
// terms of a long column cancel, and fp32 sums missed the reference by 2e-5 on 1000 rows. The rows
// may be groups of group_rows (sequences with gradients of their own): a group's chunks start at
// its first row, so each group's sums are those of a call on its rows alone.
constexpr int kRowsPerChunk = 32;

// The rows [r0, r1) of chunk `chunk` (blockIdx.y) when groups of group_rows rows are chunked apart.
struct ChunkRows {
  int r0, r1;
};
__device__ inline ChunkRows chunk_rows(int chunk, int group_rows) {
  const int per_group = (group_rows + kRowsPerChunk - 1) / kRowsPerChunk;
  const int g = chunk / per_group, j = chunk % per_group, first = g * group_rows;
  return {first + j * kRowsPerChunk, first + min(group_rows, (j + 1) * kRowsPerChunk)};
}

__global__ void layernorm_param_partials_kernel(double* partial, const float* dout, const float* inp,
                                                const float* mean, const float* rstd, int group_rows, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
  if (c >= C) return;
  double dw = 0, db = 0;
  const ChunkRows rows = chunk_rows(chunk, group_rows);
  for (int r = rows.r0; r < rows.r1; r++) {
    const long i = static_cast<long>(r) * C + c;
    dw += (mean ? inp[i] - mean[r] : inp[i]) * rstd[r] * dout[i];
    db += dout[i];
  }
  const long chunks = gridDim.y;
  partial[chunk * static_cast<long>(C) + c] = dw;
  partial[(chunks + chunk) * static_cast<long>(C) + c] = db;
}

__global__ void column_partials_kernel(double* partial, const float* x, long ld, int group_rows, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
  if (c >= C) return;
  double s = 0;
  const ChunkRows rows = chunk_rows(chunk, group_rows);
  for (int r = rows.r0; r < rows.r1; r++) s += x[r * ld + c];
  partial[chunk * static_cast<long>(C) + c] = s;
}

// out[k] (C) += the sum over chunks of partial[k][chunk] for k < outputs: a block per 16 columns
// (threadIdx.x) and output (blockIdx.y), whose 16 groups (threadIdx.y) sum every 16th chunk, the
// groups then added in order; a fixed order, the same on every run. (A thread per column summing
// every chunk ran 3 to 6 blocks: 22 us a call on an H200.) Rows in groups (blockIdx.z): group g's
// chunks, the g-th `chunks` of them, into out + g·stride.
constexpr int kPartialColumns = 16, kPartialGroups = 16;
__global__ void sum_partials_kernel(float* out0, float* out1, const double* partial, int chunks, int C,
                                    size_t stride, bool accumulate) {
  __shared__ double group_sums[kPartialGroups][kPartialColumns];
  const int c = blockIdx.x * kPartialColumns + threadIdx.x, k = blockIdx.y, g = blockIdx.z;
  const long first = (static_cast<long>(k) * gridDim.z + g) * chunks;  // the group's first chunk of output k
  double s = 0;
  if (c < C)
    for (int j = threadIdx.y; j < chunks; j += kPartialGroups) s += partial[(first + j) * C + c];
  group_sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
  double all = 0;
  for (int g = 0; g < kPartialGroups; g++) all += group_sums[g][threadIdx.x];
  float* out = (k == 0 ? out0 : out1) + g * stride;
  out[c] = static_cast<float>(accumulate ? out[c] + all : all);
}

// The same bit operations as the CPU's rounding (kernels/cpu/round_value.h).
__device__ inline float round_bf16_value(float x) {
  const uint32_t u = __float_as_uint(x);
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  return __uint_as_float(nan ? ((u | 0x00400000u) & 0xffff0000u) : rounded);
}

__device__ inline float round_fp16_value(float x) {
  const uint32_t u = __float_as_uint(x);
  const uint32_t sign = u & 0x80000000u, a = u & 0x7fffffffu;
  const uint32_t normal = (a + 0xfffu + ((a >> 13) & 1u)) & ~0x1fffu;
  const float small = (__uint_as_float(a) + 0.5f) - 0.5f;  // exact: see cpu/round_value.h
  uint32_t out = a < 0x38800000u ? __float_as_uint(small) : normal;
  out = a >= 0x477ff000u ? 0x7f800000u : out;
  out = a > 0x7f800000u ? (a | 0x00400000u) : out;
  return __uint_as_float(out | sign);
}

__device__ inline float round_value(float x, ComputeDtype d) {
  return d == ComputeDtype::kBf16 ? round_bf16_value(x) : d == ComputeDtype::kFp16 ? round_fp16_value(x) : x;
}

// ---- element-wise

constexpr float kGeluScale = 0.7978845608028654f;  // √(2/π)

// tanh-GELU as x·sigmoid(2u) (0.5·(1 + tanh u) = sigmoid(2u)): no cancellation in 1 + tanh u for
// negative x, the form the CPU kernels use.
struct Sigmoid2 {
  float s, one_minus_s;
};
__device__ inline Sigmoid2 sigmoid2(float u) {
  const float e = expf(-2.0f * fabsf(u));  // in (0, 1]: never overflows
  const float small = e / (1.0f + e), large = 1.0f / (1.0f + e);
  return u >= 0 ? Sigmoid2{large, small} : Sigmoid2{small, large};
}

constexpr float kSqrtHalf = 0.7071067811865476f, kInvSqrt2Pi = 0.3989422804014327f;

__global__ void gelu_erf_forward_kernel(float* out, const float* inp, long N, ComputeDtype d) {
  const long i = quad_start();
  if (i >= N) return;
  store_quad(out, i, N, map_quad(load_quad(inp, i, N), [d](float x) {
    return round_value(0.5f * x * (1.0f + erff(x * kSqrtHalf)), d);
  }));
}

__global__ void gelu_erf_backward_kernel(float* dinp, const float* inp, const float* dout, long N, ComputeDtype d) {
  const long i = quad_start();
  if (i >= N) return;
  store_quad(dinp, i, N, map_quads(load_quad(inp, i, N), load_quad(dout, i, N), [d](float x, float g) {
    return round_value((0.5f * (1.0f + erff(x * kSqrtHalf)) + x * expf(-0.5f * x * x) * kInvSqrt2Pi) * g, d);
  }));
}

__global__ void gelu_forward_kernel(float* out, const float* inp, long N, ComputeDtype d) {
  const long i = quad_start();
  if (i >= N) return;
  store_quad(out, i, N, map_quad(load_quad(inp, i, N), [d](float x) {
    return round_value(x * sigmoid2(kGeluScale * (x + 0.044715f * x * x * x)).s, d);
  }));
}

// ---- RoPE: one thread per (row, head, pair); inv_freq from rope_inv_freq, the host's definition.
__global__ void rope_kernel(float* x, const int32_t* positions, int T, int row_stride, int n_heads, int HS,
                            RopeFrequencies freqs, float sign, long pairs) {
  const long k = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= pairs) return;
  const int half = HS / 2;
  const int i = static_cast<int>(k % half);
  const long head = k / half, row = head / n_heads;
  const float inv_freq = rope_inv_freq(freqs, i, HS);
  const float angle = static_cast<float>(positions ? positions[row] : static_cast<int>(row % T)) * inv_freq;
  const float c = cosf(angle), s = sign * sinf(angle);
  float* v = x + row * row_stride + (head % n_heads) * HS;
  const float a = v[i], b = v[i + half];
  v[i] = a * c - b * s;
  v[i + half] = b * c + a * s;
}

// One thread per (row, f); sigmoid(x) = sigmoid2(x/2), as in GELU.
__global__ void swiglu_forward_kernel(float* out, const float* inp, int F, long NF, ComputeDtype d) {
  const long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= NF) return;
  const long n = i / F, f = i % F;
  const float g = inp[n * 2 * F + f], u = inp[n * 2 * F + F + f];
  out[i] = round_value(g * sigmoid2(0.5f * g).s * u, d);
}

__global__ void swiglu_backward_kernel(float* dinp, const float* inp, const float* dout, int F, long NF,
                                       ComputeDtype d) {
  const long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= NF) return;
  const long n = i / F, f = i % F;
  const float g = inp[n * 2 * F + f], u = inp[n * 2 * F + F + f], dy = dout[i];
  const Sigmoid2 sig = sigmoid2(0.5f * g);
  dinp[n * 2 * F + f] = round_value(dy * u * sig.s * (1.0f + g * sig.one_minus_s), d);
  dinp[n * 2 * F + F + f] = round_value(dy * g * sig.s, d);
}

__global__ void gelu_backward_kernel(float* dinp, const float* inp, const float* dout, long N, ComputeDtype d) {
  const long i = quad_start();
  if (i >= N) return;
  store_quad(dinp, i, N, map_quads(load_quad(inp, i, N), load_quad(dout, i, N), [d](float x, float dy) {
    const Sigmoid2 g = sigmoid2(kGeluScale * (x + 0.044715f * x * x * x));
    const float du = kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    return round_value((g.s + 2.0f * x * g.s * g.one_minus_s * du) * dy, d);
  }));
}

__global__ void dropout_apply_kernel(float* out, const float* x, long n, long total, DropoutSite site, float scale,
                                     uint32_t threshold) {
  const long k = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= total) return;
  const uint64_t stream = dropout_stream(site.key, site.first_sample + k / n);
  out[k] = dropout_keep(stream, static_cast<uint64_t>(k % n), threshold) ? x[k] * scale : 0.0f;
}

__global__ void residual_forward_kernel(float* out, const float* a, const float* b, long N) {
  const long i = quad_start();
  if (i >= N) return;
  store_quad(out, i, N, map_quads(load_quad(a, i, N), load_quad(b, i, N), [](float x, float y) { return x + y; }));
}

__global__ void residual_backward_kernel(float* da, float* db, const float* dout, long N) {
  const long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N) return;
  da[i] += dout[i];
  db[i] += dout[i];
}

// Element k of the (N, cols) block: row k / cols, column k % cols.
__global__ void lora_delta_forward_kernel(float* out, long ld, const float* delta, long total, int cols, float scale) {
  const long k = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k < total) out[(k / cols) * ld + k % cols] += scale * delta[k];
}

__global__ void lora_delta_backward_kernel(float* ddelta, const float* dout, long ld, long total, int cols,
                                           float scale) {
  const long k = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k < total) ddelta[k] = scale * dout[(k / cols) * ld + k % cols];
}

// Thread k copies the k-th quad of the parts' rows' cols values (quads_per_row a row, N rows a
// part).
__global__ void copy_columns_kernel(float* dst, long ld_dst, long dst_part, const float* src, long ld_src,
                                    long src_part, long total, int N, int quads_per_row, int cols) {
  const long k = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= total) return;
  const long row = k / quads_per_row, p = row / N, n = row % N;
  const int at = 4 * static_cast<int>(k % quads_per_row);
  store_quad(dst + p * dst_part + n * ld_dst, at, cols, load_quad(src + p * src_part + n * ld_src, at, cols));
}

__global__ void widen_bf16_kernel(float* out, const uint16_t* in, long N) {
  const long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < N) out[i] = __uint_as_float(static_cast<uint32_t>(in[i]) << 16);
}

// `vectors` runs of len floats, ld apart, as 16-bit values into vectors_out runs ld_out apart
// (ld_out a multiple of 4), every value past a run's len or past `vectors` zero: thread k writes
// the k-th quad (an 8-byte store) from load_quad's.
template <ComputeDtype D>
__global__ void narrow_kernel(uint16_t* out, long ld_out, const float* x, long ld, long vectors, int len, long quads) {
  const long k = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= quads) return;
  const long v = k / (ld_out / 4);
  const int at = static_cast<int>(4 * (k % (ld_out / 4)));
  const float4 f = v < vectors && at < len ? load_quad(x + v * ld, at, len) : float4{0.0f, 0.0f, 0.0f, 0.0f};
  uint2 pairs;
  pairs.x = bits16<D>(f.x) | (bits16<D>(f.y) << 16);
  pairs.y = bits16<D>(f.z) | (bits16<D>(f.w) << 16);
  *reinterpret_cast<uint2*>(out + v * ld_out + at) = pairs;
}

__global__ void round_kernel(float* x, long N, ComputeDtype d) {
  const long i = quad_start();
  if (i >= N) return;
  store_quad(x, i, N, map_quad(load_quad(x, i, N), [d](float v) { return round_value(v, d); }));
}

// ---- attention's element-wise parts (the products are GEMMs: attention.cpp). Scores of one
// sequence are (NH, T, T) row-major: head h, query i, key j.

// A warp per score row: P = softmax(scale · S + ALiBi) over the keys j <= i (0 above the
// diagonal), in place, and the row's log-sum-exp of the biased scaled scores. Row h·T + i of a
// group of heads starting at head h0. The bias joins the subtrahend of the exponents so that
// without ALiBi (slope 0) they are formed exactly as scale·S - lse.
__global__ void attention_softmax_kernel(float* S, float* lse, const int32_t* positions, int T, int rows, float scale,
                                         AttentionHeads heads, int h0, int b) {
  const int lane = threadIdx.x % kWarpSize;
  const int row = (blockIdx.x * blockDim.x + threadIdx.x) / kWarpSize;
  if (row >= rows) return;
  const int i = row % T, first = attention_first_key(positions, 0, T, i, heads.window);
  const float slope = heads.alibi ? alibi_slope(h0 + row / T, heads.n_heads, heads.alibi_bias_max) : 0.0f;
  float* s = S + static_cast<long>(row) * T;
  MaxSum acc;  // lanes without keys keep an empty one
  for (int j = first + lane; j <= i; j += kWarpSize) acc.add(s[j] * scale + slope * static_cast<float>(j - i));
  acc.merge_warp();
  const float l = acc.logsumexp();
  for (int j = lane; j < T; j += kWarpSize)
    s[j] = j <= i && j >= first ? expf(s[j] * scale - (l - slope * static_cast<float>(j - i))) : 0.0f;
  if (heads.dropout.active()) {
    const DropoutSite& d = heads.dropout;
    const uint64_t stream = dropout_stream(d.key, d.first_sample + b);
    const uint64_t base = attention_dropout_index(h0 + row / T, i, 0, T);
    const float keep_scale = d.scale();
    // Each lane rescales the elements it wrote above (no other lane's).
    for (int j = lane; j <= i; j += kWarpSize)
      if (j >= first)
        s[j] = dropout_keep(stream, base + static_cast<uint64_t>(j), d.threshold()) ? s[j] * keep_scale : 0.0f;
  }
  if (lane == 0) lse[row] = l;
}

// D (NH·T) = the row sums of dout ∘ out per head: a warp per (h, i).
__global__ void attention_delta_kernel(float* D, const float* dout, const float* out, int T, int C, int NH) {
  const int lane = threadIdx.x % kWarpSize;
  const int row = (blockIdx.x * blockDim.x + threadIdx.x) / kWarpSize;  // h·T + i
  if (row >= NH * T) return;
  const int h = row / T, i = row % T, HS = C / NH;
  const long base = static_cast<long>(i) * C + static_cast<long>(h) * HS;
  float s = 0;
  for (int d = lane; d < HS; d += kWarpSize) s += dout[base + d] * out[base + d];
  s = warp_sum(s);
  if (lane == 0) D[row] = s;
}

// Element-wise over (h, i, j) of a group of heads starting at head h0: S (the recomputed raw
// scores) becomes P = exp(scale·S + ALiBi - lse), and dP becomes scale · P · (dP - D_i), both 0
// above the diagonal.
__global__ void attention_dsoftmax_kernel(float* S, float* dP, const float* lse, const float* D,
                                          const int32_t* positions, int T, long n, float scale, AttentionHeads heads,
                                          int h0, int b) {
  const long k = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= n) return;
  const long row = k / T;
  const int i = static_cast<int>(row % T), j = static_cast<int>(k % T);
  if (j > i || j < attention_first_key(positions, 0, T, i, heads.window)) {
    S[k] = 0.0f;
    dP[k] = 0.0f;
    return;
  }
  const float slope =
      heads.alibi ? alibi_slope(h0 + static_cast<int>(row / T), heads.n_heads, heads.alibi_bias_max) : 0.0f;
  const float p = expf(S[k] * scale - (lse[row] - slope * static_cast<float>(j - i)));
  if (heads.dropout.active()) {
    const DropoutSite& d = heads.dropout;
    const uint64_t index = attention_dropout_index(h0 + static_cast<int>(row / T), i, j, T);
    const float m = dropout_keep(dropout_stream(d.key, d.first_sample + b), index, d.threshold()) ? d.scale() : 0.0f;
    S[k] = p * m;
    dP[k] = scale * p * (dP[k] * m - D[row]);
    return;
  }
  S[k] = p;
  dP[k] = scale * p * (dP[k] - D[row]);
}

// ---- cross-entropy: a block per row

constexpr int kCeThreads = 512;

// Block-wide (max, sum of exp) of one row rounded to d, combined in a fixed tree; every thread
// gets the result.
__device__ void row_logsumexp(const float* x, int V, ComputeDtype d, float* shared, float& lse) {
  MaxSum acc;
  for (int v = threadIdx.x; v < V; v += blockDim.x) acc.add(round_value(x[v], d));
  // Within the warp, then across warps through shared memory.
  acc.merge_warp();
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, warps = blockDim.x / kWarpSize;
  if (lane == 0) {
    shared[warp] = acc.m;
    shared[warps + warp] = acc.s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    MaxSum all;
    for (int w = 0; w < warps; w++) all.merge(shared[w], shared[warps + w]);
    shared[2 * warps] = all.logsumexp();
  }
  __syncthreads();
  lse = shared[2 * warps];
}

__global__ void crossentropy_forward_kernel(float* losses, float* lse_out, const float* logits, const int32_t* targets,
                                            int V, ComputeDtype d) {
  __shared__ float shared[2 * (kCeThreads / 32) + 1];
  const long row = blockIdx.x;
  const float* x = logits + row * V;
  float lse;
  row_logsumexp(x, V, d, shared, lse);
  if (threadIdx.x == 0) {
    const int32_t target = targets[row];
    lse_out[row] = lse;
    losses[row] = target == kIgnoreIndex ? 0.0f : lse - round_value(x[target], d);
  }
}

__global__ void crossentropy_forward_backward_kernel(float* losses, float* dlogits, const float* logits,
                                                     const int32_t* targets, float dloss, int V, ComputeDtype d) {
  __shared__ float shared[2 * (kCeThreads / 32) + 1];
  const long row = blockIdx.x;
  const float* x = logits + row * V;
  float lse;
  row_logsumexp(x, V, d, shared, lse);
  const int32_t target = targets[row];
  if (threadIdx.x == 0) losses[row] = target == kIgnoreIndex ? 0.0f : lse - round_value(x[target], d);
  __syncthreads();  // the loss reads x[target] before the gradient may overwrite it (aliasing)
  float* dx = dlogits + row * V;
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    const float p = expf(round_value(x[v], d) - lse);
    dx[v] = target == kIgnoreIndex ? 0.0f : round_value(dloss * (p - (v == target ? 1.0f : 0.0f)), d);
  }
}

// The vocabulary-parallel steps: a block of threads per row (per row and sum block for the sums),
// each reduction over the threads in a fixed tree.
__device__ float block_reduce(float v, float* shared, bool take_max) {
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, warps = blockDim.x / kWarpSize;
  for (int o = kWarpSize / 2; o > 0; o /= 2) {
    const float other = shfl_xor(v, o);
    v = take_max ? fmaxf(v, other) : v + other;
  }
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float all = shared[0];
    for (int w = 1; w < warps; w++) all = take_max ? fmaxf(all, shared[w]) : all + shared[w];
    shared[warps] = all;
  }
  __syncthreads();
  return shared[warps];
}

__global__ void crossentropy_slice_max_kernel(float* maxes, float* picked, const float* logits,
                                              const int32_t* targets, int V, ComputeDtype d) {
  __shared__ float shared[kCeThreads / 32 + 1];
  const long row = blockIdx.x;
  const float* x = logits + row * V;
  float m = -INFINITY;
  for (int v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, round_value(x[v], d));
  m = block_reduce(m, shared, true);
  if (threadIdx.x == 0) {
    const int32_t t = targets[row];
    maxes[row] = m;
    picked[row] = t >= 0 && t < V ? round_value(x[t], d) : -INFINITY;
  }
}

__global__ void crossentropy_slice_sums_kernel(float* sums, float* exps, const float* logits, const float* shifts,
                                               int V, int NB, ComputeDtype d) {
  __shared__ float shared[kCeThreads / 32 + 1];
  const long row = blockIdx.y;
  const int v0 = blockIdx.x * kCrossentropySumBlock, v1 = min(V, v0 + kCrossentropySumBlock);
  float s = 0.0f;
  for (int v = v0 + threadIdx.x; v < v1; v += blockDim.x) {
    const float e = expf(round_value(logits[row * V + v], d) - shifts[row]);
    if (exps) exps[row * V + v] = e;
    s += e;
  }
  s = block_reduce(s, shared, false);
  if (threadIdx.x == 0) sums[row * NB + blockIdx.x] = s;
}

__global__ void crossentropy_slice_finish_kernel(float* losses, float* lse, float* dlogits, const float* sums, int NB,
                                                 const float* shifts, const float* picked, const int32_t* targets,
                                                 float dloss, int V, ComputeDtype d) {
  const long row = blockIdx.x;
  double total = 0;
  for (int k = 0; k < NB; k++) total += sums[row * NB + k];
  const float sum = static_cast<float>(total), l = shifts[row] + logf(sum);
  const int32_t t = targets[row];
  if (threadIdx.x == 0) {
    if (lse) lse[row] = l;
    losses[row] = t == kIgnoreIndex ? 0.0f : l - picked[row];
  }
  if (!dlogits) return;
  float* dx = dlogits + row * V;
  const float scale = dloss / sum;
  for (int v = threadIdx.x; v < V; v += blockDim.x)
    dx[v] = t == kIgnoreIndex ? 0.0f : round_value(v == t ? dx[v] * scale - dloss : dx[v] * scale, d);
}

}  // namespace

// ---- the ops

void encoder_forward(float* out, const int32_t* tokens, const int32_t* positions, const float* wte, const float* wpe,
                     int B, int T, int C) {
  const long N = static_cast<long>(B) * T;
  GPU_LAUNCH(encoder_forward_kernel, blocks_for(N * C), kThreads)(out, tokens, positions, wte, wpe, T, C, N);
  GPU_CHECK_LAUNCH();
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, const int32_t* positions,
                      int B, int T, int C) {
  const long N = static_cast<long>(B) * T;
  if (N == 0) return;
  auto* next = static_cast<int32_t*>(token_chains.get(2 * static_cast<size_t>(N) * sizeof(int32_t)));
  int32_t* later = next + N;
  gpu_zero(later, static_cast<size_t>(N) * sizeof(int32_t));
  GPU_LAUNCH(token_chains_kernel, blocks_for(N, 128), 128)(next, later, tokens, N);
  GPU_CHECK_LAUNCH();
  for (long n0 = 0; n0 < N; n0 += kMaxGridY) {
    const dim3 grid(blocks_for(C, 128), static_cast<unsigned>(std::min<long>(N - n0, kMaxGridY)));
    GPU_LAUNCH(encoder_backward_wte_kernel, grid, 128)(dwte, dout, tokens, next, later, C, N, n0);
  }
  GPU_CHECK_LAUNCH();
  if (!dwpe) return;
  if (positions)
    GPU_LAUNCH(encoder_backward_wpe_positions_kernel, blocks_for(static_cast<long>(T) * C), kThreads)(
        dwpe, dout, positions, B, T, C);
  else
    GPU_LAUNCH(encoder_backward_wpe_kernel, blocks_for(static_cast<long>(T) * C), kThreads)(dwpe, dout, B, T, C);
  GPU_CHECK_LAUNCH();
}

void add_rows(float* dst, const float* x, const int32_t* rows, size_t n_rows, size_t row_len) {
  const size_t max_rows = kMaxGridY;
  for (size_t r = 0; r < n_rows && row_len > 0; r += max_rows) {
    const dim3 grid(blocks_for(static_cast<long>(row_len)), static_cast<unsigned>(std::min(max_rows, n_rows - r)));
    GPU_LAUNCH(add_rows_kernel, grid, kThreads)(dst, x + r * row_len, rows + r, row_len);
    GPU_CHECK_LAUNCH();
  }
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       int N, int C) {
  const int rows_per_block = kThreads / kWarpSize;
  GPU_LAUNCH(layernorm_forward_kernel, blocks_for(N, rows_per_block), kThreads)(out, mean, rstd, inp,
                                                                                weight, bias, N, C);
  GPU_CHECK_LAUNCH();
}

namespace {
// A norm's weight (and bias, if dbias) gradients +=, as fixed-order column sums; mean null: RMSNorm.
// The norm's parameter gradients over B groups of T rows, group b's at dweight / dbias + b·stride.
void norm_param_grads(float* dweight, float* dbias, size_t stride, const float* dout, const float* inp,
                      const float* mean, const float* rstd, int B, int T, int C) {
  const int chunks = (T + kRowsPerChunk - 1) / kRowsPerChunk;  // a group's
  double* partial = scratch(2L * B * chunks * C);
  GPU_LAUNCH(layernorm_param_partials_kernel, dim3(blocks_for(C), B * chunks), kThreads)(
      partial, dout, inp, mean, rstd, T, C);
  GPU_CHECK_LAUNCH();
  GPU_LAUNCH(sum_partials_kernel, dim3(blocks_for(C, kPartialColumns), dbias ? 2 : 1, B),
             dim3(kPartialColumns, kPartialGroups))(dweight, dbias, partial, chunks, C, stride, true);
  GPU_CHECK_LAUNCH();
}
}  // namespace

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C) {
  layernorm_backward_sequences(dinp, dweight, dbias, 0, dout, inp, weight, mean, rstd, 1, N, C);
}

void layernorm_backward_sequences(float* dinp, float* dweight, float* dbias, size_t grads_stride, const float* dout,
                                  const float* inp, const float* weight, const float* mean, const float* rstd, int B,
                                  int T, int C) {
  const int rows_per_block = kThreads / kWarpSize, N = B * T;
  GPU_LAUNCH(layernorm_backward_dinp_kernel, blocks_for(N, rows_per_block), kThreads)(
      dinp, dout, inp, weight, mean, rstd, N, C);
  GPU_CHECK_LAUNCH();
  norm_param_grads(dweight, dbias, grads_stride, dout, inp, mean, rstd, B, T, C);
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, float eps, int N, int C) {
  const int rows_per_block = kThreads / kWarpSize;
  GPU_LAUNCH(rmsnorm_forward_kernel, blocks_for(N, rows_per_block), kThreads)(out, rstd, inp, weight, eps, N, C);
  GPU_CHECK_LAUNCH();
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C) {
  rmsnorm_backward_sequences(dinp, dweight, 0, dout, inp, weight, rstd, 1, N, C);
}

void rmsnorm_backward_sequences(float* dinp, float* dweight, size_t grads_stride, const float* dout, const float* inp,
                                const float* weight, const float* rstd, int B, int T, int C) {
  const int rows_per_block = kThreads / kWarpSize, N = B * T;
  GPU_LAUNCH(rmsnorm_backward_dinp_kernel, blocks_for(N, rows_per_block), kThreads)(dinp, dout, inp, weight, rstd, N,
                                                                                      C);
  GPU_CHECK_LAUNCH();
  if (dweight) norm_param_grads(dweight, nullptr, grads_stride, dout, inp, nullptr, rstd, B, T, C);
}

void rmsnorm_weight_sums(double* sums, const float* dout, const float* inp, const float* rstd, int N, int C) {
  GPU_LAUNCH(rmsnorm_weight_sums_kernel, blocks_for(C), kThreads)(sums, dout, inp, rstd, N, C);
  GPU_CHECK_LAUNCH();
}

void column_sums(float* out, const float* x, long ld, int B, int T, int C, size_t stride, bool accumulate) {
  const int chunks = (T + kRowsPerChunk - 1) / kRowsPerChunk;  // a group's
  double* partial = scratch(static_cast<size_t>(B) * chunks * C);
  GPU_LAUNCH(column_partials_kernel, dim3(blocks_for(C), B * chunks), kThreads)(partial, x, ld, T, C);
  GPU_CHECK_LAUNCH();
  GPU_LAUNCH(sum_partials_kernel, dim3(blocks_for(C, kPartialColumns), 1, B), dim3(kPartialColumns, kPartialGroups))(
      out, nullptr, partial, chunks, C, stride, accumulate);
  GPU_CHECK_LAUNCH();
}

void rope_forward(float* x, const int32_t* positions, int B, int T, int row_stride, int n_heads, int HS,
                  const RopeFrequencies& freqs) {
  const long pairs = static_cast<long>(B) * T * n_heads * (HS / 2);
  GPU_LAUNCH(rope_kernel, blocks_for(pairs), kThreads)(x, positions, T, row_stride, n_heads, HS, freqs, 1.0f, pairs);
  GPU_CHECK_LAUNCH();
}

void rope_backward(float* dx, const int32_t* positions, int B, int T, int row_stride, int n_heads, int HS,
                   const RopeFrequencies& freqs) {
  const long pairs = static_cast<long>(B) * T * n_heads * (HS / 2);
  GPU_LAUNCH(rope_kernel, blocks_for(pairs), kThreads)(dx, positions, T, row_stride, n_heads, HS, freqs, -1.0f,
                                                       pairs);
  GPU_CHECK_LAUNCH();
}

void swiglu_forward(float* out, const float* inp, int N, int F, ComputeDtype d) {
  const long NF = static_cast<long>(N) * F;
  GPU_LAUNCH(swiglu_forward_kernel, blocks_for(NF), kThreads)(out, inp, F, NF, d);
  GPU_CHECK_LAUNCH();
}

void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F, ComputeDtype d) {
  const long NF = static_cast<long>(N) * F;
  GPU_LAUNCH(swiglu_backward_kernel, blocks_for(NF), kThreads)(dinp, inp, dout, F, NF, d);
  GPU_CHECK_LAUNCH();
}

void gelu_forward(float* out, const float* inp, long N, GeluForm form, ComputeDtype d) {
  if (form == GeluForm::kErf)
    GPU_LAUNCH(gelu_erf_forward_kernel, blocks_for(quads(N)), kThreads)(out, inp, N, d);
  else
    GPU_LAUNCH(gelu_forward_kernel, blocks_for(quads(N)), kThreads)(out, inp, N, d);
  GPU_CHECK_LAUNCH();
}

void gelu_backward(float* dinp, const float* inp, const float* dout, long N, GeluForm form, ComputeDtype d) {
  if (form == GeluForm::kErf)
    GPU_LAUNCH(gelu_erf_backward_kernel, blocks_for(quads(N)), kThreads)(dinp, inp, dout, N, d);
  else
    GPU_LAUNCH(gelu_backward_kernel, blocks_for(quads(N)), kThreads)(dinp, inp, dout, N, d);
  GPU_CHECK_LAUNCH();
}

void dropout_apply(float* out, const float* x, int B, long n, DropoutSite site) {
  const long total = static_cast<long>(B) * n;
  GPU_LAUNCH(dropout_apply_kernel, blocks_for(total), kThreads)(out, x, n, total, site, site.scale(), site.threshold());
  GPU_CHECK_LAUNCH();
}

void residual_forward(float* out, const float* a, const float* b, long N) {
  GPU_LAUNCH(residual_forward_kernel, blocks_for(quads(N)), kThreads)(out, a, b, N);
  GPU_CHECK_LAUNCH();
}

void residual_backward(float* da, float* db, const float* dout, long N) {
  GPU_LAUNCH(residual_backward_kernel, blocks_for(N), kThreads)(da, db, dout, N);
  GPU_CHECK_LAUNCH();
}

void lora_delta_forward(float* out, long ld, const float* delta, int N, int cols, float scale) {
  const long total = static_cast<long>(N) * cols;
  if (total == 0) return;
  GPU_LAUNCH(lora_delta_forward_kernel, blocks_for(total), kThreads)(out, ld, delta, total, cols, scale);
  GPU_CHECK_LAUNCH();
}

void lora_delta_backward(float* ddelta, const float* dout, long ld, int N, int cols, float scale) {
  const long total = static_cast<long>(N) * cols;
  if (total == 0) return;
  GPU_LAUNCH(lora_delta_backward_kernel, blocks_for(total), kThreads)(ddelta, dout, ld, total, cols, scale);
  GPU_CHECK_LAUNCH();
}

void copy_columns(float* dst, long ld_dst, long dst_part, const float* src, long ld_src, long src_part, int N, int cols,
                  int parts) {
  const int quads_per_row = static_cast<int>(quads(cols));
  const long total = static_cast<long>(parts) * N * quads_per_row;
  if (total == 0) return;
  GPU_LAUNCH(copy_columns_kernel, blocks_for(total), kThreads)(dst, ld_dst, dst_part, src, ld_src, src_part, total, N,
                                                               quads_per_row, cols);
  GPU_CHECK_LAUNCH();
}

void widen_bf16(float* out, const uint16_t* in, long N) {
  if (N == 0) return;
  GPU_LAUNCH(widen_bf16_kernel, blocks_for(N), kThreads)(out, in, N);
  GPU_CHECK_LAUNCH();
}

void narrow_to_16(uint16_t* out, long ld_out, const float* x, long ld, long vectors, int len, long vectors_out,
                  ComputeDtype d) {
  ANVIL_CHECK(ld_out % 4 == 0 && ld_out >= len && vectors_out >= vectors && reinterpret_cast<uintptr_t>(out) % 8 == 0,
              "internal: narrow_to_16's output ({} runs {} apart for {} of {}) is not in aligned quads", vectors_out,
              ld_out, vectors, len);
  const long quads = vectors_out * (ld_out / 4);
  if (quads == 0) return;
  if (d == ComputeDtype::kBf16)
    GPU_LAUNCH(narrow_kernel<ComputeDtype::kBf16>, blocks_for(quads), kThreads)(out, ld_out, x, ld, vectors, len, quads);
  else
    GPU_LAUNCH(narrow_kernel<ComputeDtype::kFp16>, blocks_for(quads), kThreads)(out, ld_out, x, ld, vectors, len, quads);
  GPU_CHECK_LAUNCH();
}

void round_to_dtype(float* x, long N, ComputeDtype d) {
  if (d == ComputeDtype::kFp32 || N == 0) return;
  GPU_LAUNCH(round_kernel, blocks_for(quads(N)), kThreads)(x, N, d);
  GPU_CHECK_LAUNCH();
}

void attention_softmax(float* S, float* lse, const int32_t* positions, int T, int count, float scale,
                       const AttentionHeads& heads, int h0, int b) {
  const int rows = count * T, rows_per_block = kThreads / kWarpSize;
  GPU_LAUNCH(attention_softmax_kernel, blocks_for(rows, rows_per_block), kThreads)(S, lse, positions, T, rows, scale,
                                                                                   heads, h0, b);
  GPU_CHECK_LAUNCH();
}

void attention_delta(float* D, const float* dout, const float* out, int T, int C, int NH) {
  const int rows_per_block = kThreads / kWarpSize;
  GPU_LAUNCH(attention_delta_kernel, blocks_for(NH * T, rows_per_block), kThreads)(D, dout, out, T, C, NH);
  GPU_CHECK_LAUNCH();
}

void attention_dsoftmax(float* S, float* dP, const float* lse, const float* D, const int32_t* positions, int T,
                        int count, float scale, const AttentionHeads& heads, int h0, int b) {
  const long n = static_cast<long>(count) * T * T;
  GPU_LAUNCH(attention_dsoftmax_kernel, blocks_for(n), kThreads)(S, dP, lse, D, positions, T, n, scale, heads, h0, b);
  GPU_CHECK_LAUNCH();
}

void crossentropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets, int N, int V,
                          ComputeDtype d) {
  GPU_LAUNCH(crossentropy_forward_kernel, N, kCeThreads)(losses, lse, logits, targets, V, d);
  GPU_CHECK_LAUNCH();
}

void crossentropy_forward_backward(float* losses, float* dlogits, const float* logits, const int32_t* targets,
                                   float dloss, int N, int V, ComputeDtype d) {
  GPU_LAUNCH(crossentropy_forward_backward_kernel, N, kCeThreads)(losses, dlogits, logits, targets,
                                                                  dloss, V, d);
  GPU_CHECK_LAUNCH();
}

void crossentropy_slice_max(float* maxes, float* picked, const float* logits, const int32_t* targets, int N, int V,
                            ComputeDtype d) {
  if (N == 0) return;
  GPU_LAUNCH(crossentropy_slice_max_kernel, N, kCeThreads)(maxes, picked, logits, targets, V, d);
  GPU_CHECK_LAUNCH();
}

void crossentropy_slice_sums(float* sums, float* exps, const float* logits, const float* shifts, int N, int V,
                             ComputeDtype d) {
  const int NB = (V + kCrossentropySumBlock - 1) / kCrossentropySumBlock;
  for (long n0 = 0; n0 < N; n0 += kMaxGridY) {
    const long rows = std::min<long>(N - n0, kMaxGridY);
    const dim3 grid(static_cast<unsigned>(NB), static_cast<unsigned>(rows));
    GPU_LAUNCH(crossentropy_slice_sums_kernel, grid, kCeThreads)(sums + n0 * NB, exps ? exps + n0 * V : nullptr,
                                                                 logits + n0 * V, shifts + n0, V, NB, d);
  }
  GPU_CHECK_LAUNCH();
}

void crossentropy_slice_finish(float* losses, float* lse, float* dlogits, const float* sums, int NB,
                               const float* shifts, const float* picked, const int32_t* targets, float dloss, int N,
                               int V, ComputeDtype d) {
  if (N == 0) return;
  GPU_LAUNCH(crossentropy_slice_finish_kernel, N, kCeThreads)(losses, lse, dlogits, sums, NB, shifts, picked, targets,
                                                              dloss, V, d);
  GPU_CHECK_LAUNCH();
}

}  // namespace anvil::gpu
