// The one place each op chooses its implementation. Call sites never name ref::, cpu:: or gpu::.
#include <algorithm>

#include "core/error.h"
#include "device/device.h"
#include "kernels/attention.h"
#include "kernels/columns.h"
#include "kernels/crossentropy.h"
#include "kernels/dropout.h"
#include "kernels/encoder.h"
#include "kernels/fixed_point.h"
#include "kernels/gelu.h"
#include "kernels/impl.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/optimizer.h"
#include "kernels/profile.h"
#include "kernels/lora.h"
#include "kernels/residual.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/round.h"
#include "kernels/swiglu.h"

namespace anvil {
namespace {
KernelImpl g_impl = KernelImpl::kCpu;
}

void set_kernel_impl(KernelImpl impl) { g_impl = impl; }
KernelImpl kernel_impl() { return g_impl; }

void select_kernel_impl(KernelImpl impl, int local_rank) {
  if (impl == KernelImpl::kGpu) {
    ANVIL_CHECK(gpu_backend_built(), "kernels=gpu: this anvil was built without a GPU backend; build the "
                "cuda-release or hip-release preset (docs/gpu.md), or use kernels=cpu");
    const size_t n = gpu_devices().size();
    ANVIL_CHECK(n > 0, "kernels=gpu: no GPU is visible to this process; run with kernels=cpu, or on a machine "
                "with a GPU and its driver");
    gpu_select(static_cast<int>(static_cast<size_t>(local_rank) % n));
  }
  g_impl = impl;
}

#if defined(ANVIL_GPU)
#define ANVIL_DISPATCH(op, ...)                                                  \
  const OpProfileScope profile_scope(#op);                                       \
  return g_impl == KernelImpl::kRef   ? ref::op(__VA_ARGS__)                     \
         : g_impl == KernelImpl::kGpu ? gpu::op(__VA_ARGS__)                     \
                                      : cpu::op(__VA_ARGS__)
#else  // kGpu cannot be chosen (select_kernel_impl refuses it)
#define ANVIL_DISPATCH(op, ...)                \
  const OpProfileScope profile_scope(#op);     \
  return g_impl == KernelImpl::kRef ? ref::op(__VA_ARGS__) : cpu::op(__VA_ARGS__)
#endif

void encoder_forward(float* out, const int32_t* tokens, const int32_t* positions, const float* wte, const float* wpe,
                     int B, int T, int C) {
  ANVIL_DISPATCH(encoder_forward, out, tokens, positions, wte, wpe, B, T, C);
}
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, const int32_t* positions,
                      int B, int T, int C) {
  ANVIL_DISPATCH(encoder_backward, dwte, dwpe, dout, tokens, positions, B, T, C);
}
void add_rows(float* dst, const float* x, const int32_t* rows, size_t n_rows, size_t row_len) {
  ANVIL_DISPATCH(add_rows, dst, x, rows, n_rows, row_len);
}
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C) {
  ANVIL_DISPATCH(layernorm_forward, out, mean, rstd, inp, weight, bias, N, C);
}
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C) {
  ANVIL_DISPATCH(layernorm_backward, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, float eps, int N, int C) {
  ANVIL_DISPATCH(rmsnorm_forward, out, rstd, inp, weight, eps, N, C);
}
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C) {
  ANVIL_DISPATCH(rmsnorm_backward, dinp, dweight, dout, inp, weight, rstd, N, C);
}
bool matmul_rows_independent() { return g_impl != KernelImpl::kGpu; }
int matmul_column_block(int columns, int preferred) {
  return g_impl == KernelImpl::kGpu ? columns : std::min(columns, preferred);
}
double matmul_peak_gflops(ComputeDtype d) {
#if defined(ANVIL_GPU)
  if (g_impl == KernelImpl::kGpu) return gpu::matmul_peak_gflops(d);
#endif
  return cpu::matmul_peak_gflops(d);
}
std::string matmul_backend_description() {
#if defined(ANVIL_GPU)
  if (g_impl == KernelImpl::kGpu) return gpu::matmul_backend_description();
#endif
  return cpu::matmul_backend_description();
}
void matmul_forward(MatmulContext& ctx, float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC) {
  ANVIL_DISPATCH(matmul_forward, ctx, out, inp, weight, bias, N, C, OC);
}
void matmul_backward(MatmulContext& ctx, float* dinp, float* dweight, float* dbias, const float* dout, long ld_dout,
                     const float* inp, const float* weight, int N, int C, int OC, bool accumulate_dinp) {
  ANVIL_CHECK(ld_dout >= OC, "matmul_backward: dout's row stride {} is below its width {}", ld_dout, OC);
  ANVIL_DISPATCH(matmul_backward, ctx, dinp, dweight, dbias, dout, ld_dout, inp, weight, N, C, OC, accumulate_dinp);
}
namespace {
void check_rope_shape(int row_stride, int n_heads, int HS) {
  ANVIL_CHECK(HS % 2 == 0 && n_heads * HS <= row_stride, "rope: {} heads of {} channels (an even number) must fit "
              "in rows of {}", n_heads, HS, row_stride);
}
}  // namespace
void rope_forward(float* x, const int32_t* positions, int B, int T, int row_stride, int n_heads, int HS,
                  const RopeFrequencies& freqs) {
  check_rope_shape(row_stride, n_heads, HS);
  ANVIL_DISPATCH(rope_forward, x, positions, B, T, row_stride, n_heads, HS, freqs);
}
void rope_backward(float* dx, const int32_t* positions, int B, int T, int row_stride, int n_heads, int HS,
                   const RopeFrequencies& freqs) {
  check_rope_shape(row_stride, n_heads, HS);
  ANVIL_DISPATCH(rope_backward, dx, positions, B, T, row_stride, n_heads, HS, freqs);
}
void swiglu_forward(float* out, const float* inp, int N, int F, ComputeDtype d) {
  ANVIL_DISPATCH(swiglu_forward, out, inp, N, F, d);
}
void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F, ComputeDtype d) {
  ANVIL_DISPATCH(swiglu_backward, dinp, inp, dout, N, F, d);
}
void gelu_forward(float* out, const float* inp, long N, GeluForm form, ComputeDtype d) {
  ANVIL_DISPATCH(gelu_forward, out, inp, N, form, d);
}
void gelu_backward(float* dinp, const float* inp, const float* dout, long N, GeluForm form, ComputeDtype d) {
  ANVIL_DISPATCH(gelu_backward, dinp, inp, dout, N, form, d);
}
void round_to_dtype(float* x, long N, ComputeDtype d) { ANVIL_DISPATCH(round_to_dtype, x, N, d); }
void widen_bf16(float* out, const uint16_t* in, long N) { ANVIL_DISPATCH(widen_bf16, out, in, N); }
void dropout_apply(float* out, const float* x, int B, long n, DropoutSite site) {
  ANVIL_DISPATCH(dropout_apply, out, x, B, n, site);
}
void residual_forward(float* out, const float* a, const float* b, long N) {
  ANVIL_DISPATCH(residual_forward, out, a, b, N);
}
void residual_backward(float* da, float* db, const float* dout, long N) {
  ANVIL_DISPATCH(residual_backward, da, db, dout, N);
}
void lora_delta_forward(float* out, long ld, const float* delta, int N, int cols, float scale) {
  ANVIL_DISPATCH(lora_delta_forward, out, ld, delta, N, cols, scale);
}
void lora_delta_backward(float* ddelta, const float* dout, long ld, int N, int cols, float scale) {
  ANVIL_DISPATCH(lora_delta_backward, ddelta, dout, ld, N, cols, scale);
}
void copy_columns(float* dst, long ld_dst, const float* src, long ld_src, int N, int cols) {
  ANVIL_DISPATCH(copy_columns, dst, ld_dst, src, ld_src, N, cols);
}
void attention_forward(float* out, float* lse, const float* qkv, const int32_t* positions, int B, int T,
                       AttentionHeads heads) {
  ANVIL_DISPATCH(attention_forward, out, lse, qkv, positions, B, T, heads);
}
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                        const int32_t* positions, int B, int T, AttentionHeads heads) {
  ANVIL_DISPATCH(attention_backward, dqkv, dout, qkv, out, lse, positions, B, T, heads);
}
void crossentropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets,
                          int N, int V, ComputeDtype d) {
  ANVIL_DISPATCH(crossentropy_forward, losses, lse, logits, targets, N, V, d);
}
void crossentropy_forward_backward(float* losses, float* dlogits, const float* logits,
                                   const int32_t* targets, float dloss, int N, int V, ComputeDtype d) {
  ANVIL_DISPATCH(crossentropy_forward_backward, losses, dlogits, logits, targets, dloss, N, V, d);
}

