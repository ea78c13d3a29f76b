// Every GPU op against the scalar reference (the same contracts as the CPU kernels' tests, in
// tests/kernels/test_ops.cpp), at the tolerances of tests/compare.h; and the properties the GPU
// backend promises: results that repeat bit for bit, and no device allocation once warm.
// Without a GPU every test skips and says so. The CPU build runs them too, on the emulated
// runtime and BLAS (src/device/emulation.h, blas_emulation.h): the kernels' logic, in 32- and
// 64-lane warps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "compare.h"
#include "core/rng.h"
#include "device/device.h"
#include "kernels/attention.h"
#include "kernels/crossentropy.h"
#include "kernels/encoder.h"
#include "kernels/fixed_point.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/optimizer.h"
#include "kernels/residual.h"
#include "kernels/round.h"

namespace anvil {
namespace {
using testing::all_close;
using testing::kBf16Rounded;
using testing::kFp16Rounded;
using testing::kFp32Elementwise;
using testing::kFp32Reduction;
using testing::kFp32RelNorm;
using testing::randn;
using testing::rel_norm_close;


// A device copy of a host vector, read back with host().
template <class T>
class Dev {
 public:
  explicit Dev(const std::vector<T>& h) : n_(h.size()) {
    p_ = static_cast<T*>(gpu_alloc(std::max<size_t>(1, n_) * sizeof(T)));
    gpu_copy_to_device(p_, h.data(), n_ * sizeof(T));
  }
  ~Dev() { gpu_release(p_); }
  T* get() { return p_; }
  std::vector<T> host() const {
    std::vector<T> h(n_);
    gpu_copy_to_host(h.data(), p_, n_ * sizeof(T));
    return h;
  }

 private:
  T* p_;
  size_t n_;
};

class GpuOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (gpu_devices().empty())
      GTEST_SKIP() << "no GPU visible (" << gpu_backend_description() << "): the GPU op tests need one";
    gpu_select(0);
  }
};

TEST_F(GpuOps, EncoderMatchesReference) {
  struct Shape { int B, T, C, V; };
  for (Shape s : {Shape{1, 1, 1, 3}, Shape{2, 5, 7, 11}, Shape{3, 17, 33, 4}, Shape{4, 64, 768, 50257}}) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C);
    std::vector<int32_t> tokens(s.B * s.T);
    for (size_t i = 0; i < tokens.size(); i++) tokens[i] = static_cast<int32_t>((i * 7 + 3) % s.V);
    auto wte = randn(static_cast<size_t>(s.V) * s.C, 1), wpe = randn(s.T * s.C, 2), dout = randn(s.B * s.T * s.C, 3);
    std::vector<float> out_ref(s.B * s.T * s.C, 0.0f);
    ref::encoder_forward(out_ref.data(), tokens.data(), wte.data(), wpe.data(), s.B, s.T, s.C);
    Dev<int32_t> d_tokens(tokens);
    Dev<float> d_wte(wte), d_wpe(wpe), d_dout(dout), d_out(std::vector<float>(out_ref.size(), NAN));
    gpu::encoder_forward(d_out.get(), d_tokens.get(), d_wte.get(), d_wpe.get(), s.B, s.T, s.C);
    EXPECT_TRUE(all_close(d_out.host().data(), out_ref.data(), out_ref.size(), kFp32Elementwise));
    auto dwte = randn(wte.size(), 4), dwpe = randn(wpe.size(), 5);  // += onto these
    Dev<float> d_dwte(dwte), d_dwpe(dwpe);
    ref::encoder_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), s.B, s.T, s.C);
    gpu::encoder_backward(d_dwte.get(), d_dwpe.get(), d_dout.get(), d_tokens.get(), s.B, s.T, s.C);
    EXPECT_TRUE(all_close(d_dwte.host().data(), dwte.data(), dwte.size(), kFp32Elementwise));
    EXPECT_TRUE(all_close(d_dwpe.host().data(), dwpe.data(), dwpe.size(), kFp32Elementwise));
  }
}

