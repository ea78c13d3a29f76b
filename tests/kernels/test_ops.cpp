// Every fast CPU op against its reference, over shapes that reach each branch: sizes of one,
// odd sizes, T not a multiple of the attention tiles, a single head, accumulation (+=) outputs.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <vector>

#include "compare.h"
#include "core/rng.h"
#include "kernels/attention.h"
#include "kernels/cpu/gemm.h"
#include "kernels/crossentropy.h"
#include "kernels/encoder.h"
#include "kernels/gelu.h"
#include "kernels/impl.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
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


TEST(Encoder, MatchesReference) {
  struct Shape { int B, T, C, V; };
  for (Shape s : {Shape{1, 1, 1, 3}, Shape{2, 5, 7, 11}, Shape{3, 17, 33, 4}}) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C);
    std::vector<int32_t> tokens(s.B * s.T);
    for (size_t i = 0; i < tokens.size(); i++) tokens[i] = static_cast<int32_t>((i * 7 + 3) % s.V);
    auto wte = randn(s.V * s.C, 1), wpe = randn(s.T * s.C, 2), dout = randn(s.B * s.T * s.C, 3);
    std::vector<float> out_ref(s.B * s.T * s.C), out_cpu(out_ref.size());
    ref::encoder_forward(out_ref.data(), tokens.data(), wte.data(), wpe.data(), s.B, s.T, s.C);
    cpu::encoder_forward(out_cpu.data(), tokens.data(), wte.data(), wpe.data(), s.B, s.T, s.C);
    EXPECT_TRUE(all_close(out_cpu.data(), out_ref.data(), out_ref.size(), kFp32Elementwise));
    auto dwte_ref = randn(wte.size(), 4), dwpe_ref = randn(wpe.size(), 5);  // += onto these
    auto dwte_cpu = dwte_ref, dwpe_cpu = dwpe_ref;
    ref::encoder_backward(dwte_ref.data(), dwpe_ref.data(), dout.data(), tokens.data(), s.B, s.T, s.C);
    cpu::encoder_backward(dwte_cpu.data(), dwpe_cpu.data(), dout.data(), tokens.data(), s.B, s.T, s.C);
    EXPECT_TRUE(all_close(dwte_cpu.data(), dwte_ref.data(), dwte_ref.size(), kFp32Elementwise));
    EXPECT_TRUE(all_close(dwpe_cpu.data(), dwpe_ref.data(), dwpe_ref.size(), kFp32Elementwise));
  }
}

// The embeddings' backward as the model runs it: a sequence's token gradient in compact rows (a
// row per distinct token), added into the table. Onto a zero table, the bits of the direct form.
TEST(Encoder, CompactRowsAddUpToTheDirectGradient) {
  const int T = 19, C = 40, V = 23;
  std::vector<int32_t> tokens(T);
  for (int t = 0; t < T; t++) tokens[t] = static_cast<int32_t>((t * t * 5 + 2) % V);  // repeats, gaps
  std::vector<int32_t> rows = tokens;
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  ASSERT_LT(rows.size(), static_cast<size_t>(T));
  std::vector<int32_t> compact(T);
  for (int t = 0; t < T; t++) compact[t] = std::lower_bound(rows.begin(), rows.end(), tokens[t]) - rows.begin();
  const auto dout = randn(T * C, 8);
  for (auto impl : {KernelImpl::kRef, KernelImpl::kCpu}) {
    set_kernel_impl(impl);
    std::vector<float> direct(V * C, 0.0f), dwpe(T * C, 0.0f), table(V * C, 0.0f), dwpe2(T * C, 0.0f);
    encoder_backward(direct.data(), dwpe.data(), dout.data(), tokens.data(), 1, T, C);
    std::vector<float> x(rows.size() * C, 0.0f);
    encoder_backward(x.data(), dwpe2.data(), dout.data(), compact.data(), 1, T, C);
    add_rows(table.data(), x.data(), rows.data(), rows.size(), C);
    EXPECT_EQ(table, direct);
    EXPECT_EQ(dwpe2, dwpe);
    // Onto a table that holds values: row rows[r] gains row r, the other rows keep theirs.
    std::vector<float> held = randn(V * C, 9), want = held;
    for (size_t r = 0; r < rows.size(); r++)
      for (int c = 0; c < C; c++) want[rows[r] * C + c] += x[r * C + c];
    add_rows(held.data(), x.data(), rows.data(), rows.size(), C);
    EXPECT_EQ(held, want);
  }
  set_kernel_impl(KernelImpl::kCpu);
}

