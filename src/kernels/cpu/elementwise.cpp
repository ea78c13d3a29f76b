// Fast CPU kernels for the memory-bound ops: rows split across OpenMP threads, inner loops left
// for the compiler to vectorise. Every reduction keeps one fixed order, whatever the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/round_value.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/columns.h"
#include "kernels/dropout.h"
#include "kernels/encoder.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/lora.h"
#include "kernels/residual.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"

namespace anvil::cpu {

void encoder_forward(float* out, const int32_t* tokens, const int32_t* positions, const float* wte, const float* wpe,
                     int B, int T, int C) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      const float* e = wte + static_cast<long>(tokens[b * T + t]) * C;
      float* o = out + (static_cast<long>(b) * T + t) * C;
      if (!wpe) {
        std::copy(e, e + C, o);
        continue;
      }
      const float* p = wpe + static_cast<long>(position_of(positions, b, T, t)) * C;
#pragma omp simd
      for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
    }
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, const int32_t* positions,
                      int B, int T, int C) {
  // Threads own disjoint channel ranges, so several positions holding the same token never race
  // and every sum runs in (b, t) order.
  constexpr int kChunk = 16;
  const int chunks = (C + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (int ch = 0; ch < chunks; ch++) {
    const int c0 = ch * kChunk, c1 = std::min(C, c0 + kChunk);
    for (int b = 0; b < B; b++)
      for (int t = 0; t < T; t++) {
        const float* d = dout + (static_cast<long>(b) * T + t) * C;
        float* de = dwte + static_cast<long>(tokens[b * T + t]) * C;
        for (int c = c0; c < c1; c++) de[c] += d[c];
        if (!dwpe) continue;
        float* dp = dwpe + static_cast<long>(position_of(positions, b, T, t)) * C;
        for (int c = c0; c < c1; c++) dp[c] += d[c];
      }
  }
}

void add_rows(float* dst, const float* x, const int32_t* rows, size_t n_rows, size_t row_len) {
  // The rows are distinct: no two threads add into the same one.
#pragma omp parallel for schedule(static)
  for (size_t r = 0; r < n_rows; r++) {
    float* d = dst + static_cast<size_t>(rows[r]) * row_len;
    const float* v = x + r * row_len;
#pragma omp simd
    for (size_t i = 0; i < row_len; i++) d[i] += v[i];
  }
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float* x = inp + static_cast<long>(n) * C;
    float m = 0;
#pragma omp simd reduction(+ : m)
    for (int c = 0; c < C; c++) m += x[c];
    m /= C;
    float v = 0;
#pragma omp simd reduction(+ : v)
    for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
    v /= C;
    float s = 1.0f / std::sqrt(v + kLayerNormEps);
    float* o = out + static_cast<long>(n) * C;
    if (bias) {
#pragma omp simd
      for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * weight[c] + bias[c];
    } else {
#pragma omp simd
      for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * weight[c];
    }
    mean[n] = m;
    rstd[n] = s;
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float* x = inp + static_cast<long>(n) * C;
    const float* d = dout + static_cast<long>(n) * C;
    float* dx = dinp + static_cast<long>(n) * C;
    const float m = mean[n], s = rstd[n];
    float g_mean = 0, gx_mean = 0;
#pragma omp simd reduction(+ : g_mean, gx_mean)
    for (int c = 0; c < C; c++) {
      float g = d[c] * weight[c];
      g_mean += g;
      gx_mean += g * (x[c] - m) * s;
    }
    g_mean /= C;
    gx_mean /= C;
#pragma omp simd
    for (int c = 0; c < C; c++) {
      float xhat = (x[c] - m) * s;
      dx[c] += s * (d[c] * weight[c] - g_mean - xhat * gx_mean);
    }
  }
  // Parameter gradients: threads own channel ranges and sum rows in order.
  constexpr int kChunk = 16;
  const int chunks = (C + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (int ch = 0; ch < chunks; ch++) {
    const int c0 = ch * kChunk, c1 = std::min(C, c0 + kChunk);
    for (int n = 0; n < N; n++) {
      const float* x = inp + static_cast<long>(n) * C;
      const float* d = dout + static_cast<long>(n) * C;
      if (dbias)
        for (int c = c0; c < c1; c++) dbias[c] += d[c];
      for (int c = c0; c < c1; c++) dweight[c] += d[c] * (x[c] - mean[n]) * rstd[n];
    }
  }
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, float eps, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float* x = inp + static_cast<long>(n) * C;
    float ms = 0;
#pragma omp simd reduction(+ : ms)
    for (int c = 0; c < C; c++) ms += x[c] * x[c];
    const float s = 1.0f / std::sqrt(ms / C + eps);
    float* o = out + static_cast<long>(n) * C;
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = x[c] * s * weight[c];
    rstd[n] = s;
  }
}

