// The reference implementation of every op: plain scalar loops that read like the math, with
// double accumulators. It is the executable specification the fast kernels are tested against.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/attention.h"
#include "kernels/columns.h"
#include "kernels/crossentropy.h"
#include "kernels/dropout.h"
#include "kernels/encoder.h"
#include "kernels/fixed_point.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/moe.h"
#include "kernels/optimizer.h"
#include "kernels/lora.h"
#include "kernels/residual.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/round.h"
#include "kernels/swiglu.h"

namespace anvil::ref {

void encoder_forward(float* out, const int32_t* tokens, const int32_t* positions, const float* wte, const float* wpe,
                     int B, int T, int C) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      const float* e = wte + static_cast<long>(tokens[b * T + t]) * C;
      const long p = position_of(positions, b, T, t);
      float* o = out + (static_cast<long>(b) * T + t) * C;
      for (int c = 0; c < C; c++) o[c] = wpe ? e[c] + wpe[p * C + c] : e[c];
    }
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, const int32_t* positions,
                      int B, int T, int C) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      const float* d = dout + (static_cast<long>(b) * T + t) * C;
      float* de = dwte + static_cast<long>(tokens[b * T + t]) * C;
      const long p = position_of(positions, b, T, t);
      for (int c = 0; c < C; c++) {
        de[c] += d[c];
        if (dwpe) dwpe[p * C + c] += d[c];
      }
    }
}

void add_rows(float* dst, const float* x, const int32_t* rows, size_t n_rows, size_t row_len) {
  for (size_t r = 0; r < n_rows; r++) {
    float* d = dst + static_cast<size_t>(rows[r]) * row_len;
    for (size_t i = 0; i < row_len; i++) d[i] += x[r * row_len + i];
  }
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C) {
  for (int n = 0; n < N; n++) {
    const float* x = inp + static_cast<long>(n) * C;
    double m = 0;
    for (int c = 0; c < C; c++) m += x[c];
    m /= C;
    double v = 0;
    for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
    v /= C;
    double s = 1.0 / std::sqrt(v + kLayerNormEps);
    float* o = out + static_cast<long>(n) * C;
    for (int c = 0; c < C; c++) o[c] = static_cast<float>((x[c] - m) * s * weight[c] + (bias ? bias[c] : 0.0f));
    mean[n] = static_cast<float>(m);
    rstd[n] = static_cast<float>(s);
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C) {
  for (int n = 0; n < N; n++) {
    const float* x = inp + static_cast<long>(n) * C;
    const float* d = dout + static_cast<long>(n) * C;
    float* dx = dinp + static_cast<long>(n) * C;
    // With xhat = (x - mean)·rstd and g = dout·weight:
    // dx = rstd · (g - mean(g) - xhat · mean(g · xhat)).
    double g_mean = 0, gx_mean = 0;
    for (int c = 0; c < C; c++) {
      double xhat = (x[c] - mean[n]) * static_cast<double>(rstd[n]);
      double g = static_cast<double>(d[c]) * weight[c];
      g_mean += g;
      gx_mean += g * xhat;
    }
    g_mean /= C;
    gx_mean /= C;
    for (int c = 0; c < C; c++) {
      double xhat = (x[c] - mean[n]) * static_cast<double>(rstd[n]);
      double g = static_cast<double>(d[c]) * weight[c];
      dx[c] += static_cast<float>(rstd[n] * (g - g_mean - xhat * gx_mean));
    }
  }
  // The parameter gradients: each column summed over the rows in double, added once.
  for (int c = 0; c < C; c++) {
    double dw = 0, db = 0;
    for (int n = 0; n < N; n++) {
      const double d = dout[static_cast<long>(n) * C + c];
      dw += d * (inp[static_cast<long>(n) * C + c] - mean[n]) * static_cast<double>(rstd[n]);
      db += d;
    }
    dweight[c] = static_cast<float>(dweight[c] + dw);
    if (dbias) dbias[c] = static_cast<float>(dbias[c] + db);
  }
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, float eps, int N, int C) {
  for (int n = 0; n < N; n++) {
    const float* x = inp + static_cast<long>(n) * C;
    double ms = 0;
    for (int c = 0; c < C; c++) ms += static_cast<double>(x[c]) * x[c];
    const double s = 1.0 / std::sqrt(ms / C + eps);
    float* o = out + static_cast<long>(n) * C;
    for (int c = 0; c < C; c++) o[c] = static_cast<float>(x[c] * s * weight[c]);
    rstd[n] = static_cast<float>(s);
  }
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C) {
  for (int n = 0; n < N; n++) {
    const float* x = inp + static_cast<long>(n) * C;
    const float* d = dout + static_cast<long>(n) * C;
    float* dx = dinp + static_cast<long>(n) * C;
    // With xhat = x·rstd and g = dout·weight: dx = rstd · (g - xhat · mean(g · xhat)).
    const double s = rstd[n];
    double gx_mean = 0;
    for (int c = 0; c < C; c++) gx_mean += static_cast<double>(d[c]) * weight[c] * x[c] * s;
    gx_mean /= C;
    for (int c = 0; c < C; c++)
      dx[c] += static_cast<float>(s * (static_cast<double>(d[c]) * weight[c] - x[c] * s * gx_mean));
  }
  if (!dweight) return;
  std::vector<double> sums(C, 0.0);
  rmsnorm_weight_sums(sums.data(), dout, inp, rstd, N, C);
  for (int c = 0; c < C; c++) dweight[c] = static_cast<float>(dweight[c] + sums[c]);  // added once
}

void rmsnorm_weight_sums(double* sums, const float* dout, const float* inp, const float* rstd, int N, int C) {
  for (int c = 0; c < C; c++)  // each column summed over the rows in double
    for (int n = 0; n < N; n++)
      sums[c] += static_cast<double>(dout[static_cast<long>(n) * C + c]) * inp[static_cast<long>(n) * C + c] * rstd[n];
}

void matmul_forward(MatmulContext&, float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC, bool accumulate) {
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) {
      double acc = accumulate ? out[static_cast<long>(n) * OC + o] : bias ? bias[o] : 0.0;
      for (int c = 0; c < C; c++)
        acc += static_cast<double>(inp[static_cast<long>(n) * C + c]) * weight[static_cast<long>(o) * C + c];
      out[static_cast<long>(n) * OC + o] = static_cast<float>(acc);
    }
}