// Compact rows added into a table (the model's token-embedding gradient): each element one fp32
// addition, so the GPU gives the reference's bits; more rows than the grid's y extent.
TEST_F(GpuOps, AddRowsMatchesReferenceBitForBit) {
  const int V = 140000, C = 5;
  std::vector<int32_t> rows;
  for (int v = V - 1; v >= 0; v -= 2) rows.push_back(v);  // 70000 rows, descending
  std::vector<float> table = randn(V * C, 1);
  const std::vector<float> x = randn(rows.size() * C, 2);
  Dev<float> d_table(table), d_x(x);
  Dev<int32_t> d_rows(rows);
  ref::add_rows(table.data(), x.data(), rows.data(), rows.size(), C);
  gpu::add_rows(d_table.get(), d_x.get(), d_rows.get(), rows.size(), C);
  EXPECT_EQ(d_table.host(), table);
}

TEST_F(GpuOps, LayerNormMatchesReference) {
  struct Shape { int N, C; };
  for (Shape s : {Shape{1, 1}, Shape{5, 7}, Shape{33, 64}, Shape{17, 768}, Shape{1000, 1024}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " C=" << s.C);
    auto inp = randn(s.N * s.C, 1, 2.0f), w = randn(s.C, 2), b = randn(s.C, 3), dout = randn(s.N * s.C, 4);
    std::vector<float> out(inp.size()), m(s.N), r(s.N);
    ref::layernorm_forward(out.data(), m.data(), r.data(), inp.data(), w.data(), b.data(), s.N, s.C);
    Dev<float> d_inp(inp), d_w(w), d_b(b), d_dout(dout), d_out(std::vector<float>(out.size(), NAN)),
        d_m(std::vector<float>(s.N, NAN)), d_r(std::vector<float>(s.N, NAN));
    gpu::layernorm_forward(d_out.get(), d_m.get(), d_r.get(), d_inp.get(), d_w.get(), d_b.get(), s.N, s.C);
    EXPECT_TRUE(all_close(d_out.host().data(), out.data(), out.size(), kFp32Reduction));
    EXPECT_TRUE(all_close(d_m.host().data(), m.data(), s.N, kFp32Reduction));
    EXPECT_TRUE(all_close(d_r.host().data(), r.data(), s.N, kFp32Reduction));
    auto dinp = randn(inp.size(), 5), dw = randn(s.C, 6), db = randn(s.C, 7);
    Dev<float> d_dinp(dinp), d_dw(dw), d_db(db), d_mr(m), d_rr(r);
    ref::layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), m.data(), r.data(),
                            s.N, s.C);
    gpu::layernorm_backward(d_dinp.get(), d_dw.get(), d_db.get(), d_dout.get(), d_inp.get(), d_w.get(), d_mr.get(),
                            d_rr.get(), s.N, s.C);
    EXPECT_TRUE(all_close(d_dinp.host().data(), dinp.data(), dinp.size(), kFp32Reduction));
    EXPECT_TRUE(all_close(d_dw.host().data(), dw.data(), s.C, kFp32Reduction));
    EXPECT_TRUE(all_close(d_db.host().data(), db.data(), s.C, kFp32Reduction));
  }
}

