// Causal attention on the GPU as fp32 GEMMs over all heads of a sequence at once (strided
// batches), with the softmax and its gradient in kernels (ops.cu). The (NH, T, T) scores of one
// sequence live in scratch and are recomputed in the backward pass from the saved log-sum-exp, so
// nothing T×T is kept between the passes. The GEMMs multiply in fp32 whatever the matmul operand
// mode: probabilities and score gradients are not 16-bit values.
#include <cmath>

#include "device/device.h"
#include "kernels/attention.h"
#include "kernels/gpu/internal.h"

namespace anvil::gpu {
namespace {

// One sequence's scores, their gradient, and the row sums D.
GpuScratch scores, dscores, delta;
float* floats(GpuScratch& s, size_t n) { return static_cast<float*>(s.get(n * sizeof(float))); }

// In row-major terms (the GEMMs below are column-major, hence the transposes): for each head,
// Q, K, V are (T, HS) with row stride 3C inside qkv and head h at column h·HS.
void scores_forward(float* S, const float* qkv, int T, int C, int NH) {
  const int HS = C / NH;
  // S (T_q, T_k) = Q Kᵀ  <=>  Sᵀ = K · Qᵀ
  gemm_fp32_batched(true, false, T, T, HS, 1.0f, {qkv + C, 3 * C, HS}, {qkv, 3 * C, HS}, 0.0f, S, T,
                    static_cast<long long>(T) * T, NH);
}

}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
  const int HS = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const long long TT = static_cast<long long>(T) * T;
  float* S = floats(scores, static_cast<size_t>(NH) * TT);
  for (int b = 0; b < B; b++) {
    const float* x = qkv + static_cast<size_t>(b) * T * 3 * C;
    scores_forward(S, x, T, C, NH);
    attention_softmax(S, lse + static_cast<size_t>(b) * NH * T, T, NH, scale);
    // out (T_q, HS) = P V  <=>  outᵀ = Vᵀ · Pᵀ
    gemm_fp32_batched(false, false, HS, T, T, 1.0f, {x + 2 * C, 3 * C, HS}, {S, T, TT}, 0.0f,
                      out + static_cast<size_t>(b) * T * C, C, HS, NH);
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int B,
                        int T, int C, int NH) {
  const int HS = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const long long TT = static_cast<long long>(T) * T;
  float* S = floats(scores, static_cast<size_t>(NH) * TT);
  float* dP = floats(dscores, static_cast<size_t>(NH) * TT);
  float* D = floats(delta, static_cast<size_t>(NH) * T);
  for (int b = 0; b < B; b++) {
    const size_t row3 = static_cast<size_t>(b) * T * 3 * C, row = static_cast<size_t>(b) * T * C;
    const float* x = qkv + row3;
    const float* dO = dout + row;
    float* dx = dqkv + row3;
    attention_delta(D, dO, out + row, T, C, NH);
    scores_forward(S, x, T, C, NH);
    // dP (T_q, T_k) = dO Vᵀ  <=>  dPᵀ = V · dOᵀ
    gemm_fp32_batched(true, false, T, T, HS, 1.0f, {x + 2 * C, 3 * C, HS}, {dO, C, HS}, 0.0f, dP, T, TT, NH);
    attention_dsoftmax(S, dP, lse + static_cast<size_t>(b) * NH * T, D, T, NH, scale);  // S = P, dP = scale·dS
    // dQ = dS K  <=>  dQᵀ = Kᵀ · dSᵀ
    gemm_fp32_batched(false, false, HS, T, T, 1.0f, {x + C, 3 * C, HS}, {dP, T, TT}, 0.0f, dx, 3 * C, HS, NH);
    // dK = dSᵀ Q  <=>  dKᵀ = Qᵀ · dS
    gemm_fp32_batched(false, true, HS, T, T, 1.0f, {x, 3 * C, HS}, {dP, T, TT}, 0.0f, dx + C, 3 * C, HS, NH);
    // dV = Pᵀ dO  <=>  dVᵀ = dOᵀ · P
    gemm_fp32_batched(false, true, HS, T, T, 1.0f, {dO, C, HS}, {S, T, TT}, 0.0f, dx + 2 * C, 3 * C, HS, NH);
  }
}

}  // namespace anvil::gpu