void matmul_backward(MatmulContext&, float* dinp, float* dweight, float* dbias, const float* dout, long ld_dout,
                     const float* inp, const float* weight, int N, int C, int OC, bool accumulate_dinp) {
  if (dinp)
    for (int n = 0; n < N; n++)
      for (int c = 0; c < C; c++) {
        double acc = accumulate_dinp ? dinp[static_cast<long>(n) * C + c] : 0.0;
        for (int o = 0; o < OC; o++)
          acc += static_cast<double>(dout[n * ld_dout + o]) * weight[static_cast<long>(o) * C + c];
        dinp[static_cast<long>(n) * C + c] = static_cast<float>(acc);
      }
  for (int o = 0; o < OC; o++) {
    for (int c = 0; dweight && c < C; c++) {
      double acc = 0;
      for (int n = 0; n < N; n++) acc += static_cast<double>(dout[n * ld_dout + o]) * inp[static_cast<long>(n) * C + c];
      dweight[static_cast<long>(o) * C + c] += static_cast<float>(acc);
    }
    if (dbias) {
      double acc = 0;
      for (int n = 0; n < N; n++) acc += dout[n * ld_dout + o];
      dbias[o] += static_cast<float>(acc);
    }
  }
}

namespace {
constexpr double kGeluScale = 0.7978845608028654;  // √(2/π)
}