namespace {
// Columns [c0, c1) of RMSNorm's weight sums (rmsnorm_weight_sums), each over the N rows in order,
// added into sums[0, c1 - c0).
constexpr int kRmsWeightChunk = 16;
void rms_weight_sums(double* sums, const float* dout, const float* inp, const float* rstd, int N, int C, int c0,
                     int c1) {
  for (int n = 0; n < N; n++) {
    const float* x = inp + static_cast<long>(n) * C;
    const float* d = dout + static_cast<long>(n) * C;
    for (int c = c0; c < c1; c++) sums[c - c0] += static_cast<double>(d[c] * x[c] * rstd[n]);
  }
}
}  // namespace

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float* x = inp + static_cast<long>(n) * C;
    const float* d = dout + static_cast<long>(n) * C;
    float* dx = dinp + static_cast<long>(n) * C;
    const float s = rstd[n];
    float gx_mean = 0;
#pragma omp simd reduction(+ : gx_mean)
    for (int c = 0; c < C; c++) gx_mean += d[c] * weight[c] * x[c] * s;
    gx_mean /= C;
#pragma omp simd
    for (int c = 0; c < C; c++) dx[c] += s * (d[c] * weight[c] - x[c] * s * gx_mean);
  }
  if (!dweight) return;
  // The weight's gradient: threads own channel ranges and sum rows in order, in double (a long
  // column's terms cancel), added once.
  const int chunks = (C + kRmsWeightChunk - 1) / kRmsWeightChunk;
#pragma omp parallel for schedule(static)
  for (int ch = 0; ch < chunks; ch++) {
    double sums[kRmsWeightChunk] = {};
    const int c0 = ch * kRmsWeightChunk, c1 = std::min(C, c0 + kRmsWeightChunk);
    rms_weight_sums(sums, dout, inp, rstd, N, C, c0, c1);
    for (int c = c0; c < c1; c++) dweight[c] = static_cast<float>(dweight[c] + sums[c - c0]);
  }
}

void rmsnorm_weight_sums(double* sums, const float* dout, const float* inp, const float* rstd, int N, int C) {
  const int chunks = (C + kRmsWeightChunk - 1) / kRmsWeightChunk;
#pragma omp parallel for schedule(static)
  for (int ch = 0; ch < chunks; ch++) {
    const int c0 = ch * kRmsWeightChunk;
    rms_weight_sums(sums + c0, dout, inp, rstd, N, C, c0, std::min(C, c0 + kRmsWeightChunk));
  }
}