TEST(LayerNorm, MatchesReference) {
  struct Shape { int N, C; };
  for (Shape s : {Shape{1, 1}, Shape{5, 7}, Shape{33, 64}, Shape{17, 768}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " C=" << s.C);
    auto inp = randn(s.N * s.C, 1, 2.0f), w = randn(s.C, 2), b = randn(s.C, 3),
         dout = randn(s.N * s.C, 4);
    std::vector<float> out_ref(inp.size()), out_cpu(inp.size()), m_ref(s.N), m_cpu(s.N),
        r_ref(s.N), r_cpu(s.N);
    ref::layernorm_forward(out_ref.data(), m_ref.data(), r_ref.data(), inp.data(), w.data(), b.data(), s.N, s.C);
    cpu::layernorm_forward(out_cpu.data(), m_cpu.data(), r_cpu.data(), inp.data(), w.data(), b.data(), s.N, s.C);
    EXPECT_TRUE(all_close(out_cpu.data(), out_ref.data(), out_ref.size(), kFp32Reduction));
    EXPECT_TRUE(all_close(m_cpu.data(), m_ref.data(), s.N, kFp32Reduction));
    EXPECT_TRUE(all_close(r_cpu.data(), r_ref.data(), s.N, kFp32Reduction));
    auto dinp_ref = randn(inp.size(), 5), dw_ref = randn(s.C, 6), db_ref = randn(s.C, 7);
    auto dinp_cpu = dinp_ref, dw_cpu = dw_ref, db_cpu = db_ref;
    ref::layernorm_backward(dinp_ref.data(), dw_ref.data(), db_ref.data(), dout.data(), inp.data(),
                            w.data(), m_ref.data(), r_ref.data(), s.N, s.C);
    cpu::layernorm_backward(dinp_cpu.data(), dw_cpu.data(), db_cpu.data(), dout.data(), inp.data(),
                            w.data(), m_ref.data(), r_ref.data(), s.N, s.C);
    EXPECT_TRUE(all_close(dinp_cpu.data(), dinp_ref.data(), dinp_ref.size(), kFp32Reduction));
    EXPECT_TRUE(all_close(dw_cpu.data(), dw_ref.data(), s.C, kFp32Reduction));
    EXPECT_TRUE(all_close(db_cpu.data(), db_ref.data(), s.C, kFp32Reduction));
  }
}