// fp32 operands with fp32 compute, and bf16-valued operands through the bf16 tensor-core mode
// that the operand dtype allows: exact products, so the same tolerance holds.
TEST_F(GpuOps, MatmulMatchesReference) {
  struct Shape { int N, C, OC; bool bias; };
  for (ComputeDtype dtype : {ComputeDtype::kFp32, ComputeDtype::kBf16, ComputeDtype::kFp16}) {
    for (Shape s : {Shape{1, 1, 1, true}, Shape{3, 5, 7, true}, Shape{17, 33, 65, false}, Shape{64, 96, 130, true},
                    Shape{1, 256, 1000, false}, Shape{64, 768, 2304, true}, Shape{8, 768, 50257, false}}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " N=" << s.N << " C=" << s.C << " OC=" << s.OC
                                        << " bias=" << s.bias);
      auto inp = randn(s.N * s.C, 1), w = randn(static_cast<size_t>(s.OC) * s.C, 2, 0.1f), b = randn(s.OC, 3),
           dout = randn(static_cast<size_t>(s.N) * s.OC, 4);
      for (auto* v : {&inp, &w, &b, &dout}) ref::round_to_dtype(v->data(), static_cast<long>(v->size()), dtype);
      const float* bias = s.bias ? b.data() : nullptr;
      std::vector<float> out(static_cast<size_t>(s.N) * s.OC);
      ref::matmul_forward(out.data(), inp.data(), w.data(), bias, s.N, s.C, s.OC);
      Dev<float> d_inp(inp), d_w(w), d_b(b), d_dout(dout), d_out(std::vector<float>(out.size(), NAN));
      gpu::matmul_forward(dtype, d_out.get(), d_inp.get(), d_w.get(), s.bias ? d_b.get() : nullptr, s.N, s.C, s.OC);
      EXPECT_TRUE(rel_norm_close(d_out.host().data(), out.data(), out.size(), kFp32RelNorm));
      std::vector<float> dinp(inp.size());
      auto dw = randn(w.size(), 5), db = randn(s.OC, 6);
      Dev<float> d_dinp(std::vector<float>(inp.size(), NAN)), d_dw(dw), d_db(db);
      ref::matmul_backward(dinp.data(), dw.data(), s.bias ? db.data() : nullptr, dout.data(), s.OC, inp.data(),
                           w.data(), s.N, s.C, s.OC, false);
      gpu::matmul_backward(dtype, d_dinp.get(), d_dw.get(), s.bias ? d_db.get() : nullptr, d_dout.get(), s.OC,
                           d_inp.get(), d_w.get(), s.N, s.C, s.OC, false);
      EXPECT_TRUE(rel_norm_close(d_dinp.host().data(), dinp.data(), dinp.size(), kFp32RelNorm));
      EXPECT_TRUE(rel_norm_close(d_dw.host().data(), dw.data(), dw.size(), kFp32RelNorm));
      EXPECT_TRUE(all_close(d_db.host().data(), db.data(), s.OC, kFp32Reduction));
    }
  }
}

// dout as a block of columns of a wider matrix, the input gradient accumulated over the blocks
// (the LM head's vocabulary chunks), with a bias.
TEST_F(GpuOps, MatmulBackwardOnColumnBlocksMatchesReference) {
  const int N = 64, C = 96, OC = 1000, chunk = 256;
  auto inp = randn(N * C, 1), w = randn(OC * C, 2, 0.1f), dout = randn(N * OC, 4);
  std::vector<float> dinp(N * C), dw(w.size(), 0.0f), db(OC, 0.0f);
  Dev<float> d_inp(inp), d_w(w), d_dout(dout), d_dinp(std::vector<float>(N * C, NAN)), d_dw(dw), d_db(db);
  for (int o0 = 0; o0 < OC; o0 += chunk) {
    const int width = std::min(chunk, OC - o0);
    const size_t rows = static_cast<size_t>(o0) * C;
    ref::matmul_backward(dinp.data(), dw.data() + rows, db.data() + o0, dout.data() + o0, OC, inp.data(),
                         w.data() + rows, N, C, width, o0 > 0);
    gpu::matmul_backward(ComputeDtype::kFp32, d_dinp.get(), d_dw.get() + rows, d_db.get() + o0, d_dout.get() + o0, OC,
                         d_inp.get(), d_w.get() + rows, N, C, width, o0 > 0);
  }
  EXPECT_TRUE(rel_norm_close(d_dinp.host().data(), dinp.data(), dinp.size(), kFp32RelNorm));
  EXPECT_TRUE(rel_norm_close(d_dw.host().data(), dw.data(), dw.size(), kFp32RelNorm));
  EXPECT_TRUE(all_close(d_db.host().data(), db.data(), OC, kFp32Reduction));
}