void adamw_update(float* p, const float* g, float* m, float* v, size_t n, const AdamWTensor* tensors, int n_tensors,
                  const AdamWStep& s) {
  ANVIL_DISPATCH(adamw_update, p, g, m, v, n, tensors, n_tensors, s);
}
void adamw_update_fixed(float* p, const int64_t* acc, float* m, float* v, size_t n, const AdamWTensor* tensors,
                        int n_tensors, const AdamWStep& s) {
  ANVIL_DISPATCH(adamw_update_fixed, p, acc, m, v, n, tensors, n_tensors, s);
}
double sum_of_squares(const float* x, size_t n) { ANVIL_DISPATCH(sum_of_squares, x, n); }
bool scale_values_check_finite(float* x, size_t n, float coef) {
  ANVIL_DISPATCH(scale_values_check_finite, x, n, coef);
}


void fixed_point_accumulate(int64_t* acc, float* x, size_t n, int s, float* max_abs) {
  ANVIL_DISPATCH(fixed_point_accumulate, acc, x, n, s, max_abs);
}
void fixed_point_accumulate_rows(int64_t* acc, float* x, const int32_t* rows, size_t n_rows, size_t row_len, int s,
                                 float* max_abs) {
  ANVIL_DISPATCH(fixed_point_accumulate_rows, acc, x, rows, n_rows, row_len, s, max_abs);
}
void fixed_point_squares(const int64_t* acc, size_t n, unsigned __int128* squares) {
  ANVIL_DISPATCH(fixed_point_squares, acc, n, squares);
}
void fixed_point_add_arrays(int64_t* acc, const int64_t* x, size_t n) {
  ANVIL_DISPATCH(fixed_point_add_arrays, acc, x, n);
}

}  // namespace anvil
