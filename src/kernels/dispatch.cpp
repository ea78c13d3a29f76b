// The one place each op chooses its implementation. Call sites never name ref::, cpu:: or gpu::.
#include <algorithm>

#include "core/error.h"
#include "device/device.h"
#include "kernels/attention.h"
#include "kernels/buffer.h"
#include "kernels/columns.h"
#include "kernels/crossentropy.h"
#include "kernels/dropout.h"
#include "kernels/encoder.h"
#include "kernels/fixed_point.h"
#include "kernels/gelu.h"
#include "kernels/impl.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/moe.h"
#include "kernels/optimizer.h"
#include "kernels/profile.h"
#include "kernels/lora.h"
#include "kernels/residual.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/round.h"
#include "kernels/swiglu.h"

namespace anvil {

void prepare_kernel_impl(KernelImpl impl, int local_rank) {
  if (impl == KernelImpl::kGpu) {
    ANVIL_CHECK(gpu_backend_built(), "kernels=gpu: this anvil was built without a GPU backend; build the "
                "cuda-release or hip-release preset (docs/gpu.md), or use kernels=cpu");
    const size_t n = gpu_devices().size();
    ANVIL_CHECK(n > 0, "kernels=gpu: no GPU is visible to this process; run with kernels=cpu, or on a machine "
                "with a GPU and its driver");
    gpu_select(static_cast<int>(static_cast<size_t>(local_rank) % n));
  }
}

#if defined(ANVIL_GPU)
#define ANVIL_DISPATCH(impl, op, ...)                      \
  const OpProfileScope profile_scope(#op, impl);           \
  return impl == KernelImpl::kRef   ? ref::op(__VA_ARGS__) \
         : impl == KernelImpl::kGpu ? gpu::op(__VA_ARGS__) \
                                    : cpu::op(__VA_ARGS__)
#else  // kGpu cannot be chosen (prepare_kernel_impl refuses it)
#define ANVIL_DISPATCH(impl, op, ...)            \
  const OpProfileScope profile_scope(#op, impl); \
  return impl == KernelImpl::kRef ? ref::op(__VA_ARGS__) : cpu::op(__VA_ARGS__)
#endif

void encoder_forward(KernelImpl impl, float* out, const int32_t* tokens, const int32_t* positions, const float* wte,
                     const float* wpe, int B, int T, int C) {
  ANVIL_DISPATCH(impl, encoder_forward, out, tokens, positions, wte, wpe, B, T, C);
}
void encoder_backward(KernelImpl impl, float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                      const int32_t* positions, int B, int T, int C) {
  ANVIL_DISPATCH(impl, encoder_backward, dwte, dwpe, dout, tokens, positions, B, T, C);
}
void moe_route(KernelImpl impl, float* probs, int32_t* experts, float* weights, const float* logits, int N, int E,
               int k, float norm_p) {
  ANVIL_DISPATCH(impl, moe_route, probs, experts, weights, logits, N, E, k, norm_p);
}
void moe_route_backward(KernelImpl impl, float* dlogits, const float* probs, const int32_t* experts,
                        const float* weights, const float* dweights, const float* dprobs, int N, int E, int k,
                        float norm_p) {
  ANVIL_DISPATCH(impl, moe_route_backward, dlogits, probs, experts, weights, dweights, dprobs, N, E, k, norm_p);
}
void gather_rows(KernelImpl impl, float* out, const float* inp, const int32_t* rows, long n_rows, int C) {
  ANVIL_DISPATCH(impl, gather_rows, out, inp, rows, n_rows, C);
}
void moe_combine(KernelImpl impl, float* out, const float* y, const int32_t* slots, const float* weights, int N, int k,
                 int C, bool accumulate) {
  ANVIL_DISPATCH(impl, moe_combine, out, y, slots, weights, N, k, C, accumulate);
}
void moe_combine_backward(KernelImpl impl, float* dy, float* dweights, const float* dout, const float* y,
                          const int32_t* slots, const int32_t* slot_tokens, const int32_t* slot_choices,
                          const float* weights, int N, int k, int C, long S) {
  ANVIL_DISPATCH(impl, moe_combine_backward, dy, dweights, dout, y, slots, slot_tokens, slot_choices, weights, N, k,
                 C, S);
}
void add_rows(KernelImpl impl, float* dst, const float* x, const int32_t* rows, size_t n_rows, size_t row_len) {
  ANVIL_DISPATCH(impl, add_rows, dst, x, rows, n_rows, row_len);
}
void layernorm_forward(KernelImpl impl, float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C) {
  ANVIL_DISPATCH(impl, layernorm_forward, out, mean, rstd, inp, weight, bias, N, C);
}
void layernorm_backward(KernelImpl impl, float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C) {
  ANVIL_DISPATCH(impl, layernorm_backward, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}
void layernorm_backward_sequences(KernelImpl impl, float* dinp, float* dweight, float* dbias, size_t grads_stride,
                                  const float* dout, const float* inp, const float* weight, const float* mean,
                                  const float* rstd, int B, int T, int C) {
#if defined(ANVIL_GPU)
  if (impl == KernelImpl::kGpu) {
    const OpProfileScope profile_scope("layernorm_backward", impl);  // the same op, over every sequence at once
    return gpu::layernorm_backward_sequences(dinp, dweight, dbias, grads_stride, dout, inp, weight, mean, rstd, B, T,
                                             C);
  }
#endif
  for (int b = 0; b < B; b++) {
    const size_t r = static_cast<size_t>(b) * T, at = b * grads_stride;
    layernorm_backward(impl, dinp + r * C, dweight + at, dbias ? dbias + at : nullptr, dout + r * C, inp + r * C,
                       weight, mean + r, rstd + r, T, C);
  }
}
void rmsnorm_forward(KernelImpl impl, float* out, float* rstd, const float* inp, const float* weight, float eps, int N,
                     int C) {
  ANVIL_DISPATCH(impl, rmsnorm_forward, out, rstd, inp, weight, eps, N, C);
}
void rmsnorm_backward(KernelImpl impl, float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C) {
  ANVIL_DISPATCH(impl, rmsnorm_backward, dinp, dweight, dout, inp, weight, rstd, N, C);
}
void rmsnorm_backward_sequences(KernelImpl impl, float* dinp, float* dweight, size_t grads_stride, const float* dout,
                                const float* inp, const float* weight, const float* rstd, int B, int T, int C) {
#if defined(ANVIL_GPU)
  if (impl == KernelImpl::kGpu) {
    const OpProfileScope profile_scope("rmsnorm_backward", impl);  // the same op, over every sequence at once
    return gpu::rmsnorm_backward_sequences(dinp, dweight, grads_stride, dout, inp, weight, rstd, B, T, C);
  }
#endif
  for (int b = 0; b < B; b++) {
    const size_t r = static_cast<size_t>(b) * T;
    rmsnorm_backward(impl, dinp + r * C, dweight + b * grads_stride, dout + r * C, inp + r * C, weight, rstd + r, T, C);
  }
}
void rmsnorm_weight_sums(KernelImpl impl, double* sums, const float* dout, const float* inp, const float* rstd, int N,
                         int C) {
  ANVIL_DISPATCH(impl, rmsnorm_weight_sums, sums, dout, inp, rstd, N, C);
}
bool matmul_rows_independent(KernelImpl impl) { return impl != KernelImpl::kGpu; }
int matmul_column_block(KernelImpl impl, int columns, int preferred) {
  return impl == KernelImpl::kGpu ? columns : std::min(columns, preferred);
}
double matmul_peak_gflops(KernelImpl impl, ComputeDtype d) {
#if defined(ANVIL_GPU)
  if (impl == KernelImpl::kGpu) return gpu::matmul_peak_gflops(d);
#endif
  return cpu::matmul_peak_gflops(d);
}
std::string matmul_backend_description(KernelImpl impl) {
#if defined(ANVIL_GPU)
  if (impl == KernelImpl::kGpu) return gpu::matmul_backend_description();
#endif
  return cpu::matmul_backend_description();
}
void matmul_forward(MatmulContext& ctx, float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC, bool accumulate) {
  ANVIL_CHECK(!accumulate || !bias, "matmul_forward: a product accumulated into its output takes no bias");
  ANVIL_DISPATCH(ctx.impl(), matmul_forward, ctx, out, inp, weight, bias, N, C, OC, accumulate);
}
void matmul_forward_sequences(MatmulContext& ctx, float* out, const float* inp, const float* weight, const float* bias,
                              int B, int T, int C, int OC) {
#if defined(ANVIL_GPU)
  if (ctx.impl() == KernelImpl::kGpu) {
    const OpProfileScope profile_scope("matmul_forward", ctx.impl());  // the same products, batched
    return gpu::matmul_forward_sequences(ctx, out, inp, weight, bias, B, T, C, OC);
  }
#endif
  matmul_forward(ctx, out, inp, weight, bias, B * T, C, OC);
}
void matmul_backward(MatmulContext& ctx, float* dinp, float* dweight, float* dbias, const float* dout, long ld_dout,
                     const float* inp, const float* weight, int N, int C, int OC, bool accumulate_dinp) {
  ANVIL_CHECK(ld_dout >= OC, "matmul_backward: dout's row stride {} is below its width {}", ld_dout, OC);
  ANVIL_DISPATCH(ctx.impl(), matmul_backward, ctx, dinp, dweight, dbias, dout, ld_dout, inp, weight, N, C, OC,
                 accumulate_dinp);
}
void matmul_backward_sequences(MatmulContext& ctx, float* dinp, float* dweight, float* dbias, size_t grads_stride,
                               const float* dout, const float* inp, const float* weight, int B, int T, int C, int OC,
                               bool write_grads) {
  const size_t span = (dweight ? static_cast<size_t>(OC) * C : 0) + (dbias ? static_cast<size_t>(OC) : 0);
  ANVIL_CHECK(B <= 1 || grads_stride >= span, "matmul_backward_sequences: sequences' gradients of {} values {} apart "
              "overlap", span, grads_stride);
#if defined(ANVIL_GPU)
  if (ctx.impl() == KernelImpl::kGpu) {
    const OpProfileScope profile_scope("matmul_backward", ctx.impl());  // the same products, batched
    return gpu::matmul_backward_sequences(ctx, dinp, dweight, dbias, grads_stride, dout, inp, weight, B, T, C, OC,
                                          write_grads);
  }
#endif
  for (int b = 0; b < B; b++) {
    const size_t rows = static_cast<size_t>(b) * T, at = b * grads_stride;
    if (write_grads) {
      if (dweight) op_zero(ctx.impl(), dweight + at, static_cast<size_t>(OC) * C * sizeof(float));
      if (dbias) op_zero(ctx.impl(), dbias + at, static_cast<size_t>(OC) * sizeof(float));
    }
    matmul_backward(ctx, dinp ? dinp + rows * C : nullptr, dweight ? dweight + at : nullptr,
                    dbias ? dbias + at : nullptr, dout + rows * OC, OC, inp + rows * C, weight, T, C, OC, false);
  }
}
namespace {
void check_rope_shape(int row_stride, int n_heads, int HS) {
  ANVIL_CHECK(HS % 2 == 0 && n_heads * HS <= row_stride, "rope: {} heads of {} channels (an even number) must fit "
              "in rows of {}", n_heads, HS, row_stride);
}
}  // namespace
void rope_forward(KernelImpl impl, float* x, const int32_t* positions, int B, int T, int row_stride, int n_heads,
                  int HS, const RopeFrequencies& freqs) {
  check_rope_shape(row_stride, n_heads, HS);
  ANVIL_DISPATCH(impl, rope_forward, x, positions, B, T, row_stride, n_heads, HS, freqs);
}
void rope_backward(KernelImpl impl, float* dx, const int32_t* positions, int B, int T, int row_stride, int n_heads,
                   int HS, const RopeFrequencies& freqs) {
  check_rope_shape(row_stride, n_heads, HS);
  ANVIL_DISPATCH(impl, rope_backward, dx, positions, B, T, row_stride, n_heads, HS, freqs);
}
void swiglu_forward(KernelImpl impl, float* out, const float* inp, int N, int F, ComputeDtype d) {
  ANVIL_DISPATCH(impl, swiglu_forward, out, inp, N, F, d);
}
void swiglu_backward(KernelImpl impl, float* dinp, const float* inp, const float* dout, int N, int F, ComputeDtype d) {
  ANVIL_DISPATCH(impl, swiglu_backward, dinp, inp, dout, N, F, d);
}
void gelu_forward(KernelImpl impl, float* out, const float* inp, long N, GeluForm form, ComputeDtype d) {
  ANVIL_DISPATCH(impl, gelu_forward, out, inp, N, form, d);
}
void gelu_backward(KernelImpl impl, float* dinp, const float* inp, const float* dout, long N, GeluForm form,
                   ComputeDtype d) {
  ANVIL_DISPATCH(impl, gelu_backward, dinp, inp, dout, N, form, d);
}
void round_to_dtype(KernelImpl impl, float* x, long N, ComputeDtype d) {
  ANVIL_DISPATCH(impl, round_to_dtype, x, N, d);
}
void widen_bf16(KernelImpl impl, float* out, const uint16_t* in, long N) {
  ANVIL_DISPATCH(impl, widen_bf16, out, in, N);
}
void dropout_apply(KernelImpl impl, float* out, const float* x, int B, long n, DropoutSite site) {
  ANVIL_DISPATCH(impl, dropout_apply, out, x, B, n, site);
}
void residual_forward(KernelImpl impl, float* out, const float* a, const float* b, long N) {
  ANVIL_DISPATCH(impl, residual_forward, out, a, b, N);
}
void residual_backward(KernelImpl impl, float* da, float* db, const float* dout, long N) {
  ANVIL_DISPATCH(impl, residual_backward, da, db, dout, N);
}
void lora_delta_forward(KernelImpl impl, float* out, long ld, const float* delta, int N, int cols, float scale) {
  ANVIL_DISPATCH(impl, lora_delta_forward, out, ld, delta, N, cols, scale);
}
void lora_delta_backward(KernelImpl impl, float* ddelta, const float* dout, long ld, int N, int cols, float scale) {
  ANVIL_DISPATCH(impl, lora_delta_backward, ddelta, dout, ld, N, cols, scale);
}
void copy_columns(KernelImpl impl, float* dst, long ld_dst, long dst_part, const float* src, long ld_src, long src_part,
                  int N, int cols, int parts) {
  ANVIL_DISPATCH(impl, copy_columns, dst, ld_dst, dst_part, src, ld_src, src_part, N, cols, parts);
}
namespace {
// A rank's share of a layer's heads (tensor parallelism) is within the layer, and the GPU's kernels
// index the slopes and masks by their own heads alone.
void check_head_share(KernelImpl impl, const AttentionHeads& heads, const char* op) {
  ANVIL_CHECK(heads.first_head >= 0 && heads.first_head + heads.n_heads <= heads.layer_heads(), "{}: heads {}..{} "
              "are not within the layer's {}", op, heads.first_head, heads.first_head + heads.n_heads - 1,
              heads.layer_heads());
  ANVIL_CHECK(impl != KernelImpl::kGpu || (heads.first_head == 0 && heads.layer_heads() == heads.n_heads),
              "{}: the GPU's attention runs a whole layer's heads, not a tensor-parallel share", op);
}
}  // namespace

void attention_forward(KernelImpl impl, float* out, float* lse, const float* qkv, const int32_t* positions, int B,
                       int T, AttentionHeads heads) {
  ANVIL_CHECK(heads.first_query >= 0 && heads.first_query < T, "attention_forward: first_query {} is outside the "
              "sequence's {} rows", heads.first_query, T);
  check_head_share(impl, heads, "attention_forward");
  ANVIL_DISPATCH(impl, attention_forward, out, lse, qkv, positions, B, T, heads);
}
void attention_backward(KernelImpl impl, float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, const int32_t* positions, int B, int T, AttentionHeads heads) {
  ANVIL_CHECK(heads.first_query == 0, "attention_backward: first_query is the forward pass's alone (given {})",
              heads.first_query);
  check_head_share(impl, heads, "attention_backward");
  ANVIL_DISPATCH(impl, attention_backward, dqkv, dout, qkv, out, lse, positions, B, T, heads);
}
void crossentropy_forward(KernelImpl impl, float* losses, float* lse, const float* logits, const int32_t* targets,
                          int N, int V, ComputeDtype d) {
  ANVIL_DISPATCH(impl, crossentropy_forward, losses, lse, logits, targets, N, V, d);
}
void crossentropy_forward_backward(KernelImpl impl, float* losses, float* dlogits, const float* logits,
                                   const int32_t* targets, float dloss, int N, int V, ComputeDtype d) {
  ANVIL_DISPATCH(impl, crossentropy_forward_backward, losses, dlogits, logits, targets, dloss, N, V, d);
}
void crossentropy_slice_max(KernelImpl impl, float* maxes, float* picked, const float* logits, const int32_t* targets,
                            int N, int V, ComputeDtype d) {
  ANVIL_DISPATCH(impl, crossentropy_slice_max, maxes, picked, logits, targets, N, V, d);
}
void crossentropy_slice_sums(KernelImpl impl, float* sums, float* exps, const float* logits, const float* shifts,
                             int N, int V, ComputeDtype d) {
  ANVIL_DISPATCH(impl, crossentropy_slice_sums, sums, exps, logits, shifts, N, V, d);
}
void crossentropy_slice_finish(KernelImpl impl, float* losses, float* lse, float* dlogits, const float* sums, int NB,
                               const float* shifts, const float* picked, const int32_t* targets, float dloss, int N,
                               int V, ComputeDtype d) {
  ANVIL_DISPATCH(impl, crossentropy_slice_finish, losses, lse, dlogits, sums, NB, shifts, picked, targets, dloss, N, V,
                 d);
}

void adamw_update(KernelImpl impl, float* p, const float* g, float* m, float* v, size_t n, const AdamWTensor* tensors,
                  int n_tensors, const AdamWStep& s) {
  ANVIL_DISPATCH(impl, adamw_update, p, g, m, v, n, tensors, n_tensors, s);
}
void adamw_update_fixed(KernelImpl impl, float* p, const int64_t* acc, float* m, float* v, size_t n,
                        const AdamWTensor* tensors, int n_tensors, const AdamWStep& s) {
  ANVIL_DISPATCH(impl, adamw_update_fixed, p, acc, m, v, n, tensors, n_tensors, s);
}
double sum_of_squares(KernelImpl impl, const float* x, size_t n) { ANVIL_DISPATCH(impl, sum_of_squares, x, n); }
bool scale_values_check_finite(KernelImpl impl, float* x, size_t n, float coef) {
  ANVIL_DISPATCH(impl, scale_values_check_finite, x, n, coef);
}

void fixed_point_accumulate(KernelImpl impl, int64_t* acc, float* x, size_t n, int copies, size_t stride, int s,
                            float* max_abs, bool clear) {
  ANVIL_CHECK(copies >= 1 && (copies == 1 || stride >= n), "fixed_point_accumulate: {} copies of {} values {} apart",
              copies, n, stride);
  ANVIL_DISPATCH(impl, fixed_point_accumulate, acc, x, n, copies, stride, s, max_abs, clear);
}
void fixed_point_accumulate_rows(KernelImpl impl, int64_t* acc, float* x, const int32_t* rows, size_t n_rows,
                                 size_t row_len, int s, float* max_abs) {
  ANVIL_DISPATCH(impl, fixed_point_accumulate_rows, acc, x, rows, n_rows, row_len, s, max_abs);
}
void fixed_point_squares(KernelImpl impl, const int64_t* acc, size_t n, const size_t* bounds, size_t tensors,
                         unsigned __int128* squares) {
  ANVIL_DISPATCH(impl, fixed_point_squares, acc, n, bounds, tensors, squares);
}
void fixed_point_add_arrays(KernelImpl impl, int64_t* acc, const int64_t* x, size_t n) {
  ANVIL_DISPATCH(impl, fixed_point_add_arrays, acc, x, n);
}

}  // namespace anvil