TEST_F(GpuOps, ElementwiseMatchReference) {
  for (long n : {1L, 7L, 1000L, 1L << 20}) {
    SCOPED_TRACE(::testing::Message() << "N=" << n);
    auto x = randn(n, 1, 3.0f), y = randn(n, 2), dout = randn(n, 3);
    std::vector<float> out(n);
    Dev<float> d_x(x), d_y(y), d_dout(dout), d_out(std::vector<float>(n, NAN));
    ref::gelu_forward(out.data(), x.data(), n);
    gpu::gelu_forward(d_out.get(), d_x.get(), n);
    EXPECT_TRUE(all_close(d_out.host().data(), out.data(), n, kFp32Elementwise));
    ref::gelu_backward(out.data(), x.data(), dout.data(), n);
    gpu::gelu_backward(d_out.get(), d_x.get(), d_dout.get(), n);
    EXPECT_TRUE(all_close(d_out.host().data(), out.data(), n, kFp32Elementwise));
    ref::residual_forward(out.data(), x.data(), y.data(), n);
    gpu::residual_forward(d_out.get(), d_x.get(), d_y.get(), n);
    EXPECT_TRUE(all_close(d_out.host().data(), out.data(), n, kFp32Elementwise));
    auto da = randn(n, 4), db = randn(n, 5);
    Dev<float> d_da(da), d_db(db);
    ref::residual_backward(da.data(), db.data(), dout.data(), n);
    gpu::residual_backward(d_da.get(), d_db.get(), d_dout.get(), n);
    EXPECT_TRUE(all_close(d_da.host().data(), da.data(), n, kFp32Elementwise));
    EXPECT_TRUE(all_close(d_db.host().data(), db.data(), n, kFp32Elementwise));
    // AdamW with clipping folded in; the gradient stays as it was.
    auto p = randn(n, 6), m = randn(n, 7, 0.1f), v = randn(n, 8);
    for (float& e : v) e = e * e;  // a second moment is not negative
    Dev<float> d_p(p), d_m(m), d_v(v);
    const AdamWStep step{0.9f, 0.95f, 1e-8f, 1e-3f, 0.3f, 0.999f, 0.25f};
    ref::adamw_update(p.data(), dout.data(), m.data(), v.data(), n, step);
    gpu::adamw_update(d_p.get(), d_dout.get(), d_m.get(), d_v.get(), n, step);
    EXPECT_TRUE(all_close(d_p.host().data(), p.data(), n, kFp32Elementwise));
    EXPECT_TRUE(all_close(d_m.host().data(), m.data(), n, kFp32Elementwise));
    EXPECT_TRUE(all_close(d_v.host().data(), v.data(), n, kFp32Elementwise));
    EXPECT_EQ(d_dout.host(), dout);
  }
}

// Rounding is exact: the GPU gives the reference's bits, over normal, subnormal, overflowing,
// tie and NaN inputs.
TEST_F(GpuOps, RoundingMatchesReferenceBitForBit) {
  std::vector<float> x = randn(1 << 16, 1, 100.0f);
  for (float v : {0.0f, -0.0f, 1e-8f, 6e-8f, 3e-5f, 65519.0f, 65520.0f, 1e30f, INFINITY, NAN, 1.00390625f,
                  1.01171875f})
    x.push_back(v);
  for (size_t i = 0; i < 4096; i++) x.push_back(x[i] * 1e-6f);
  for (ComputeDtype d : {ComputeDtype::kBf16, ComputeDtype::kFp16}) {
    std::vector<float> want = x;
    ref::round_to_dtype(want.data(), static_cast<long>(want.size()), d);
    Dev<float> d_x(x);
    gpu::round_to_dtype(d_x.get(), static_cast<long>(x.size()), d);
    const std::vector<float> got = d_x.host();
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0) << dtype_name(d);
  }
}