TEST(Matmul, MatchesReference) {
  struct Shape { int N, C, OC; bool bias; };
  for (Shape s : {Shape{1, 1, 1, true}, Shape{3, 5, 7, true}, Shape{17, 33, 65, false},
                  Shape{64, 96, 130, true}, Shape{1, 256, 1000, false},
                  // row bands: narrow outputs cut into 64- to 256-row blocks, uneven last ones
                  Shape{256, 256, 300, true}, Shape{200, 64, 520, false}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " C=" << s.C << " OC=" << s.OC << " bias=" << s.bias);
    auto inp = randn(s.N * s.C, 1), w = randn(s.OC * s.C, 2, 0.1f), b = randn(s.OC, 3),
         dout = randn(s.N * s.OC, 4);
    const float* bias = s.bias ? b.data() : nullptr;
    MatmulContext ctx;
    std::vector<float> out_ref(s.N * s.OC), out_cpu(out_ref.size());
    ref::matmul_forward(out_ref.data(), inp.data(), w.data(), bias, s.N, s.C, s.OC);
    cpu::matmul_forward(ctx, out_cpu.data(), inp.data(), w.data(), bias, s.N, s.C, s.OC);
    EXPECT_TRUE(rel_norm_close(out_cpu.data(), out_ref.data(), out_ref.size(), kFp32RelNorm));
    std::vector<float> dinp_ref(inp.size()), dinp_cpu(inp.size());
    auto dw_ref = randn(w.size(), 5), db_ref = randn(s.OC, 6);
    auto dw_cpu = dw_ref, db_cpu = db_ref;
    float* dbias_ref = s.bias ? db_ref.data() : nullptr;
    float* dbias_cpu = s.bias ? db_cpu.data() : nullptr;
    ref::matmul_backward(dinp_ref.data(), dw_ref.data(), dbias_ref, dout.data(), s.OC, inp.data(), w.data(), s.N, s.C,
                         s.OC, false);
    cpu::matmul_backward(ctx, dinp_cpu.data(), dw_cpu.data(), dbias_cpu, dout.data(), s.OC, inp.data(), w.data(), s.N,
                         s.C, s.OC, false);
    EXPECT_TRUE(rel_norm_close(dinp_cpu.data(), dinp_ref.data(), dinp_ref.size(), kFp32RelNorm));
    EXPECT_TRUE(rel_norm_close(dw_cpu.data(), dw_ref.data(), dw_ref.size(), kFp32RelNorm));
    EXPECT_TRUE(all_close(db_cpu.data(), db_ref.data(), s.OC, kFp32Reduction));
  }
}

// The LM head's backward a vocabulary chunk at a time: dout a block of columns of the wider
// logits' gradient (rows ld_dout apart), the input gradient accumulated over the chunks. Chunks
// that start at multiples of the GEMM's k block (kGemmKc) give the whole product's bits on the
// CPU; the reference agrees at fp32 tolerance, biases included.
TEST(Matmul, ColumnBlocksOfDoutAccumulateToTheWholeProduct) {
  const int N = 64, C = 96, OC = 1000;  // chunks of 256: three whole and one of 232
  auto inp = randn(N * C, 1), w = randn(OC * C, 2, 0.1f), dout = randn(N * OC, 4);
  MatmulContext ctx;
  std::vector<float> dinp_whole(N * C), dw_whole(w.size(), 0.0f), db_whole(OC, 0.0f);
  cpu::matmul_backward(ctx, dinp_whole.data(), dw_whole.data(), db_whole.data(), dout.data(), OC, inp.data(), w.data(),
                       N, C, OC, false);
  std::vector<float> dinp(N * C, NAN), dw(w.size(), 0.0f), db(OC, 0.0f);
  std::vector<float> dinp_ref(N * C, NAN), dw_ref(w.size(), 0.0f), db_ref(OC, 0.0f);
  for (int o0 = 0; o0 < OC; o0 += cpu::kGemmKc) {
    const int width = std::min(cpu::kGemmKc, OC - o0);
    const size_t rows = static_cast<size_t>(o0) * C;
    cpu::matmul_backward(ctx, dinp.data(), dw.data() + rows, db.data() + o0, dout.data() + o0, OC, inp.data(),
                         w.data() + rows, N, C, width, o0 > 0);
    ref::matmul_backward(dinp_ref.data(), dw_ref.data() + rows, db_ref.data() + o0, dout.data() + o0, OC, inp.data(),
                         w.data() + rows, N, C, width, o0 > 0);
  }
  EXPECT_TRUE(dinp == dinp_whole);
  EXPECT_TRUE(dw == dw_whole);
  EXPECT_TRUE(db == db_whole);
  EXPECT_TRUE(rel_norm_close(dinp_ref.data(), dinp_whole.data(), dinp.size(), kFp32RelNorm));
  EXPECT_TRUE(rel_norm_close(dw_ref.data(), dw_whole.data(), dw.size(), kFp32RelNorm));
  EXPECT_TRUE(all_close(db_ref.data(), db_whole.data(), OC, kFp32Reduction));
}