namespace {
constexpr float kGeluScale = 0.7978845608028654f;
constexpr float kSqrtHalf = 0.7071067811865476f, kInvSqrt2Pi = 0.3989422804014327f;
// Elements of one sequence per piece of work in dropout_apply.
constexpr long kDropoutChunk = 4096;

// 0.5·(1 + tanh(u)) = sigmoid(2u). Written with exp(-2|u|) so that neither it nor 1 - it loses
// digits to cancellation in the tails, where tanh(u) rounds to ±1. exp_approx vectorises where
// libm's expf is a scalar call.
struct Sigmoid2 {
  float s, one_minus_s;
};
inline Sigmoid2 sigmoid2(float u) {
  const float a = exp_approx(-2.0f * std::fabs(u));
  const float big = 1.0f / (1.0f + a), small = a * big;
  const bool positive = u >= 0;  // two selects, not a branch: the loops vectorise
  return Sigmoid2{positive ? big : small, positive ? small : big};
}

ANVIL_CPU_CLONES void gelu_forward_range(float* out, const float* inp, size_t lo, size_t hi) {
#pragma omp simd
  for (size_t i = lo; i < hi; i++) {
    const float x = inp[i];
    out[i] = x * sigmoid2(kGeluScale * (x + 0.044715f * x * x * x)).s;
  }
}

// d/dx [x·s(u)] = s + x·s'(u)·u', with s = sigmoid(2u): s'(u) = 2·s·(1 - s).
ANVIL_CPU_CLONES void gelu_backward_range(float* dinp, const float* inp, const float* dout, size_t lo,
                                          size_t hi) {
#pragma omp simd
  for (size_t i = lo; i < hi; i++) {
    const float x = inp[i];
    const Sigmoid2 g = sigmoid2(kGeluScale * (x + 0.044715f * x * x * x));
    const float du = kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] = (g.s + 2.0f * x * g.s * g.one_minus_s * du) * dout[i];
  }
}

// Φ(x), the standard normal CDF, as erfc(|x|/√2)/2 on the side where that is the value.
inline float normal_cdf(float x) {
  const float half_tail = 0.5f * erfc_nonneg((x < 0.0f ? -x : x) * kSqrtHalf);
  return x < 0.0f ? half_tail : 1.0f - half_tail;
}

ANVIL_CPU_CLONES void gelu_erf_forward_range(float* out, const float* inp, size_t lo, size_t hi) {
#pragma omp simd
  for (size_t i = lo; i < hi; i++) out[i] = inp[i] * normal_cdf(inp[i]);
}

// d/dx [x·Φ(x)] = Φ(x) + x·φ(x), φ(x) = e^(-x²/2)/√(2π).
ANVIL_CPU_CLONES void gelu_erf_backward_range(float* dinp, const float* inp, const float* dout, size_t lo,
                                              size_t hi) {
#pragma omp simd
  for (size_t i = lo; i < hi; i++) {
    const float x = inp[i];
    dinp[i] = (normal_cdf(x) + x * exp_approx(-0.5f * x * x) * kInvSqrt2Pi) * dout[i];
  }
}
}  // namespace

namespace {
// The rotation of every (position t < T, pair i) by sign times its angle, as the reference forms
// it (fp32 angle, double cos and sin), then applied to each row's heads.
void rope_rotate(float* x, const int32_t* positions, int B, int T, int row_stride, int n_heads, int HS,
                 const RopeFrequencies& freqs, float sign) {
  const int half = HS / 2;
  // A row per position up to the largest (past T after a kept prefix: Model::keep_prefix).
  int P = T;
  if (positions)
    for (long i = 0; i < static_cast<long>(B) * T; i++) P = std::max(P, positions[i] + 1);
  // Kept between calls: a step does not allocate once the longest sequence has been seen.
  thread_local std::vector<float> table;
  if (table.size() < 2 * static_cast<size_t>(P) * half) table.resize(2 * static_cast<size_t>(P) * half);
  float* cos_t = table.data();
  float* sin_t = cos_t + static_cast<size_t>(P) * half;
#pragma omp parallel for schedule(static)
  for (int t = 0; t < P; t++)
    for (int i = 0; i < half; i++) {
      const double angle = static_cast<float>(t) * rope_inv_freq(freqs, i, HS);
      cos_t[t * half + i] = static_cast<float>(std::cos(angle));
      sin_t[t * half + i] = sign * static_cast<float>(std::sin(angle));
    }
#pragma omp parallel for schedule(static)
  for (long row = 0; row < static_cast<long>(B) * T; row++) {
    const long t = position_of(positions, static_cast<int>(row / T), T, static_cast<int>(row % T));
    const float* c = cos_t + t * half;
    const float* s = sin_t + t * half;
    for (int h = 0; h < n_heads; h++) {
      float* v = x + row * row_stride + static_cast<long>(h) * HS;
#pragma omp simd
      for (int i = 0; i < half; i++) {
        const float a = v[i], b = v[i + half];
        v[i] = a * c[i] - b * s[i];
        v[i + half] = b * c[i] + a * s[i];
      }
    }
  }
}
}  // namespace