TEST_F(GpuOps, AttentionMatchesReference) {
  struct Shape { int B, T, C, NH; };
  for (Shape s : {Shape{1, 1, 4, 1}, Shape{1, 5, 8, 2}, Shape{2, 33, 16, 1}, Shape{2, 70, 24, 3}, Shape{1, 64, 32, 4},
                  Shape{1, 100, 128, 2}, Shape{2, 256, 768, 12}, Shape{1, 129, 256, 1}}) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " NH=" << s.NH);
    auto qkv = randn(s.B * s.T * 3 * s.C, 1), dout = randn(s.B * s.T * s.C, 2);
    std::vector<float> out(s.B * s.T * s.C), lse(s.B * s.NH * s.T);
    ref::attention_forward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    Dev<float> d_qkv(qkv), d_dout(dout), d_out(std::vector<float>(out.size(), NAN)),
        d_lse(std::vector<float>(lse.size(), NAN));
    gpu::attention_forward(d_out.get(), d_lse.get(), d_qkv.get(), s.B, s.T, s.C, s.NH);
    EXPECT_TRUE(all_close(d_out.host().data(), out.data(), out.size(), kFp32Reduction));
    EXPECT_TRUE(all_close(d_lse.host().data(), lse.data(), lse.size(), kFp32Reduction));
    std::vector<float> dqkv(qkv.size());
    ref::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B, s.T, s.C, s.NH);
    Dev<float> d_outr(out), d_lser(lse), d_dqkv(std::vector<float>(qkv.size(), NAN));  // must be overwritten
    gpu::attention_backward(d_dqkv.get(), d_dout.get(), d_qkv.get(), d_outr.get(), d_lser.get(), s.B, s.T, s.C, s.NH);
    const std::vector<float> got = d_dqkv.host();
    EXPECT_TRUE(rel_norm_close(got.data(), dqkv.data(), dqkv.size(), kFp32RelNorm));
    EXPECT_TRUE(all_close(got.data(), dqkv.data(), dqkv.size(), kFp32Reduction));
  }
}

// In fp32 and with the amp rounding of logits and gradient in bf16 and fp16.
TEST_F(GpuOps, CrossEntropyMatchesReferenceWithIgnoredTargets) {
  struct Shape { int N, V; };
  for (ComputeDtype dt : {ComputeDtype::kFp32, ComputeDtype::kBf16, ComputeDtype::kFp16})
  for (Shape s : {Shape{1, 1}, Shape{3, 5}, Shape{17, 1000}, Shape{64, 50257}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " V=" << s.V << " dtype " << static_cast<int>(dt));
    const testing::Tolerance gradient = dt == ComputeDtype::kBf16   ? kBf16Rounded
                               : dt == ComputeDtype::kFp16 ? kFp16Rounded
                                                           : kFp32Elementwise;
    auto logits = randn(s.N * static_cast<size_t>(s.V), 1, 3.0f);
    std::vector<int32_t> targets(s.N);
    for (int n = 0; n < s.N; n++) targets[n] = (n % 3 == 1) ? kIgnoreIndex : (n * 31 + 7) % s.V;
    std::vector<float> l(s.N), lse(s.N), d(logits.size());
    ref::crossentropy_forward(l.data(), lse.data(), logits.data(), targets.data(), s.N, s.V, dt);
    ref::crossentropy_forward_backward(l.data(), d.data(), logits.data(), targets.data(), 0.25f, s.N, s.V, dt);
    Dev<float> d_logits(logits), d_l(std::vector<float>(s.N, NAN)), d_lse(std::vector<float>(s.N, NAN));
    Dev<int32_t> d_t(targets);
    gpu::crossentropy_forward(d_l.get(), d_lse.get(), d_logits.get(), d_t.get(), s.N, s.V, dt);
    EXPECT_TRUE(all_close(d_l.host().data(), l.data(), s.N, kFp32Reduction));
    EXPECT_TRUE(all_close(d_lse.host().data(), lse.data(), s.N, kFp32Reduction));
    // The training form in place over the logits, as the model uses it.
    Dev<float> d_l2(std::vector<float>(s.N, NAN));
    gpu::crossentropy_forward_backward(d_l2.get(), d_logits.get(), d_logits.get(), d_t.get(), 0.25f, s.N, s.V, dt);
    EXPECT_TRUE(all_close(d_l2.host().data(), l.data(), s.N, kFp32Reduction));
    EXPECT_TRUE(all_close(d_logits.host().data(), d.data(), d.size(), gradient));
  }
}