namespace {
// Rotates each pair by the angle t·inv_freq[i] times sign (1: forward, -1: its gradient).
void rope_rotate(float* x, const int32_t* positions, int B, int T, int row_stride, int n_heads, int HS,
                 const RopeFrequencies& freqs, double sign) {
  const int half = HS / 2;
  for (long row = 0; row < static_cast<long>(B) * T; row++) {
    const float t = static_cast<float>(position_of(positions, static_cast<int>(row / T), T, static_cast<int>(row % T)));
    for (int h = 0; h < n_heads; h++) {
      float* v = x + row * row_stride + static_cast<long>(h) * HS;
      for (int i = 0; i < half; i++) {
        const double angle = t * rope_inv_freq(freqs, i, HS);  // the fp32 product
        const double c = std::cos(angle), s = sign * std::sin(angle), a = v[i], b = v[i + half];
        v[i] = static_cast<float>(a * c - b * s);
        v[i + half] = static_cast<float>(b * c + a * s);
      }
    }
  }
}
}  // namespace

void rope_forward(float* x, const int32_t* positions, int B, int T, int row_stride, int n_heads, int HS,
                  const RopeFrequencies& freqs) {
  rope_rotate(x, positions, B, T, row_stride, n_heads, HS, freqs, 1.0);
}
void rope_backward(float* dx, const int32_t* positions, int B, int T, int row_stride, int n_heads, int HS,
                   const RopeFrequencies& freqs) {
  rope_rotate(dx, positions, B, T, row_stride, n_heads, HS, freqs, -1.0);
}

void swiglu_forward(float* out, const float* inp, int N, int F, ComputeDtype d) {
  for (long n = 0; n < N; n++)
    for (long f = 0; f < F; f++) {
      const double g = inp[n * 2 * F + f], u = inp[n * 2 * F + F + f];
      out[n * F + f] = static_cast<float>(g / (1.0 + std::exp(-g)) * u);
    }
  ref::round_to_dtype(out, static_cast<long>(N) * F, d);
}

void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F, ComputeDtype dtype) {
  for (long n = 0; n < N; n++)
    for (long f = 0; f < F; f++) {
      const double g = inp[n * 2 * F + f], u = inp[n * 2 * F + F + f], d = dout[n * F + f];
      const double sig = 1.0 / (1.0 + std::exp(-g));
      dinp[n * 2 * F + f] = static_cast<float>(d * u * sig * (1.0 + g * (1.0 - sig)));
      dinp[n * 2 * F + F + f] = static_cast<float>(d * g * sig);
    }
  ref::round_to_dtype(dinp, 2L * N * F, dtype);
}

void gelu_forward(float* out, const float* inp, long N, GeluForm form, ComputeDtype d) {
  for (long i = 0; i < N; i++) {
    double x = inp[i];
    out[i] = static_cast<float>(form == GeluForm::kErf
                                    ? 0.5 * x * (1.0 + std::erf(x * M_SQRT1_2))
                                    : 0.5 * x * (1.0 + std::tanh(kGeluScale * (x + 0.044715 * x * x * x))));
  }
  ref::round_to_dtype(out, N, d);
}

void gelu_backward(float* dinp, const float* inp, const float* dout, long N, GeluForm form, ComputeDtype d) {
  for (long i = 0; i < N; i++) {
    double x = inp[i];
    if (form == GeluForm::kErf) {  // Φ(x) + x·φ(x)
      const double grad = 0.5 * (1.0 + std::erf(x * M_SQRT1_2)) + x * std::exp(-0.5 * x * x) * 0.5 * M_2_SQRTPI * M_SQRT1_2;
      dinp[i] = static_cast<float>(grad * dout[i]);
      continue;
    }
    double u = kGeluScale * (x + 0.044715 * x * x * x);
    double th = std::tanh(u);
    double du = kGeluScale * (1.0 + 3.0 * 0.044715 * x * x);
    double grad = 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du;
    dinp[i] = static_cast<float>(grad * dout[i]);
  }
  ref::round_to_dtype(dinp, N, d);
}

void dropout_apply(float* out, const float* x, int B, long n, DropoutSite site) {
  const float scale = site.scale();
  for (int b = 0; b < B; b++) {
    const uint64_t stream = dropout_stream(site.key, site.first_sample + b);
    for (long i = 0; i < n; i++) {
      const long k = static_cast<long>(b) * n + i;
      out[k] = dropout_keep(stream, static_cast<uint64_t>(i), site.threshold()) ? x[k] * scale : 0.0f;
    }
  }
}