void rope_forward(float* x, const int32_t* positions, int B, int T, int row_stride, int n_heads, int HS,
                  const RopeFrequencies& freqs) {
  rope_rotate(x, positions, B, T, row_stride, n_heads, HS, freqs, 1.0f);
}
void rope_backward(float* dx, const int32_t* positions, int B, int T, int row_stride, int n_heads, int HS,
                   const RopeFrequencies& freqs) {
  rope_rotate(dx, positions, B, T, row_stride, n_heads, HS, freqs, -1.0f);
}

// sigmoid(x) = sigmoid2(x/2): the same cancellation-free form as GELU's. Rows [lo, hi), compiled
// for each instruction set as GELU's ranges are, so that exp_approx runs in the widest vectors.
ANVIL_CPU_CLONES void swiglu_forward_rows(float* out, const float* inp, size_t lo, size_t hi, int F) {
  for (size_t n = lo; n < hi; n++) {
    const float* gate = inp + n * 2 * F;
    const float* up = gate + F;
    float* o = out + n * F;
#pragma omp simd
    for (int f = 0; f < F; f++) o[f] = gate[f] * sigmoid2(0.5f * gate[f]).s * up[f];
  }
}

ANVIL_CPU_CLONES void swiglu_backward_rows(float* dinp, const float* inp, const float* dout, size_t lo, size_t hi,
                                           int F) {
  for (size_t n = lo; n < hi; n++) {
    const float* gate = inp + n * 2 * F;
    const float* up = gate + F;
    const float* d = dout + n * F;
    float* dgate = dinp + n * 2 * F;
    float* dup = dgate + F;
#pragma omp simd
    for (int f = 0; f < F; f++) {
      const float g = gate[f];
      const Sigmoid2 sig = sigmoid2(0.5f * g);
      dgate[f] = d[f] * up[f] * sig.s * (1.0f + g * sig.one_minus_s);
      dup[f] = d[f] * g * sig.s;
    }
  }
}

namespace {
ANVIL_CPU_CLONES void round_range(float* x, size_t lo, size_t hi, ComputeDtype d) {
  if (d == ComputeDtype::kBf16) {
#pragma omp simd
    for (size_t i = lo; i < hi; i++) x[i] = round_bf16_value(x[i]);
  } else if (d == ComputeDtype::kFp16) {
#pragma omp simd
    for (size_t i = lo; i < hi; i++) x[i] = round_fp16_value(x[i]);
  }
}

// compute(lo, hi) over each thread's range in blocks of a few KiB, each block of out (out_width
// values per unit of the range) rounded to d while it is still in the core's cache: the rounding
// costs no pass over memory of its own.
template <class Compute>
void over_threads_rounded(size_t n, float* out, size_t out_width, ComputeDtype d, const Compute& compute) {
  constexpr size_t kBlockValues = 4096;
  const size_t block = std::max<size_t>(1, kBlockValues / out_width);
  over_threads(n, [&](size_t lo, size_t hi) {
    for (size_t a = lo; a < hi; a += block) {
      const size_t b = std::min(hi, a + block);
      compute(a, b);
      round_range(out, a * out_width, b * out_width, d);
    }
  });
}
}  // namespace

