// What the CPU kernels promise beyond agreeing with the reference (which the op table checks,
// tests/kernels/op_table.cpp): bits that do not depend on the thread count, on how a product is
// split or on a held weight; and the reference's own contracts that the table relies on.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "compare.h"
#include "core/rng.h"
#include "kernels/attention.h"
#include "kernels/cpu/gemm.h"
#include "kernels/crossentropy.h"
#include "kernels/encoder.h"
#include "kernels/matmul.h"
#include "kernels/layernorm.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/round.h"

namespace anvil {
namespace {
using testing::all_close;
using testing::kFp32Elementwise;
using testing::randn;

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
    std::vector<float> direct(V * C, 0.0f), dwpe(T * C, 0.0f), table(V * C, 0.0f), dwpe2(T * C, 0.0f);
    encoder_backward(impl, direct.data(), dwpe.data(), dout.data(), tokens.data(), nullptr, 1, T, C);
    std::vector<float> x(rows.size() * C, 0.0f);
    encoder_backward(impl, x.data(), dwpe2.data(), dout.data(), compact.data(), nullptr, 1, T, C);
    add_rows(impl, table.data(), x.data(), rows.data(), rows.size(), C);
    EXPECT_EQ(table, direct);
    EXPECT_EQ(dwpe2, dwpe);
    // Onto a table that holds values: row rows[r] gains row r, the other rows keep theirs.
    std::vector<float> held = randn(V * C, 9), want = held;
    for (size_t r = 0; r < rows.size(); r++)
      for (int c = 0; c < C; c++) want[rows[r] * C + c] += x[r * C + c];
    add_rows(impl, held.data(), x.data(), rows.data(), rows.size(), C);
    EXPECT_EQ(held, want);
  }
}

// The LM head's backward a vocabulary chunk at a time: dout a block of columns of the wider
// logits' gradient (rows ld_dout apart), the input gradient accumulated over the chunks. Chunks
// that start at multiples of the GEMM's k block (kGemmKc) give the whole product's bits.
TEST(Matmul, ColumnBlocksOfDoutAccumulateToTheWholeProduct) {
  const int N = 64, C = 96, OC = 1000;  // chunks of 256: three whole and one of 232
  auto inp = randn(N * C, 1), w = randn(OC * C, 2, 0.1f), dout = randn(N * OC, 4);
  MatmulContext ctx(KernelImpl::kCpu);
  std::vector<float> dinp_whole(N * C), dw_whole(w.size(), 0.0f), db_whole(OC, 0.0f);
  cpu::matmul_backward(ctx, dinp_whole.data(), dw_whole.data(), db_whole.data(), dout.data(), OC, inp.data(), w.data(),
                       N, C, OC, false);
  std::vector<float> dinp(N * C, NAN), dw(w.size(), 0.0f), db(OC, 0.0f);
  for (int o0 = 0; o0 < OC; o0 += cpu::kGemmKc) {
    const int width = std::min(cpu::kGemmKc, OC - o0);
    const size_t rows = static_cast<size_t>(o0) * C;
    cpu::matmul_backward(ctx, dinp.data(), dw.data() + rows, db.data() + o0, dout.data() + o0, OC, inp.data(),
                         w.data() + rows, N, C, width, o0 > 0);
  }
  EXPECT_TRUE(dinp == dinp_whole);
  EXPECT_TRUE(dw == dw_whole);
  EXPECT_TRUE(db == db_whole);
}