// A held weight (the LM head's, packed once for a step's products) gives the bits of the weight
// itself, in the forward and in a chunked backward whose last chunk is odd; with bf16 operands,
// where the CPU packs it, and fp32, where holding does nothing.
TEST(Matmul, HeldWeightGivesTheSameBits) {
  const int N = 40, C = 96, OC = 2 * 256 + 81;  // chunks of 256 rows: two whole, one odd
  auto inp = randn(N * C, 1), w = randn(OC * C, 2, 0.1f), dout = randn(N * OC, 4);
  for (ComputeDtype dtype : {ComputeDtype::kBf16, ComputeDtype::kFp32}) {
    SCOPED_TRACE(dtype == ComputeDtype::kBf16 ? "bf16 operands" : "fp32");
    MatmulContext ctx(dtype);
    std::vector<float> out[2], dinp[2], dw[2];
    for (int held = 0; held < 2; held++) {
      if (held) ctx.hold_weight(w.data(), OC, C);
      out[held].resize(N * OC);
      cpu::matmul_forward(ctx, out[held].data(), inp.data(), w.data(), nullptr, N, C, OC);
      dinp[held].assign(N * C, NAN);
      dw[held].assign(w.size(), 0.0f);
      for (int o0 = 0; o0 < OC; o0 += cpu::kGemmKc) {
        const int width = std::min(cpu::kGemmKc, OC - o0);
        const size_t rows = static_cast<size_t>(o0) * C;
        cpu::matmul_backward(ctx, dinp[held].data(), dw[held].data() + rows, nullptr, dout.data() + o0, OC, inp.data(),
                             w.data() + rows, N, C, width, o0 > 0);
      }
      ctx.release_weight();
    }
    EXPECT_TRUE(out[1] == out[0]);
    EXPECT_TRUE(dinp[1] == dinp[0]);
    EXPECT_TRUE(dw[1] == dw[0]);
  }
  // Held, the products read the copy packed at their first use (hence "unchanged"): a change to
  // the weight after that is not seen until the weight is released.
  MatmulContext ctx(ComputeDtype::kBf16);
  std::vector<float> before(N * OC), after(N * OC), dinp_before(N * C), dinp_after(N * C), dw(w.size(), 0.0f);
  auto products = [&](std::vector<float>& out, std::vector<float>& di) {
    cpu::matmul_forward(ctx, out.data(), inp.data(), w.data(), nullptr, N, C, OC);
    cpu::matmul_backward(ctx, di.data(), dw.data(), nullptr, dout.data(), OC, inp.data(), w.data(), N, C, 256, false);
  };
  ctx.hold_weight(w.data(), OC, C);
  products(before, dinp_before);
  for (float& x : w) x *= 2.0f;
  products(after, dinp_after);
  EXPECT_TRUE(after == before && dinp_after == dinp_before);
  ctx.release_weight();
  products(after, dinp_after);
  EXPECT_FALSE(after == before || dinp_after == dinp_before);
}