void swiglu_forward(float* out, const float* inp, int N, int F, ComputeDtype d) {
  over_threads_rounded(static_cast<size_t>(N), out, static_cast<size_t>(F), d,
                       [&](size_t lo, size_t hi) { swiglu_forward_rows(out, inp, lo, hi, F); });
}

void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F, ComputeDtype d) {
  over_threads_rounded(static_cast<size_t>(N), dinp, 2 * static_cast<size_t>(F), d,
                       [&](size_t lo, size_t hi) { swiglu_backward_rows(dinp, inp, dout, lo, hi, F); });
}

// The erf form: x·Φ(x), with Φ(x) = erfc(-x/√2)/2 formed from erfc of |x|/√2 (vec_math.h), so
// the negative tail, where 1 + erf(x/√2) cancels, keeps its relative accuracy.
void gelu_forward(float* out, const float* inp, long N, GeluForm form, ComputeDtype d) {
  over_threads_rounded(static_cast<size_t>(N), out, 1, d, [&](size_t lo, size_t hi) {
    if (form == GeluForm::kErf)
      gelu_erf_forward_range(out, inp, lo, hi);
    else
      gelu_forward_range(out, inp, lo, hi);
  });
}

void gelu_backward(float* dinp, const float* inp, const float* dout, long N, GeluForm form, ComputeDtype d) {
  over_threads_rounded(static_cast<size_t>(N), dinp, 1, d, [&](size_t lo, size_t hi) {
    if (form == GeluForm::kErf)
      gelu_erf_backward_range(dinp, inp, dout, lo, hi);
    else
      gelu_backward_range(dinp, inp, dout, lo, hi);
  });
}

void dropout_apply(float* out, const float* x, int B, long n, DropoutSite site) {
  const float scale = site.scale();
  const uint32_t threshold = site.threshold();
#pragma omp parallel for schedule(static) collapse(2)
  for (int b = 0; b < B; b++)
    for (long i0 = 0; i0 < n; i0 += kDropoutChunk) {
      const uint64_t stream = dropout_stream(site.key, site.first_sample + b);
      const long k0 = static_cast<long>(b) * n, end = std::min(n, i0 + kDropoutChunk);
#pragma omp simd
      for (long i = i0; i < end; i++)
        out[k0 + i] = dropout_keep(stream, static_cast<uint64_t>(i), threshold) ? x[k0 + i] * scale : 0.0f;
    }
}

void residual_forward(float* out, const float* a, const float* b, long N) {
#pragma omp parallel for simd schedule(static)
  for (long i = 0; i < N; i++) out[i] = a[i] + b[i];
}

void residual_backward(float* da, float* db, const float* dout, long N) {
#pragma omp parallel for simd schedule(static)
  for (long i = 0; i < N; i++) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

void lora_delta_forward(float* out, long ld, const float* delta, int N, int cols, float scale) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    float* o = out + n * ld;
    const float* d = delta + static_cast<long>(n) * cols;
#pragma omp simd
    for (int c = 0; c < cols; c++) o[c] += scale * d[c];
  }
}

void lora_delta_backward(float* ddelta, const float* dout, long ld, int N, int cols, float scale) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    float* d = ddelta + static_cast<long>(n) * cols;
    const float* o = dout + n * ld;
#pragma omp simd
    for (int c = 0; c < cols; c++) d[c] = scale * o[c];
  }
}

void copy_columns(float* dst, long ld_dst, long dst_part, const float* src, long ld_src, long src_part, int N, int cols,
                  int parts) {
  const long rows = static_cast<long>(parts) * N;
#pragma omp parallel for schedule(static)
  for (long k = 0; k < rows; k++) {
    const long p = k / N, n = k % N;
    std::copy_n(src + p * src_part + n * ld_src, cols, dst + p * dst_part + n * ld_dst);
  }
}

}  // namespace anvil::cpu