void residual_forward(float* out, const float* a, const float* b, long N) {
  for (long i = 0; i < N; i++) out[i] = a[i] + b[i];
}

void residual_backward(float* da, float* db, const float* dout, long N) {
  for (long i = 0; i < N; i++) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

void lora_delta_forward(float* out, long ld, const float* delta, int N, int cols, float scale) {
  for (int n = 0; n < N; n++)
    for (int c = 0; c < cols; c++) out[n * ld + c] += scale * delta[static_cast<long>(n) * cols + c];
}

void lora_delta_backward(float* ddelta, const float* dout, long ld, int N, int cols, float scale) {
  for (int n = 0; n < N; n++)
    for (int c = 0; c < cols; c++) ddelta[static_cast<long>(n) * cols + c] = scale * dout[n * ld + c];
}

void copy_columns(float* dst, long ld_dst, long dst_part, const float* src, long ld_src, long src_part, int N, int cols,
                  int parts) {
  for (long p = 0; p < parts; p++)
    for (long n = 0; n < N; n++)
      for (int c = 0; c < cols; c++) dst[p * dst_part + n * ld_dst + c] = src[p * src_part + n * ld_src + c];
}

namespace {
// Where head h's query (part 0), key (1) or value (2) of position t of sequence b starts in a
// fused qkv tensor.
const float* qkv_at(const float* qkv, const AttentionHeads& a, int b, int T, int t, int part, int h) {
  const float* row = qkv + (static_cast<long>(b) * T + t) * a.qkv_channels();
  if (part == 0) return row + h * a.head_size;
  const int kv = h / a.group();
  return row + a.q_channels() + (part - 1) * a.kv_channels() + kv * a.head_size;
}

// Query i's scaled scores against keys 0..i of head h in s, in double.
void score_row(double* s, const float* qkv, const AttentionHeads& a, int b, int T, int h, int i) {
  const int HS = a.head_size;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  const double slope = a.alibi ? alibi_slope(a.layer_head(h), a.layer_heads(), a.alibi_bias_max) : 0.0;
  const float* q = qkv_at(qkv, a, b, T, i, 0, h);
  for (int j = 0; j <= i; j++) {
    const float* k = qkv_at(qkv, a, b, T, j, 1, h);
    double dot = 0;
    for (int d = 0; d < HS; d++) dot += static_cast<double>(q[d]) * k[d];
    s[j] = dot * scale + slope * (j - i);
  }
}

// Keys before query i's example (j < i - p(b,i)) or its window are out of its reach: their scores
// become -inf.
void mask_unseen_keys(double* s, const int32_t* positions, int b, int T, int i, int window) {
  for (int j = 0; j < attention_first_key(positions, b, T, i, window); j++) s[j] = -INFINITY;
}

// p[0..i] = softmax(s[0..i]); returns the log-sum-exp.
double softmax_in_place(double* p, int i) {
  double mx = p[i];  // a query always reaches its own key
  for (int j = 0; j < i; j++) mx = std::max(mx, p[j]);
  double sum = 0;
  for (int j = 0; j <= i; j++) sum += std::exp(p[j] - mx);
  for (int j = 0; j <= i; j++) p[j] = std::exp(p[j] - mx) / sum;
  return mx + std::log(sum);
}

// The attention-dropout factor of P_ij for head h of sequence b: 1 without dropout, else 0 or
// 1/(1-p).
double attention_keep(const AttentionHeads& heads, int b, int T, int h, int i, int j) {
  const DropoutSite& d = heads.dropout;
  if (!d.active()) return 1.0;
  return dropout_keep(dropout_stream(d.key, d.first_sample + b), attention_dropout_index(heads.layer_head(h), i, j, T),
                      d.threshold())
             ? d.scale()
             : 0.0;
}
}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, const int32_t* positions, int B, int T,
                       AttentionHeads heads) {
  const int HS = heads.head_size, C = heads.q_channels();
  std::vector<double> p(T);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < heads.n_heads; h++)
      for (int i = heads.first_query; i < T; i++) {
        score_row(p.data(), qkv, heads, b, T, h, i);
        mask_unseen_keys(p.data(), positions, b, T, i, heads.window);
        lse[(static_cast<long>(b) * heads.n_heads + h) * T + i] = static_cast<float>(softmax_in_place(p.data(), i));
        for (int j = 0; j <= i; j++) p[j] *= attention_keep(heads, b, T, h, i, j);
        float* o = out + (static_cast<long>(b) * T + i) * C + h * HS;
        for (int d = 0; d < HS; d++) {
          double acc = 0;
          for (int j = 0; j <= i; j++) acc += p[j] * qkv_at(qkv, heads, b, T, j, 2, h)[d];
          o[d] = static_cast<float>(acc);
        }
      }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                        const int32_t* positions, int B, int T, AttentionHeads heads) {
  const int HS = heads.head_size, C = heads.q_channels();
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  std::vector<double> p(T), dp(T), grad(static_cast<size_t>(B) * T * heads.qkv_channels());
  // Position t's gradient wrt head h's part, at the offsets of qkv_at.
  auto g = [&](int b, int t, int part, int h) { return &grad[qkv_at(qkv, heads, b, T, t, part, h) - qkv]; };
  for (int b = 0; b < B; b++)
    for (int h = 0; h < heads.n_heads; h++)
      for (int i = 0; i < T; i++) {
        // Rebuild the probability row from the scores, independently of the saved lse.
        score_row(p.data(), qkv, heads, b, T, h, i);
        mask_unseen_keys(p.data(), positions, b, T, i, heads.window);
        softmax_in_place(p.data(), i);
        const float* qi = qkv_at(qkv, heads, b, T, i, 0, h);
        const float* doi = dout + (static_cast<long>(b) * T + i) * C + h * HS;
        // With dropout, out = Σ p_j m_j v_j: the probabilities' gradient is m_j (dO·v_j).
        double pdp = 0;
        for (int j = 0; j <= i; j++) {
          const float* vj = qkv_at(qkv, heads, b, T, j, 2, h);
          double s = 0;
          for (int d = 0; d < HS; d++) s += static_cast<double>(doi[d]) * vj[d];
          dp[j] = s * attention_keep(heads, b, T, h, i, j);
          pdp += p[j] * dp[j];
        }
        for (int j = 0; j <= i; j++) {
          const double ds = p[j] * (dp[j] - pdp) * scale;
          const double kept = p[j] * attention_keep(heads, b, T, h, i, j);
          const float* kj = qkv_at(qkv, heads, b, T, j, 1, h);
          double *dq = g(b, i, 0, h), *dk = g(b, j, 1, h), *dv = g(b, j, 2, h);
          for (int d = 0; d < HS; d++) {
            dq[d] += ds * kj[d];
            dk[d] += ds * qi[d];
            dv[d] += kept * doi[d];
          }
        }
      }
  for (size_t k = 0; k < grad.size(); k++) dqkv[k] = static_cast<float>(grad[k]);
}