// Deterministic training's sums on the GPU: every integer, maximum, float and 128-bit sum of
// squares identical to the reference, so that CPU and GPU ranks hold the same fixed-point values.
TEST_F(GpuOps, FixedPointMatchesReferenceBitForBit) {
  const size_t rows = 300, row_len = 769, n = rows * row_len;  // odd sizes: partial blocks
  std::vector<float> x = randn(n, 31);
  for (float& v : x) v *= 0.01f;
  x[12345] = 0.75f;  // the largest
  std::vector<int32_t> touched;
  for (int r = 0; r < static_cast<int>(rows); r += 7) touched.push_back(r);
  const int s = fixed_point_scale(0.75f, 64);
  std::vector<int64_t> acc(n);
  for (size_t i = 0; i < n; i++) acc[i] = static_cast<int64_t>(i * 977) - 5000000;
  Dev<int64_t> d_acc(acc);
  Dev<float> d_x(x), d_max(std::vector<float>{0.0f}), d_max_rows(std::vector<float>{0.0f});
  Dev<int32_t> d_rows(touched);
  float max_rows = 0.0f, max_all = 0.0f;
  std::vector<float> x_ref = x;
  ref::fixed_point_accumulate_rows(acc.data(), x_ref.data(), touched.data(), touched.size(), row_len, s, &max_rows);
  gpu::fixed_point_accumulate_rows(d_acc.get(), d_x.get(), d_rows.get(), touched.size(), row_len, s, d_max_rows.get());
  EXPECT_EQ(d_x.host(), x_ref);
  EXPECT_EQ(d_max_rows.host()[0], max_rows);
  x_ref = x;
  Dev<float> d_x2(x);
  ref::fixed_point_accumulate(acc.data(), x_ref.data(), n, s, &max_all);
  gpu::fixed_point_accumulate(d_acc.get(), d_x2.get(), n, s, d_max.get());
  EXPECT_EQ(d_acc.host(), acc);
  EXPECT_EQ(d_x2.host(), std::vector<float>(n, 0.0f));
  EXPECT_EQ(d_max.host()[0], max_all);
  EXPECT_EQ(max_all, 0.75f);

  std::vector<int64_t> twice = acc;
  Dev<int64_t> d_twice(twice);
  ref::fixed_point_add_arrays(twice.data(), acc.data(), n);
  gpu::fixed_point_add_arrays(d_twice.get(), d_acc.get(), n);
  EXPECT_EQ(d_twice.host(), twice);

  for (size_t len : {size_t{0}, size_t{1}, size_t{1000}, n}) {
    unsigned __int128 want = 0;
    ref::fixed_point_squares(twice.data(), len, &want);
    Dev<unsigned __int128> d_sum(std::vector<unsigned __int128>{123});
    gpu::fixed_point_squares(d_twice.get(), len, d_sum.get());
    EXPECT_TRUE(d_sum.host()[0] == want) << "length " << len;
  }

  // AdamW reading the fixed-point gradient (the GPU may contract the moments' updates into
  // fused multiply-adds, as in adamw_update's test).
  std::vector<float> p(n, 1.0f), m(n, 0.1f), v(n, 0.01f);
  Dev<float> d_p(p), d_m(m), d_v(v);
  const AdamWStep step{0.9f, 0.95f, 1e-8f, 1e-3f, 0.3f, 0.999f, 0.25f};
  ref::adamw_update_fixed(p.data(), twice.data(), s, m.data(), v.data(), n, step);
  gpu::adamw_update_fixed(d_p.get(), d_twice.get(), s, d_m.get(), d_v.get(), n, step);
  EXPECT_TRUE(all_close(d_p.host().data(), p.data(), n, kFp32Elementwise));
  EXPECT_TRUE(all_close(d_m.host().data(), m.data(), n, kFp32Elementwise));
  EXPECT_TRUE(all_close(d_v.host().data(), v.data(), n, kFp32Elementwise));

  // A NaN is infinity in the maximum.
  Dev<float> d_nan(std::vector<float>{1.0f, std::nanf(""), -2.0f}), d_nan_max(std::vector<float>{0.0f});
  Dev<int64_t> d_nan_acc(std::vector<int64_t>(3, 0));
  gpu::fixed_point_accumulate(d_nan_acc.get(), d_nan.get(), 3, 0, d_nan_max.get());
  EXPECT_TRUE(std::isinf(d_nan_max.host()[0]));
}