// The GEMM grid is a function of the shape only: 1, 2 and 3 threads give the same bits, for
// shapes cut into column blocks, row bands and both.
TEST(Matmul, ThreadCountDoesNotChangeABit) {
  struct Shape { int N, C, OC; };
  for (Shape s : {Shape{256, 256, 768}, Shape{256, 256, 300}, Shape{200, 1024, 64}, Shape{130, 64, 2000}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " C=" << s.C << " OC=" << s.OC);
    auto inp = randn(s.N * s.C, 1), w = randn(s.OC * s.C, 2, 0.1f), b = randn(s.OC, 3), dout = randn(s.N * s.OC, 4);
    std::vector<float> out[3], dinp[3], dw[3], db[3];
    MatmulContext ctx;
    const int saved = omp_get_max_threads();
    for (int k = 0; k < 3; k++) {
      omp_set_num_threads(k + 1);
      out[k].resize(s.N * s.OC);
      dinp[k].resize(inp.size());
      dw[k] = randn(w.size(), 5);
      db[k] = randn(s.OC, 6);
      cpu::matmul_forward(ctx, out[k].data(), inp.data(), w.data(), b.data(), s.N, s.C, s.OC);
      cpu::matmul_backward(ctx, dinp[k].data(), dw[k].data(), db[k].data(), dout.data(), s.OC, inp.data(), w.data(),
                           s.N, s.C, s.OC, false);
    }
    omp_set_num_threads(saved);
    for (int k = 1; k < 3; k++) {
      EXPECT_TRUE(out[k] == out[0]) << k + 1 << " threads";
      EXPECT_TRUE(dinp[k] == dinp[0]) << k + 1 << " threads";
      EXPECT_TRUE(dw[k] == dw[0]) << k + 1 << " threads";
      EXPECT_TRUE(db[k] == db[0]) << k + 1 << " threads";
    }
  }
}

TEST(Gelu, MatchesReference) {
  for (long n : {1L, 7L, 4099L}) {
    auto inp = randn(n, 1, 3.0f), dout = randn(n, 2);
    std::vector<float> out_ref(n), out_cpu(n), d_ref(n), d_cpu(n);
    ref::gelu_forward(out_ref.data(), inp.data(), n);
    cpu::gelu_forward(out_cpu.data(), inp.data(), n);
    EXPECT_TRUE(all_close(out_cpu.data(), out_ref.data(), n, kFp32Elementwise));
    ref::gelu_backward(d_ref.data(), inp.data(), dout.data(), n);
    cpu::gelu_backward(d_cpu.data(), inp.data(), dout.data(), n);
    EXPECT_TRUE(all_close(d_cpu.data(), d_ref.data(), n, kFp32Elementwise));
  }
}

TEST(Residual, MatchesReference) {
  for (long n : {1L, 13L, 4099L}) {
    auto a = randn(n, 1), b = randn(n, 2), dout = randn(n, 3);
    std::vector<float> out_ref(n), out_cpu(n);
    ref::residual_forward(out_ref.data(), a.data(), b.data(), n);
    cpu::residual_forward(out_cpu.data(), a.data(), b.data(), n);
    EXPECT_TRUE(all_close(out_cpu.data(), out_ref.data(), n, kFp32Elementwise));
    auto da_ref = randn(n, 4), db_ref = randn(n, 5);
    auto da_cpu = da_ref, db_cpu = db_ref;
    ref::residual_backward(da_ref.data(), db_ref.data(), dout.data(), n);
    cpu::residual_backward(da_cpu.data(), db_cpu.data(), dout.data(), n);
    EXPECT_TRUE(all_close(da_cpu.data(), da_ref.data(), n, kFp32Elementwise));
    EXPECT_TRUE(all_close(db_cpu.data(), db_ref.data(), n, kFp32Elementwise));
  }
}