namespace {
float rounded_to(float x, ComputeDtype d) {
  if (d == ComputeDtype::kBf16) return bf16_to_float(float_to_bf16(x));
  if (d == ComputeDtype::kFp16) return fp16_to_float(float_to_fp16(x));
  return x;
}
}  // namespace

void crossentropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets,
                          int N, int V, ComputeDtype d) {
  for (int n = 0; n < N; n++) {
    const float* row = logits + static_cast<long>(n) * V;
    auto x = [&](int v) { return static_cast<double>(rounded_to(row[v], d)); };
    double mx = x(0);
    for (int v = 1; v < V; v++) mx = std::max(mx, x(v));
    double sum = 0;
    for (int v = 0; v < V; v++) sum += std::exp(x(v) - mx);
    double l = mx + std::log(sum);
    lse[n] = static_cast<float>(l);
    losses[n] = targets[n] == kIgnoreIndex ? 0.0f : static_cast<float>(l - x(targets[n]));
  }
}

void crossentropy_backward(float* dlogits, const float* logits, const float* lse,
                           const int32_t* targets, float dloss, int N, int V, ComputeDtype d) {
  for (int n = 0; n < N; n++) {
    const float* x = logits + static_cast<long>(n) * V;
    float* dx = dlogits + static_cast<long>(n) * V;
    bool ignored = targets[n] == kIgnoreIndex;
    for (int v = 0; v < V; v++) {
      double p = std::exp(static_cast<double>(rounded_to(x[v], d)) - lse[n]);
      dx[v] = ignored ? 0.0f : rounded_to(static_cast<float>(dloss * (p - (v == targets[n] ? 1.0 : 0.0))), d);
    }
  }
}