// No atomics anywhere: the same inputs give the same bits, run after run.
TEST_F(GpuOps, RepeatBitForBit) {
  const int B = 2, T = 200, C = 256, NH = 4, N = B * T;
  auto qkv = randn(static_cast<size_t>(N) * 3 * C, 1), dout = randn(static_cast<size_t>(N) * C, 2),
       w = randn(static_cast<size_t>(3 * C) * C, 3, 0.05f);
  std::vector<std::vector<float>> first;
  for (int run = 0; run < 3; run++) {
    Dev<float> d_qkv(qkv), d_dout(dout), d_w(w), d_out(std::vector<float>(N * C)), d_lse(std::vector<float>(B * NH * T)),
        d_dqkv(std::vector<float>(qkv.size())), d_dw(std::vector<float>(w.size(), 0.0f)),
        d_dinp(std::vector<float>(static_cast<size_t>(N) * C)), d_dln(std::vector<float>(C, 0.0f)),
        d_dlnb(std::vector<float>(C, 0.0f)), d_m(std::vector<float>(N, 0.0f)), d_r(std::vector<float>(N, 0.0f));
    gpu::attention_forward(d_out.get(), d_lse.get(), d_qkv.get(), B, T, C, NH);
    gpu::attention_backward(d_dqkv.get(), d_dout.get(), d_qkv.get(), d_out.get(), d_lse.get(), B, T, C, NH);
    gpu::matmul_backward(ComputeDtype::kFp32, d_dinp.get(), d_dw.get(), nullptr, d_dqkv.get(), 3 * C, d_out.get(),
                         d_w.get(), N, C, 3 * C, false);
    gpu::layernorm_forward(d_out.get(), d_m.get(), d_r.get(), d_dinp.get(), d_dln.get(), d_dlnb.get(), N, C);
    gpu::layernorm_backward(d_dinp.get(), d_dln.get(), d_dlnb.get(), d_dout.get(), d_out.get(), d_w.get(), d_m.get(),
                            d_r.get(), N, C);
    std::vector<std::vector<float>> now = {d_dqkv.host(), d_dw.host(), d_dinp.host(), d_dln.host(), d_dlnb.host()};
    if (run == 0) {
      first = now;
      continue;
    }
    for (size_t k = 0; k < now.size(); k++)
      EXPECT_EQ(std::memcmp(now[k].data(), first[k].data(), now[k].size() * sizeof(float)), 0) << "output " << k;
  }
}

// Once the sizes have been seen, the caching allocator serves them without the driver.
TEST_F(GpuOps, CachingAllocatorReusesBlocks) {
  for (int i = 0; i < 3; i++) {
    void* a = gpu_alloc(1000);
    void* b = gpu_alloc(5 << 20);
    gpu_release(a);
    gpu_release(b);
  }
  const size_t before = gpu_allocator_stats().device_mallocs;
  for (int i = 0; i < 100; i++) {
    void* a = gpu_alloc(900);
    void* b = gpu_alloc(5 << 20);
    gpu_release(b);
    gpu_release(a);
  }
  EXPECT_EQ(gpu_allocator_stats().device_mallocs, before);
}

}  // namespace
}  // namespace anvil