// matmul_backward_sequences off the GPU: a sequence at a time, each the bits of matmul_backward of
// its rows alone, adding to its span or (write_grads) writing it whatever it held.
TEST(Matmul, SequencesBackwardIsEachSequencesOwnProduct) {
  const int B = 3, T = 16, C = 24, OC = 40;
  const size_t span = static_cast<size_t>(OC) * C + OC, stride = span + 3;
  auto inp = randn(B * T * C, 21), w = randn(OC * C, 22, 0.1f), dout = randn(B * T * OC, 23);
  const std::vector<float> before = randn(B * stride, 24);
  MatmulContext ctx(KernelImpl::kCpu);
  for (const bool write : {false, true}) {
    std::vector<float> want = before, dinp_want(inp.size());
    for (int b = 0; b < B; b++) {
      float* dw = want.data() + b * stride;
      if (write) std::fill(dw, dw + span, 0.0f);
      matmul_backward(ctx, dinp_want.data() + b * T * C, dw, dw + OC * C, dout.data() + b * T * OC, OC,
                      inp.data() + b * T * C, w.data(), T, C, OC, false);
    }
    std::vector<float> grads = write ? std::vector<float>(before.size(), NAN) : before, dinp(inp.size(), NAN);
    for (int b = 0; b < B; b++)  // what lies between the spans stays as it was
      std::copy(before.begin() + b * stride + span, before.begin() + (b + 1) * stride,
                grads.begin() + b * stride + span);
    matmul_backward_sequences(ctx, dinp.data(), grads.data(), grads.data() + OC * C, stride, dout.data(), inp.data(),
                              w.data(), B, T, C, OC, write);
    EXPECT_TRUE(grads == want) << (write ? "written" : "added");
    EXPECT_TRUE(dinp == dinp_want);
  }
}

// Tensor parallelism's row-parallel product: the input's k cut at multiples of the GEMM's k block,
// the first part formed with the bias, each next one accumulated into the output, gives the whole
// product's bits, in fp32 and with bf16 operands; ref accumulates too.
TEST(Matmul, KPartsAccumulatedInOrderAreTheWholeProduct) {
  const int N = 40, C = 3 * cpu::kGemmKc + 64, OC = 72;  // parts of 512, 256 and 64
  auto inp = randn(N * C, 11), w = randn(OC * C, 12, 0.1f), bias = randn(OC, 13);
  for (ComputeDtype d : {ComputeDtype::kFp32, ComputeDtype::kBf16}) {
    MatmulContext ctx(KernelImpl::kCpu, d);
    std::vector<float> whole(N * OC), parts(N * OC, NAN);
    matmul_forward(ctx, whole.data(), inp.data(), w.data(), bias.data(), N, C, OC);
    // The parts' inputs and weights as the ranks hold them: contiguous columns of each.
    const int cuts[] = {0, 2 * cpu::kGemmKc, 3 * cpu::kGemmKc, C};
    for (int p = 0; p < 3; p++) {
      const int k0 = cuts[p], K = cuts[p + 1] - k0;
      std::vector<float> x(N * K), wp(OC * K);
      for (int n = 0; n < N; n++) std::copy_n(inp.data() + n * C + k0, K, x.data() + n * K);
      for (int o = 0; o < OC; o++) std::copy_n(w.data() + o * C + k0, K, wp.data() + o * K);
      matmul_forward(ctx, parts.data(), x.data(), wp.data(), p == 0 ? bias.data() : nullptr, N, K, OC, p > 0);
    }
    EXPECT_TRUE(parts == whole) << (d == ComputeDtype::kFp32 ? "fp32" : "bf16");
  }
  MatmulContext ref(KernelImpl::kRef);
  std::vector<float> out = randn(N * OC, 14), want = out, product(N * OC);
  matmul_forward(ref, product.data(), inp.data(), w.data(), nullptr, N, C, OC);
  matmul_forward(ref, out.data(), inp.data(), w.data(), nullptr, N, C, OC, true);
  for (size_t i = 0; i < want.size(); i++) want[i] += product[i];
  EXPECT_TRUE(all_close(out.data(), want.data(), want.size(), kFp32Elementwise));
}