void crossentropy_forward_backward(float* losses, float* dlogits, const float* logits,
                                   const int32_t* targets, float dloss, int N, int V, ComputeDtype d) {
  std::vector<float> lse(N);
  ref::crossentropy_forward(losses, lse.data(), logits, targets, N, V, d);
  ref::crossentropy_backward(dlogits, logits, lse.data(), targets, dloss, N, V, d);  // element-wise: aliasing is safe
}

void crossentropy_slice_max(float* maxes, float* picked, const float* logits, const int32_t* targets, int N, int V,
                            ComputeDtype d) {
  for (int n = 0; n < N; n++) {
    const float* x = logits + static_cast<long>(n) * V;
    float mx = rounded_to(x[0], d);
    for (int v = 1; v < V; v++) mx = std::max(mx, rounded_to(x[v], d));
    maxes[n] = mx;
    picked[n] = targets[n] >= 0 && targets[n] < V ? rounded_to(x[targets[n]], d) : -INFINITY;
  }
}

void crossentropy_slice_sums(float* sums, float* exps, const float* logits, const float* shifts, int N, int V,
                             ComputeDtype d) {
  const int NB = (V + kCrossentropySumBlock - 1) / kCrossentropySumBlock;
  for (int n = 0; n < N; n++)
    for (int k = 0; k < NB; k++) {
      double sum = 0;
      for (int v = k * kCrossentropySumBlock; v < std::min(V, (k + 1) * kCrossentropySumBlock); v++) {
        const size_t i = static_cast<size_t>(n) * V + v;
        const double e = std::exp(static_cast<double>(rounded_to(logits[i], d)) - shifts[n]);
        if (exps) exps[i] = static_cast<float>(e);
        sum += e;
      }
      sums[static_cast<size_t>(n) * NB + k] = static_cast<float>(sum);
    }
}

void crossentropy_slice_finish(float* losses, float* lse, float* dlogits, const float* sums, int NB,
                               const float* shifts, const float* picked, const int32_t* targets, float dloss, int N,
                               int V, ComputeDtype d) {
  for (int n = 0; n < N; n++) {
    double sum = 0;
    for (int k = 0; k < NB; k++) sum += sums[static_cast<size_t>(n) * NB + k];
    const double l = shifts[n] + std::log(sum);
    const bool ignored = targets[n] == kIgnoreIndex;
    if (lse) lse[n] = static_cast<float>(l);
    losses[n] = ignored ? 0.0f : static_cast<float>(l - picked[n]);
    if (!dlogits) continue;
    for (int v = 0; v < V; v++) {
      float& dx = dlogits[static_cast<size_t>(n) * V + v];
      dx = ignored ? 0.0f : rounded_to(static_cast<float>(dloss * (dx / sum - (v == targets[n] ? 1.0 : 0.0))), d);
    }
  }
}

void round_to_dtype(float* x, long N, ComputeDtype d) {
  for (long i = 0; i < N; i++) x[i] = rounded_to(x[i], d);
}

void widen_bf16(float* out, const uint16_t* in, long N) {
  for (long i = 0; i < N; i++) out[i] = bf16_to_float(in[i]);
}

}  // namespace anvil::ref