TEST(Attention, BlockedMatchesFullSoftmaxReference) {
  struct Shape { int B, T, C, NH; };
  // T=1; T below, equal to, and not a multiple of the 64-query blocks; one head; HS from 2 to 64.
  for (Shape s : {Shape{1, 1, 4, 1}, Shape{1, 5, 8, 2}, Shape{2, 33, 16, 1}, Shape{2, 70, 24, 3},
                  Shape{1, 64, 32, 4}, Shape{1, 100, 128, 2}, Shape{2, 130, 96, 3}}) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " NH=" << s.NH);
    auto qkv = randn(s.B * s.T * 3 * s.C, 1), dout = randn(s.B * s.T * s.C, 2);
    std::vector<float> out_ref(s.B * s.T * s.C), out_cpu(out_ref.size()), lse_ref(s.B * s.NH * s.T),
        lse_cpu(lse_ref.size());
    ref::attention_forward(out_ref.data(), lse_ref.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    cpu::attention_forward(out_cpu.data(), lse_cpu.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    EXPECT_TRUE(all_close(out_cpu.data(), out_ref.data(), out_ref.size(), kFp32Reduction));
    EXPECT_TRUE(all_close(lse_cpu.data(), lse_ref.data(), lse_ref.size(), kFp32Reduction));
    std::vector<float> dqkv_ref(qkv.size()), dqkv_cpu(qkv.size(), 123.0f);  // cpu must overwrite
    ref::attention_backward(dqkv_ref.data(), dout.data(), qkv.data(), out_ref.data(), lse_ref.data(), s.B, s.T, s.C, s.NH);
    cpu::attention_backward(dqkv_cpu.data(), dout.data(), qkv.data(), out_ref.data(), lse_ref.data(), s.B, s.T, s.C, s.NH);
    EXPECT_TRUE(rel_norm_close(dqkv_cpu.data(), dqkv_ref.data(), dqkv_ref.size(), kFp32RelNorm));
    EXPECT_TRUE(all_close(dqkv_cpu.data(), dqkv_ref.data(), dqkv_ref.size(), kFp32Reduction));
  }
}

// Each (sequence, head, query block) is one thread's work in a fixed order: 1, 2 or 3 threads give
// the same bits.
TEST(Attention, ThreadCountDoesNotChangeABit) {
  const int B = 2, T = 150, C = 96, NH = 3;
  auto qkv = randn(B * T * 3 * C, 1), dout = randn(B * T * C, 2);
  std::vector<float> out[3], lse[3], dqkv[3];
  const int saved = omp_get_max_threads();
  for (int k = 0; k < 3; k++) {
    omp_set_num_threads(k + 1);
    out[k].resize(B * T * C);
    lse[k].resize(B * NH * T);
    dqkv[k].resize(qkv.size());
    cpu::attention_forward(out[k].data(), lse[k].data(), qkv.data(), B, T, C, NH);
    cpu::attention_backward(dqkv[k].data(), dout.data(), qkv.data(), out[k].data(), lse[k].data(), B, T, C, NH);
  }
  omp_set_num_threads(saved);
  for (int k = 1; k < 3; k++) {
    EXPECT_TRUE(out[k] == out[0]) << k + 1 << " threads";
    EXPECT_TRUE(lse[k] == lse[0]) << k + 1 << " threads";
    EXPECT_TRUE(dqkv[k] == dqkv[0]) << k + 1 << " threads";
  }
}