// A held weight (the LM head's, packed once for a step's products) gives the bits of the weight
// itself, in the forward and in a chunked backward whose last chunk is odd; with bf16 operands,
// where the CPU packs it, and fp32, where holding does nothing.
TEST(Matmul, HeldWeightGivesTheSameBits) {
  const int N = 40, C = 96, OC = 2 * 256 + 81;  // chunks of 256 rows: two whole, one odd
  auto inp = randn(N * C, 1), w = randn(OC * C, 2, 0.1f), dout = randn(N * OC, 4);
  for (ComputeDtype dtype : {ComputeDtype::kBf16, ComputeDtype::kFp32}) {
    SCOPED_TRACE(dtype == ComputeDtype::kBf16 ? "bf16 operands" : "fp32");
    MatmulContext ctx(KernelImpl::kCpu, dtype);
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
  MatmulContext ctx(KernelImpl::kCpu, ComputeDtype::kBf16);
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
    MatmulContext ctx(KernelImpl::kCpu);
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

// Each (sequence, head, query block) of the forward and each (sequence, key/value head) of the
// backward is one thread's work in a fixed order: 1, 2 or 3 threads give the same bits, with
// separate heads and with grouped-query heads and ALiBi.
TEST(Attention, ThreadCountDoesNotChangeABit) {
  const int B = 2, T = 150;
  AttentionHeads grouped{6, 2, 16};
  grouped.alibi = true;
  for (const AttentionHeads& a : {AttentionHeads{3, 3, 32}, grouped}) {
    const size_t BT = static_cast<size_t>(B) * T;
    auto qkv = randn(BT * a.qkv_channels(), 1), dout = randn(BT * a.q_channels(), 2);
    std::vector<float> out[3], lse[3], dqkv[3];
    const int saved = omp_get_max_threads();
    for (int k = 0; k < 3; k++) {
      omp_set_num_threads(k + 1);
      out[k].resize(BT * a.q_channels());
      lse[k].resize(BT * a.n_heads);
      dqkv[k].resize(qkv.size());
      cpu::attention_forward(out[k].data(), lse[k].data(), qkv.data(), nullptr, B, T, a);
      cpu::attention_backward(dqkv[k].data(), dout.data(), qkv.data(), out[k].data(), lse[k].data(), nullptr, B, T, a);
    }
    omp_set_num_threads(saved);
    for (int k = 1; k < 3; k++) {
      EXPECT_TRUE(out[k] == out[0]) << k + 1 << " threads, " << a.n_kv_heads << " kv heads";
      EXPECT_TRUE(lse[k] == lse[0]) << k + 1 << " threads, " << a.n_kv_heads << " kv heads";
      EXPECT_TRUE(dqkv[k] == dqkv[0]) << k + 1 << " threads, " << a.n_kv_heads << " kv heads";
    }
  }
}

// first_query: the rows from it on are the bits of the whole computation, for the CPU kernel
// (whose query blocks keep their places) and the reference; a first_query inside a block, on a
// block's start and on the last row; a window, ALiBi and grouped-query heads.
TEST(Attention, FirstQueryGivesTheWholeComputationsRows) {
  const int B = 2, T = 150;
  AttentionHeads grouped{6, 2, 16};
  grouped.alibi = true;
  AttentionHeads windowed{3, 3, 32};
  windowed.window = 40;
  for (const AttentionHeads& a : {AttentionHeads{3, 3, 32}, grouped, windowed})
    for (const KernelImpl impl : {KernelImpl::kCpu, KernelImpl::kRef}) {
      const size_t BT = static_cast<size_t>(B) * T, C = a.q_channels();
      const auto qkv = randn(BT * a.qkv_channels(), 1);
      std::vector<float> out(BT * C), lse(BT * a.n_heads);
      attention_forward(impl, out.data(), lse.data(), qkv.data(), nullptr, B, T, a);
      for (const int first : {1, 37, 64, 100, T - 1}) {
        AttentionHeads after = a;
        after.first_query = first;
        std::vector<float> part_out(out.size(), NAN), part_lse(lse.size(), NAN);
        attention_forward(impl, part_out.data(), part_lse.data(), qkv.data(), nullptr, B, T, after);
        bool same = true;
        for (int b = 0; b < B; b++)
          for (int t = first; t < T; t++) {
            const size_t row = static_cast<size_t>(b) * T + t;
            same = same && std::equal(out.begin() + row * C, out.begin() + (row + 1) * C, part_out.begin() + row * C);
            for (int h = 0; h < a.n_heads; h++) {
              const size_t l = (static_cast<size_t>(b) * a.n_heads + h) * T + t;
              same = same && lse[l] == part_lse[l];
            }
          }
        EXPECT_TRUE(same) << "first_query " << first << ", " << a.n_kv_heads << " kv heads, window " << a.window
                          << (impl == KernelImpl::kCpu ? ", cpu" : ", ref");
      }
    }
}

// ALiBi's slopes as LLM Foundry's gen_slopes and Hugging Face's MPT give them: 1/2^(8k/n) for a
// power-of-two head count; for twelve heads, the slopes of sixteen taken even k first
// (k = 2, 4, ..., 16) and then odd (k = 1, 3, 5, 7).
TEST(AttentionReference, AlibiSlopesAreMptsSlopes) {
  for (int h = 0; h < 8; h++) EXPECT_EQ(alibi_slope(h, 8, 8.0f), 1.0f / std::exp2(static_cast<float>(h + 1)));
  const int k12[12] = {2, 4, 6, 8, 10, 12, 14, 16, 1, 3, 5, 7};
  for (int h = 0; h < 12; h++)
    EXPECT_FLOAT_EQ(alibi_slope(h, 12, 8.0f), 1.0f / std::pow(2.0f, 0.5f * static_cast<float>(k12[h]))) << h;
  EXPECT_FLOAT_EQ(alibi_slope(0, 1, 8.0f), 1.0f / 256.0f);
}

// With ALiBi the score of query i and key j is scale·q·k + slope·(j - i): checked on one head of
// two positions by hand, where the probabilities of query 1 are softmax(scale·q1·k0 - slope,
// scale·q1·k1).
TEST(AttentionReference, AlibiAddsSlopeTimesDistance) {
  AttentionHeads a{1, 1, 2};
  a.alibi = true;
  a.alibi_bias_max = 8.0f;  // one head: slope 1/256
  // Rows: q, k, v of positions 0 and 1.
  const std::vector<float> qkv = {0.5f, -1.0f, 1.0f, 2.0f, 3.0f, -1.0f, 1.0f, 0.25f, 0.5f, 1.0f, -2.0f, 4.0f};
  std::vector<float> out(4), lse(2);
  ref::attention_forward(out.data(), lse.data(), qkv.data(), nullptr, 1, 2, a);
  const double scale = 1.0 / std::sqrt(2.0), slope = 1.0 / 256.0;
  const double s0 = scale * (1.0 * 1.0 + 0.25 * 2.0) - slope, s1 = scale * (1.0 * 0.5 + 0.25 * 1.0);
  const double p0 = std::exp(s0) / (std::exp(s0) + std::exp(s1)), p1 = 1.0 - p0;
  EXPECT_NEAR(out[2], p0 * 3.0 + p1 * -2.0, 1e-6);
  EXPECT_NEAR(out[3], p0 * -1.0 + p1 * 4.0, 1e-6);
  EXPECT_NEAR(lse[1], std::log(std::exp(s0) + std::exp(s1)), 1e-6);
  EXPECT_NEAR(lse[0], scale * (0.5 * 1.0 + -1.0 * 2.0), 1e-6);
  EXPECT_EQ(out[0], 3.0f);
}

// The reference's own contract, which the op table holds every backend to: a 16-bit dtype means
// fp32 on logits rounded beforehand; the training form is the forward and the gradient from the
// saved lse, the gradient a value of the dtype and zero on ignored rows.
TEST(CrossEntropyReference, AmpIsFp32OnRoundedLogitsAndTheFusedFormIsForwardThenBackward) {
  const int N = 17, V = 1000;
  const auto logits = randn(static_cast<size_t>(N) * V, 1, 3.0f);
  std::vector<int32_t> targets(N);
  for (int n = 0; n < N; n++) targets[n] = (n % 3 == 1) ? kIgnoreIndex : (n * 31 + 7) % V;
  for (ComputeDtype d : {ComputeDtype::kFp32, ComputeDtype::kBf16, ComputeDtype::kFp16}) {
    SCOPED_TRACE(dtype_name(d));
    std::vector<float> losses(N), lse(N), rounded = logits, losses_rounded(N), lse_rounded(N);
    ref::crossentropy_forward(losses.data(), lse.data(), logits.data(), targets.data(), N, V, d);
    ref::round_to_dtype(rounded.data(), static_cast<long>(rounded.size()), d);
    ref::crossentropy_forward(losses_rounded.data(), lse_rounded.data(), rounded.data(), targets.data(), N, V,
                              ComputeDtype::kFp32);
    EXPECT_TRUE(losses_rounded == losses);
    EXPECT_TRUE(lse_rounded == lse);
    std::vector<float> grad(logits.size()), fused_losses(N, 99.0f), fused_grad(logits.size(), NAN);
    ref::crossentropy_backward(grad.data(), logits.data(), lse.data(), targets.data(), 0.25f, N, V, d);
    ref::crossentropy_forward_backward(fused_losses.data(), fused_grad.data(), logits.data(), targets.data(), 0.25f, N,
                                       V, d);
    EXPECT_TRUE(all_close(fused_losses.data(), losses.data(), N, kFp32Elementwise));
    EXPECT_TRUE(all_close(fused_grad.data(), grad.data(), grad.size(), kFp32Elementwise));
    std::vector<float> check = grad;
    ref::round_to_dtype(check.data(), static_cast<long>(check.size()), d);
    EXPECT_TRUE(check == grad) << "the gradient is not a value of the dtype";
    for (int n = 0; n < N; n++)
      if (targets[n] == kIgnoreIndex) {
        EXPECT_EQ(losses[n], 0.0f);
        for (int v = 0; v < V; v++) ASSERT_EQ(grad[static_cast<size_t>(n) * V + v], 0.0f);
      }
  }
}

// The vocabulary cut among ranks at multiples of kCrossentropySumBlock (tensor parallelism's
// LM head): the three slice steps, with the exchanges between them done here, give the whole
// row's losses, lse and gradient bit for bit, in fp32 and under amp, with the slices' widths
// neither equal nor multiples of 16 (their rows aligned unlike the whole row's).
bool slice_bits_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(CrossEntropySlices, CutAtSumBlocksGiveTheWholeRowsBits) {
  const int N = 13, V = 2 * kCrossentropySumBlock + 905, B = kCrossentropySumBlock;
  const auto logits = randn(static_cast<size_t>(N) * V, 5, 4.0f);
  std::vector<int32_t> targets(N);
  for (int n = 0; n < N; n++) targets[n] = n % 4 == 1 ? kIgnoreIndex : (n * 1543 + 11) % V;
  for (ComputeDtype d : {ComputeDtype::kFp32, ComputeDtype::kBf16, ComputeDtype::kFp16})
    for (const std::vector<int>& cuts : {std::vector<int>{0, 2 * B, V}, std::vector<int>{0, B, 2 * B, V}}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(d) << ", " << cuts.size() - 1 << " slices");
      std::vector<float> losses(N), lse(N), dlogits(logits.size());
      crossentropy_forward(KernelImpl::kCpu, losses.data(), lse.data(), logits.data(), targets.data(), N, V, d);
      std::vector<float> train_losses(N);
      crossentropy_forward_backward(KernelImpl::kCpu, train_losses.data(), dlogits.data(), logits.data(),
                                    targets.data(), 0.125f, N, V, d);
      const int R = static_cast<int>(cuts.size()) - 1, NB = (V + B - 1) / B;
      struct Slice { int v0, w; std::vector<float> x; std::vector<int32_t> t; };
      std::vector<Slice> slices;
      std::vector<float> shifts(N, -INFINITY), picked(N, -INFINITY);
      for (int r = 0; r < R; r++) {
        Slice s{cuts[r], cuts[r + 1] - cuts[r], {}, std::vector<int32_t>(N)};
        for (int n = 0; n < N; n++) {
          s.x.insert(s.x.end(), logits.begin() + n * V + s.v0, logits.begin() + n * V + s.v0 + s.w);
          const int t = targets[n];
          s.t[n] = t == kIgnoreIndex ? t : t >= s.v0 && t < s.v0 + s.w ? t - s.v0 : -1;
        }
        std::vector<float> m(N), p(N);
        crossentropy_slice_max(KernelImpl::kCpu, m.data(), p.data(), s.x.data(), s.t.data(), N, s.w, d);
        for (int n = 0; n < N; n++) {
          shifts[n] = std::max(shifts[n], m[n]);
          picked[n] = std::max(picked[n], p[n]);
        }
        slices.push_back(std::move(s));
      }
      for (bool training : {false, true}) {
        std::vector<float> sums(static_cast<size_t>(N) * NB);
        std::vector<std::vector<float>> exps(R);
        for (int r = 0, k0 = 0; r < R; r++) {
          const Slice& s = slices[r];
          const int nb = (s.w + B - 1) / B;
          std::vector<float> part(static_cast<size_t>(N) * nb);
          exps[r] = s.x;  // in place over the logits, as the model runs it
          crossentropy_slice_sums(KernelImpl::kCpu, part.data(), training ? exps[r].data() : nullptr, exps[r].data(),
                                  shifts.data(), N, s.w, d);
          for (int n = 0; n < N; n++)
            std::copy_n(part.begin() + n * nb, nb, sums.begin() + n * NB + k0);
          k0 += nb;
        }
        for (int r = 0; r < R; r++) {
          const Slice& s = slices[r];
          std::vector<float> l(N), e(N);
          crossentropy_slice_finish(KernelImpl::kCpu, l.data(), training ? nullptr : e.data(),
                                    training ? exps[r].data() : nullptr, sums.data(), NB, shifts.data(), picked.data(),
                                    s.t.data(), 0.125f, N, s.w, d);
          EXPECT_TRUE(slice_bits_equal(l, training ? train_losses : losses)) << "slice " << r;
          if (!training) {
            EXPECT_TRUE(slice_bits_equal(e, lse)) << "slice " << r;
            continue;
          }
          for (int n = 0; n < N; n++)
            ASSERT_TRUE(std::equal(exps[r].begin() + n * s.w, exps[r].begin() + (n + 1) * s.w,
                                   dlogits.begin() + n * V + s.v0, [](float a, float b) {
                                     return std::memcmp(&a, &b, sizeof a) == 0;
                                   }))
                << "row " << n << " of slice " << r;
        }
      }
    }
}

// Sequence parallelism's norms (Decoder::norm_backward_rows): rows split among ranks, each rank's
// added in turn (LayerNorm's weight and bias gradients in fp32, RMSNorm's as double sums added
// once), give the bits of the backward pass over all the rows, wherever the rows are cut.
TEST(NormBackward, RowsSplitAndAddedInTurnGiveTheWholeRowsBits) {
  const int N = 37, C = 70;
  const auto inp = randn(static_cast<size_t>(N) * C, 3, 2.0f), dout = randn(static_cast<size_t>(N) * C, 4);
  const auto w = randn(C, 5), b = randn(C, 6), start = randn(2 * C, 7);
  std::vector<float> out(inp.size()), mean(N), rstd(N), rms_rstd(N);
  layernorm_forward(KernelImpl::kCpu, out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
  rmsnorm_forward(KernelImpl::kCpu, out.data(), rms_rstd.data(), inp.data(), w.data(), 1e-5f, N, C);
  std::vector<float> dinp(inp.size()), ln_whole = start, rms_whole(start.begin(), start.begin() + C);
  layernorm_backward(KernelImpl::kCpu, dinp.data(), ln_whole.data(), ln_whole.data() + C, dout.data(), inp.data(),
                     w.data(), mean.data(), rstd.data(), N, C);
  rmsnorm_backward(KernelImpl::kCpu, dinp.data(), rms_whole.data(), dout.data(), inp.data(), w.data(),
                   rms_rstd.data(), N, C);
  for (const std::vector<int>& cuts : {std::vector<int>{0, 1, N}, std::vector<int>{0, 18, N},
                                       std::vector<int>{0, 5, 30, N}}) {
    SCOPED_TRACE(::testing::Message() << cuts.size() - 1 << " parts, the first of " << cuts[1] << " rows");
    std::vector<float> ln = start, rms(start.begin(), start.begin() + C);
    std::vector<double> sums(C, 0.0);
    for (size_t k = 0; k + 1 < cuts.size(); k++) {
      const size_t at = static_cast<size_t>(cuts[k]) * C;
      const int n = cuts[k + 1] - cuts[k];
      layernorm_backward(KernelImpl::kCpu, dinp.data() + at, ln.data(), ln.data() + C, dout.data() + at,
                         inp.data() + at, w.data(), mean.data() + cuts[k], rstd.data() + cuts[k], n, C);
      rmsnorm_weight_sums(KernelImpl::kCpu, sums.data(), dout.data() + at, inp.data() + at, rms_rstd.data() + cuts[k],
                          n, C);
    }
    for (int c = 0; c < C; c++) rms[c] = static_cast<float>(rms[c] + sums[c]);
    EXPECT_EQ(0, std::memcmp(ln.data(), ln_whole.data(), ln.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(rms.data(), rms_whole.data(), rms.size() * sizeof(float)));
  }
}

// RoPE's convention is Hugging Face's rotate-half: channel i pairs with i + HS/2 (not i + 1), the
// pair turned by t·theta^(-2i/HS); position 0 is left alone, and the backward undoes the forward.
TEST(RopeReference, RotatesHalvesByPositionTimesFrequency) {
  const int HS = 4, T = 2;
  std::vector<float> x = {9, 8, 7, 6,  // position 0: unchanged
                          1, 0, 0, 0};  // position 1: channel 0 pairs with channel 2, at angle 1
  const std::vector<float> x0 = x;
  ref::rope_forward(x.data(), nullptr, 1, T, HS, 1, HS, RopeFrequencies{100.0f});
  for (int c = 0; c < HS; c++) EXPECT_EQ(x[c], x0[c]);
  EXPECT_FLOAT_EQ(x[4], std::cos(1.0f));
  EXPECT_EQ(x[5], 0.0f);
  EXPECT_FLOAT_EQ(x[6], std::sin(1.0f));
  EXPECT_EQ(x[7], 0.0f);
  EXPECT_FLOAT_EQ(rope_inv_freq(RopeFrequencies{100.0f}, 1, HS), 0.1f);
  auto y = randn(3 * 50 * 64, 1), y0 = y;  // rows of 3 heads, 2 rotated
  ref::rope_forward(y.data(), nullptr, 1, 50, 3 * 64, 2, 64, RopeFrequencies{1e4f});
  EXPECT_FALSE(all_close(y.data(), y0.data(), 2 * 64 * 50, kFp32Elementwise));
  ref::rope_backward(y.data(), nullptr, 1, 50, 3 * 64, 2, 64, RopeFrequencies{1e4f});
  EXPECT_TRUE(all_close(y.data(), y0.data(), y.size(), kFp32Elementwise));
}

// Llama 3.1's rope_scaling (rope_type llama3: factor 8, low_freq_factor 1, high_freq_factor 4,
// original_max_position_embeddings 8192) on its heads of 128 and theta 5e5: the frequencies
// transformers' _compute_llama3_parameters gives (printed from it in fp32 with PyTorch 1.13), to a
// few ulps: short wavelengths kept (pairs 0-28), pairs 29-34 blended, long ones divided by 8. Linear
// scaling divides every frequency by its factor.
TEST(RopeReference, Llama3ScalingIsTransformers) {
  RopeFrequencies f{5e5f, RopeScalingKind::kLlama3, 8.0f, 1.0f, 4.0f, 8192};
  const std::pair<int, double> expected[] = {{0, 1.0},
                                             {28, 0.0032114461064338684},
                                             {29, 0.0021665706299245358},
                                             {31, 0.0008567514596506953},
                                             {34, 0.0001785077911335975},
                                             {35, 9.556212171446532e-05},
                                             {63, 3.068925877869333e-07}};
  for (const auto& [i, want] : expected) EXPECT_NEAR(rope_inv_freq(f, i, 128), want, want * 5e-7) << "pair " << i;
  const RopeFrequencies plain{5e5f}, linear{5e5f, RopeScalingKind::kLinear, 4.0f};
  EXPECT_EQ(rope_inv_freq(plain, 35, 128), 0.0007644969737157226f);
  EXPECT_FLOAT_EQ(rope_inv_freq(linear, 35, 128), 0.0007644969737157226f / 4);
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