namespace anvil::ref {

namespace {
template <class Gradient>
void adamw(float* p, const Gradient& g, float* m, float* v, size_t n, const AdamWTensor* tensors, int n_tensors,
           const AdamWStep& s) {
  for (int k = 0; k < n_tensors; k++) {
    const AdamWTensor& t = tensors[k];
    for (size_t i = t.offset; i < t.offset + t.count; i++) {
      const float gi = g(i, t) * s.grad_scale;
      p[i] *= t.keep;
      m[i] = s.beta1 * m[i] + (1.0f - s.beta1) * gi;
      v[i] = s.beta2 * v[i] + (1.0f - s.beta2) * gi * gi;
      p[i] -= s.step_size * m[i] / (std::sqrt(v[i]) / s.bc2_sqrt + s.eps);
    }
  }
}
}  // namespace

void adamw_update(float* p, const float* g, float* m, float* v, size_t n, const AdamWTensor* tensors, int n_tensors,
                  const AdamWStep& s) {
  adamw(p, [g](size_t i, const AdamWTensor&) { return g[i]; }, m, v, n, tensors, n_tensors, s);
}

void adamw_update_fixed(float* p, const int64_t* acc, float* m, float* v, size_t n, const AdamWTensor* tensors,
                        int n_tensors, const AdamWStep& s) {
  adamw(p,
        [acc](size_t i, const AdamWTensor& t) {
          return static_cast<float>(std::ldexp(static_cast<double>(acc[i]), -t.exponent));
        },
        m, v, n, tensors, n_tensors, s);
}

double sum_of_squares(const float* x, size_t n) {
  constexpr size_t kChunk = 1 << 16;
  double sum = 0;
  for (size_t lo = 0; lo < n; lo += kChunk) {
    double s = 0;
    for (size_t i = lo; i < std::min(n, lo + kChunk); i++) s += static_cast<double>(x[i]) * x[i];
    sum += s;
  }
  return sum;
}

bool scale_values_check_finite(float* x, size_t n, float coef) {
  bool ok = true;
  for (size_t i = 0; i < n; i++) {
    x[i] *= coef;
    ok = ok && std::isfinite(x[i]);
  }
  return ok;
}

}  // namespace anvil::ref