// In fp32 and with the amp rounding of logits (read) and gradient (written) in bf16 and fp16.
TEST(CrossEntropy, MatchesReferenceWithIgnoredTargets) {
  struct Shape { int N, V; };
  for (ComputeDtype d : {ComputeDtype::kFp32, ComputeDtype::kBf16, ComputeDtype::kFp16})
  for (Shape s : {Shape{1, 1}, Shape{3, 5}, Shape{17, 1000}, Shape{4, 50257}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " V=" << s.V << " dtype " << static_cast<int>(d));
    const testing::Tolerance gradient = d == ComputeDtype::kBf16   ? kBf16Rounded
                               : d == ComputeDtype::kFp16 ? kFp16Rounded
                                                          : kFp32Elementwise;
    auto logits = randn(s.N * static_cast<size_t>(s.V), 1, 3.0f);
    std::vector<int32_t> targets(s.N);
    for (int n = 0; n < s.N; n++) targets[n] = (n % 3 == 1) ? kIgnoreIndex : (n * 31 + 7) % s.V;
    std::vector<float> l_ref(s.N), l_cpu(s.N), lse_ref(s.N), lse_cpu(s.N);
    ref::crossentropy_forward(l_ref.data(), lse_ref.data(), logits.data(), targets.data(), s.N, s.V, d);
    cpu::crossentropy_forward(l_cpu.data(), lse_cpu.data(), logits.data(), targets.data(), s.N, s.V, d);
    EXPECT_TRUE(all_close(l_cpu.data(), l_ref.data(), s.N, kFp32Reduction));
    EXPECT_TRUE(all_close(lse_cpu.data(), lse_ref.data(), s.N, kFp32Reduction));
    if (d != ComputeDtype::kFp32) {
      // The same as fp32 on logits rounded beforehand, which is what the dtype stands for.
      std::vector<float> rounded = logits, l_rounded(s.N), lse_rounded(s.N);
      ref::round_to_dtype(rounded.data(), static_cast<long>(rounded.size()), d);
      ref::crossentropy_forward(l_rounded.data(), lse_rounded.data(), rounded.data(), targets.data(), s.N, s.V,
                                ComputeDtype::kFp32);
      EXPECT_TRUE(l_rounded == l_ref);
      EXPECT_TRUE(lse_rounded == lse_ref);
    }
    std::vector<float> d_ref(logits.size());
    ref::crossentropy_backward(d_ref.data(), logits.data(), lse_ref.data(), targets.data(), 0.25f, s.N, s.V, d);
    std::vector<float> d_check = d_ref;  // every gradient is a value of the dtype
    ref::round_to_dtype(d_check.data(), static_cast<long>(d_check.size()), d);
    EXPECT_TRUE(d_check == d_ref);
    // The fused training form, in place and into a buffer of garbage (NaN): the same losses and
    // gradient, with ignored rows zeroed.
    for (bool in_place : {true, false}) {
      std::vector<float> l_ref2(s.N, 99.0f), l_cpu2(s.N, 99.0f);
      std::vector<float> d_ref2(logits.size(), NAN);
      std::vector<float> d_cpu2 = in_place ? logits : std::vector<float>(logits.size(), NAN);
      const float* src = in_place ? d_cpu2.data() : logits.data();
      ref::crossentropy_forward_backward(l_ref2.data(), d_ref2.data(), logits.data(), targets.data(), 0.25f, s.N, s.V,
                                         d);
      cpu::crossentropy_forward_backward(l_cpu2.data(), d_cpu2.data(), src, targets.data(), 0.25f, s.N, s.V, d);
      EXPECT_TRUE(all_close(l_ref2.data(), l_ref.data(), s.N, kFp32Elementwise));
      EXPECT_TRUE(all_close(d_ref2.data(), d_ref.data(), d_ref.size(), kFp32Elementwise));
      EXPECT_TRUE(all_close(l_cpu2.data(), l_ref.data(), s.N, kFp32Reduction)) << "in place " << in_place;
      EXPECT_TRUE(all_close(d_cpu2.data(), d_ref.data(), d_ref.size(), gradient)) << "in place " << in_place;
      std::vector<float> d_cpu_check = d_cpu2;
      ref::round_to_dtype(d_cpu_check.data(), static_cast<long>(d_cpu_check.size()), d);
      EXPECT_TRUE(d_cpu_check == d_cpu2) << "the fast gradient is not a value of the dtype";
    }
    for (int n = 0; n < s.N; n++) {
      if (targets[n] == kIgnoreIndex) {
        EXPECT_EQ(l_cpu[n], 0.0f);
      }
    }
  }
}

}  // namespace
}  // namespace anvil

#include "kernels/cpu/vec_math.h"

namespace anvil {
namespace {

TEST(ExpApprox, RelativeErrorBelowThreeUlpOverTheFloatRange) {
  double worst = 0;
  for (int i = 0; i <= 2000000; i++) {
    const float x = -87.0f + 175.0f * static_cast<float>(i) / 2000000.0f;
    const double want = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::fabs(cpu::exp_approx(x) - want) / want);
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(cpu::exp_approx(0.0f), 1.0f);
  EXPECT_LT(cpu::exp_approx(-1000.0f), 1e-37f);  // clamps instead of producing garbage
}

}  // namespace
}  // namespace anvil