namespace anvil::ref {

void fixed_point_accumulate(int64_t* acc, float* x_all, size_t n, int copies, size_t stride, int s, float* max_abs,
                            bool clear) {
  for (int c = 0; c < copies; c++)
    for (size_t i = 0; i < n; i++) {
      float* x = x_all + c * stride;
      const float a = std::isnan(x[i]) ? std::numeric_limits<float>::infinity() : std::fabs(x[i]);
      *max_abs = std::max(*max_abs, a);
      // llrint rounds to nearest even in the default rounding mode; the product is exact in double.
      acc[i] = fixed_point_add(acc[i], std::llrint(std::ldexp(static_cast<double>(x[i]), s)));
      if (clear) x[i] = 0.0f;
    }
}

void fixed_point_accumulate_rows(int64_t* acc, float* x, const int32_t* rows, size_t n_rows, size_t row_len, int s,
                                 float* max_abs) {
  for (size_t r = 0; r < n_rows; r++)
    fixed_point_accumulate(acc + static_cast<size_t>(rows[r]) * row_len, x + r * row_len, row_len, 1, 0, s, max_abs,
                           true);
}

void fixed_point_squares(const int64_t* acc, size_t, const size_t* bounds, size_t tensors,
                         unsigned __int128* squares) {
  for (size_t k = 0; k < tensors; k++) {
    unsigned __int128 total = 0;
    for (size_t i = bounds[k]; i < bounds[k + 1]; i++) {
      const unsigned __int128 a = acc[i] < 0 ? 0 - static_cast<uint64_t>(acc[i]) : static_cast<uint64_t>(acc[i]);
      total += (a * a) >> kSquareShift;
    }
    squares[k] = total;
  }
}

void fixed_point_add_arrays(int64_t* acc, const int64_t* x, size_t n) {
  for (size_t i = 0; i < n; i++) acc[i] = fixed_point_add(acc[i], x[i]);
}

void moe_route(float* probs, int32_t* experts, float* weights, const float* logits, int N, int E, int k,
               float norm_p) {
  for (long t = 0; t < N; t++) {
    const float* x = logits + t * E;
    double max = x[0], sum = 0;
    for (int e = 1; e < E; e++) max = std::max(max, static_cast<double>(x[e]));
    for (int e = 0; e < E; e++) sum += std::exp(x[e] - max);
    for (int e = 0; e < E; e++) probs[t * E + e] = static_cast<float>(std::exp(x[e] - max) / sum);
    moe_top_k(experts + t * k, x, E, k);
    double norm = 0;
    for (int j = 0; j < k; j++) norm += std::pow(static_cast<double>(probs[t * E + experts[t * k + j]]), norm_p);
    norm = norm_p > 0 ? std::pow(norm, 1.0 / norm_p) : 1.0;
    for (int j = 0; j < k; j++) weights[t * k + j] = static_cast<float>(probs[t * E + experts[t * k + j]] / norm);
  }
}

void moe_route_backward(float* dlogits, const float* probs, const int32_t* experts, const float* weights,
                        const float* dweights, const float* dprobs, int N, int E, int k, float norm_p) {
  std::vector<double> dp(E);
  for (long t = 0; t < N; t++) {
    const float* p = probs + t * E;
    for (int e = 0; e < E; e++) dp[e] = dprobs ? dprobs[t * E + e] : 0.0;
    // w_j = p_j / n with n the chosen probabilities' p-norm: dp_j = (dw_j - (Σ_i dw_i·w_i)·w_j^(p-1)) / n.
    double dot = 0, norm = 0;
    for (int j = 0; j < k; j++) {
      dot += static_cast<double>(dweights[t * k + j]) * weights[t * k + j];
      norm += std::pow(static_cast<double>(p[experts[t * k + j]]), norm_p);
    }
    norm = norm_p > 0 ? std::pow(norm, 1.0 / norm_p) : 1.0;
    for (int j = 0; j < k; j++) {
      const double w = weights[t * k + j];
      const double through_norm = norm_p > 0 ? dot * std::pow(w, norm_p - 1.0) : 0.0;
      dp[experts[t * k + j]] += (dweights[t * k + j] - through_norm) / norm;
    }
    double s = 0;
    for (int e = 0; e < E; e++) s += p[e] * dp[e];
    for (int e = 0; e < E; e++) dlogits[t * E + e] = static_cast<float>(p[e] * (dp[e] - s));
  }
}

void gather_rows(float* out, const float* inp, const int32_t* rows, long n_rows, int C) {
  for (long r = 0; r < n_rows; r++)
    for (int c = 0; c < C; c++) out[r * C + c] = inp[static_cast<long>(rows[r]) * C + c];
}

void moe_combine(float* out, const float* y, const int32_t* slots, const float* weights, int N, int k, int C,
                 bool accumulate) {
  for (long t = 0; t < N; t++)
    for (int c = 0; c < C; c++) {
      double sum = accumulate ? out[t * C + c] : 0.0;
      for (int j = 0; j < k; j++) {
        const long s = slots[t * k + j];
        if (s >= 0) sum += (weights ? static_cast<double>(weights[t * k + j]) : 1.0) * y[s * C + c];
      }
      out[t * C + c] = static_cast<float>(sum);
    }
}

void moe_combine_backward(float* dy, float* dweights, const float* dout, const float* y, const int32_t* slots,
                          const int32_t* slot_tokens, const int32_t* slot_choices, const float* weights, int N, int k,
                          int C, long S) {
  for (long s = 0; s < S; s++) {
    const long t = slot_tokens[s];
    const float w = weights[t * k + slot_choices[s]];
    for (int c = 0; c < C; c++) dy[s * C + c] = w * dout[t * C + c];
  }
  for (long t = 0; t < N; t++)
    for (int j = 0; j < k; j++) {
      const long s = slots[t * k + j];
      double dot = 0;
      if (s >= 0)
        for (int c = 0; c < C; c++) dot += static_cast<double>(dout[t * C + c]) * y[s * C + c];
      dweights[t * k + j] = static_cast<float>(dot);
    }
}

}  // namespace anvil::ref
