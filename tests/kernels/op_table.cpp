// The one table of op cases (tests/kernels/op_harness.h): every op of src/kernels over shapes
// that reach each branch of every backend (sizes of one, odd sizes, T not a multiple of the
// attention tiles, one head, GPT-2's shapes, the 50257-word vocabulary, more rows than a GPU
// grid's y extent), in each compute dtype an op takes. A new op adds its cases here.
//
// This file is built into one test binary per backend: test_kernels (the CPU kernels),
// test_gpu_ops (the GPU kernels, in a GPU build) and test_gpu_ops_emulated_32/64 (the GPU kernels
// on the emulated runtime, in the CPU build), each comparing its backend with the reference.
#include <cmath>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "device/device.h"
#include "kernels/attention.h"
#include "kernels/columns.h"
#include "kernels/crossentropy.h"
#include "kernels/encoder.h"
#include "kernels/fixed_point.h"
#include "kernels/dropout.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/moe.h"
#include "kernels/op_harness.h"
#include "kernels/optimizer.h"
#include "kernels/lora.h"
#include "kernels/residual.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/round.h"
#include "kernels/swiglu.h"

namespace anvil::testing {
namespace {

// "op_N5_C7": a test name from the op and its dimensions.
std::string case_name(const char* op, const std::vector<std::pair<const char*, long>>& dims,
                      const std::string& suffix = "") {
  std::string s = op;
  for (const auto& [letter, value] : dims) s += std::string("_") + letter + std::to_string(value);
  return suffix.empty() ? s : s + "_" + suffix;
}

std::vector<int32_t> token_ids(size_t n, int V) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; i++) t[i] = static_cast<int32_t>((i * 7 + 3) % V);
  return t;
}

// Packed examples' positions (kernels/positions.h): each sequence cut into examples of 1 to 2·len
// tokens at fixed pseudo-random places, the first starting at 0.
std::vector<int32_t> packed_positions(int B, int T, int len) {
  std::vector<int32_t> p(static_cast<size_t>(B) * T);
  for (int b = 0; b < B; b++) {
    int start = 0;
    for (int t = 0; t < T; t++) {
      if (t > start && ((t * 2654435761u + b * 97u) >> 7) % static_cast<unsigned>(len) == 0) start = t;
      p[static_cast<size_t>(b) * T + t] = t - start;
    }
  }
  return p;
}

Tolerance rounded_tolerance(ComputeDtype d) {
  return d == ComputeDtype::kBf16 ? kBf16Rounded : d == ComputeDtype::kFp16 ? kFp16Rounded : kFp32Elementwise;
}

std::vector<float> rounded(std::vector<float> v, ComputeDtype d) {
  ref::round_to_dtype(v.data(), static_cast<long>(v.size()), d);
  return v;
}

void embedding_cases(std::vector<OpCase>& cases) {
  struct Shape { int B, T, C, V; };
  // With learned positions (wpe) and without (MPT with ALiBi, Llama).
  // Learned positions counting from each packed example's start too.
  enum class Wpe { kLearned, kNone, kPacked };
  for (Shape s : {Shape{1, 1, 1, 3}, Shape{2, 5, 7, 11}, Shape{3, 17, 33, 4}, Shape{4, 64, 96, 50257}})
    for (Wpe kind : {Wpe::kLearned, Wpe::kNone, Wpe::kPacked}) {
      const bool learned = kind != Wpe::kNone, packed = kind == Wpe::kPacked;
      const size_t BT = static_cast<size_t>(s.B) * s.T, wte_n = static_cast<size_t>(s.V) * s.C;
      const std::string suffix = kind == Wpe::kNone ? "no_wpe" : packed ? "packed" : "";
      const auto dims = {std::pair<const char*, long>{"B", s.B}, {"T", s.T}, {"C", s.C}, {"V", s.V}};
      cases.push_back({case_name("encoder_forward", dims, suffix), [=](OpRun& r) {
        float* out = r.out("out", BT * s.C, close(kFp32Elementwise));
        const float* wpe = learned ? r.in("wpe", randn(s.T * s.C, 2)) : nullptr;
        const int32_t* positions = packed ? r.in("positions", packed_positions(s.B, s.T, 4)) : nullptr;
        ANVIL_RUN_OP(r, encoder_forward, out, r.in("tokens", token_ids(BT, s.V)), positions,
                     r.in("wte", randn(wte_n, 1)), wpe, s.B, s.T, s.C);
      }});
      cases.push_back({case_name("encoder_backward", dims, suffix), [=](OpRun& r) {
        // +=, every row's additions in position order on every backend: the same bits.
        float* dwte = r.inout("dwte", randn(wte_n, 4), exact());
        float* dwpe = learned ? r.inout("dwpe", randn(s.T * s.C, 5), close(kFp32Elementwise)) : nullptr;
        const int32_t* positions = packed ? r.in("positions", packed_positions(s.B, s.T, 4)) : nullptr;
        ANVIL_RUN_OP(r, encoder_backward, dwte, dwpe, r.in("dout", randn(BT * s.C, 3)),
                     r.in("tokens", token_ids(BT, s.V)), positions, s.B, s.T, s.C);
      }});
    }
  // Each element one addition: the reference's bits. 70000 rows, descending: more than a GPU
  // grid's y extent.
  for (int V : {3, 140000}) {
    const int C = 5;
    std::vector<int32_t> rows;
    for (int v = V - 1; v >= 0; v -= 2) rows.push_back(v);
    cases.push_back({case_name("add_rows", {{"V", V}, {"C", C}}), [=](OpRun& r) {
      float* table = r.inout("table", randn(static_cast<size_t>(V) * C, 1), exact());
      ANVIL_RUN_OP(r, add_rows, table, r.in("x", randn(rows.size() * C, 2)), r.in("rows", rows), rows.size(), C);
    }});
  }
}

// LayerNorm with and without bias (GPT-2's; MPT's no_bias), and RMSNorm (Llama's).
void norm_cases(std::vector<OpCase>& cases) {
  struct Shape { int N, C; };
  for (Shape s : {Shape{1, 1}, Shape{5, 7}, Shape{33, 64}, Shape{17, 768}, Shape{1000, 1024}}) {
    const size_t NC = static_cast<size_t>(s.N) * s.C;
    const auto inp = randn(NC, 1, 2.0f), w = randn(s.C, 2), b = randn(s.C, 3);
    const auto dims = {std::pair<const char*, long>{"N", s.N}, {"C", s.C}};
    for (bool bias : {true, false}) {
      const std::string variant = bias ? "" : "no_bias";
      cases.push_back({case_name("layernorm_forward", dims, variant), [=](OpRun& r) {
        float* out = r.out("out", NC, close(kFp32Reduction));
        float* mean = r.out("mean", s.N, close(kFp32Reduction));
        float* rstd = r.out("rstd", s.N, close(kFp32Reduction));
        ANVIL_RUN_OP(r, layernorm_forward, out, mean, rstd, r.in("inp", inp), r.in("weight", w),
                     bias ? r.in("bias", b) : nullptr, s.N, s.C);
      }});
      cases.push_back({case_name("layernorm_backward", dims, variant), [=](OpRun& r) {
        std::vector<float> out(NC), mean(s.N), rstd(s.N);  // the forward's saves, from the reference
        ref::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), s.N, s.C);
        float* dinp = r.inout("dinp", randn(NC, 5), close(kFp32Reduction));  // +=
        float* dw = r.inout("dweight", randn(s.C, 6), close(kFp32Reduction));
        float* db = bias ? r.inout("dbias", randn(s.C, 7), close(kFp32Reduction)) : nullptr;
        ANVIL_RUN_OP(r, layernorm_backward, dinp, dw, db, r.in("dout", randn(NC, 4)), r.in("inp", inp),
                     r.in("weight", w), r.in("mean", mean), r.in("rstd", rstd), s.N, s.C);
      }});
    }
    for (float eps : {1e-5f, 1e-6f}) {
      const std::string variant = eps == 1e-5f ? "eps1e5" : "eps1e6";
      cases.push_back({case_name("rmsnorm_forward", dims, variant), [=](OpRun& r) {
        float* out = r.out("out", NC, close(kFp32Reduction));
        float* rstd = r.out("rstd", s.N, close(kFp32Reduction));
        ANVIL_RUN_OP(r, rmsnorm_forward, out, rstd, r.in("inp", inp), r.in("weight", w), eps, s.N, s.C);
      }});
      cases.push_back({case_name("rmsnorm_backward", dims, variant), [=](OpRun& r) {
        std::vector<float> out(NC), rstd(s.N);
        ref::rmsnorm_forward(out.data(), rstd.data(), inp.data(), w.data(), eps, s.N, s.C);
        float* dinp = r.inout("dinp", randn(NC, 5), close(kFp32Reduction));  // +=
        float* dw = r.inout("dweight", randn(s.C, 6), close(kFp32Reduction));
        ANVIL_RUN_OP(r, rmsnorm_backward, dinp, dw, r.in("dout", randn(NC, 4)), r.in("inp", inp), r.in("weight", w),
                     r.in("rstd", rstd), s.N, s.C);
      }});
      cases.push_back({case_name("rmsnorm_weight_sums", dims, variant), [=](OpRun& r) {
        std::vector<float> out(NC), rstd(s.N);
        ref::rmsnorm_forward(out.data(), rstd.data(), inp.data(), w.data(), eps, s.N, s.C);
        const std::vector<float> start = randn(s.C, 6);
        double* sums = r.inout("sums", std::vector<double>(start.begin(), start.end()), close(kFp32Reduction));
        ANVIL_RUN_OP(r, rmsnorm_weight_sums, sums, r.in("dout", randn(NC, 4)), r.in("inp", inp), r.in("rstd", rstd),
                     s.N, s.C);
      }});
    }
  }
}

// Operands that are values of the dtype, as amp makes them: the CPU's bf16 products and the
// GPU's tensor-core modes then multiply exactly and accumulate in fp32, within fp32's tolerance.
void matmul_cases(std::vector<OpCase>& cases) {
  struct Shape { int N, C, OC; bool bias; };
  for (ComputeDtype d : {ComputeDtype::kFp32, ComputeDtype::kBf16, ComputeDtype::kFp16})
    for (Shape s : {Shape{1, 1, 1, true}, Shape{3, 5, 7, true}, Shape{17, 33, 65, false}, Shape{64, 96, 130, true},
                    Shape{1, 256, 1000, false},
                    // row bands: narrow outputs cut into 64- to 256-row blocks, uneven last ones
                    Shape{256, 256, 300, true}, Shape{200, 64, 520, false},
                    // GPT-2's attention input; a vocabulary's worth of outputs
                    Shape{64, 768, 2304, true}, Shape{8, 96, 50257, false}}) {
      const size_t NC = static_cast<size_t>(s.N) * s.C, W = static_cast<size_t>(s.OC) * s.C,
                   NO = static_cast<size_t>(s.N) * s.OC;
      const std::string name_dims = dtype_name(d) + std::string(s.bias ? "_bias" : "");
      cases.push_back({case_name("matmul_forward", {{"N", s.N}, {"C", s.C}, {"OC", s.OC}}, name_dims), [=](OpRun& r) {
                         MatmulContext ctx(r.impl(), d);
                         float* out = r.out("out", NO, norm(kFp32RelNorm));
                         ANVIL_RUN_OP(r, matmul_forward, ctx, out, r.in("inp", rounded(randn(NC, 1), d)),
                                      r.in("weight", rounded(randn(W, 2, 0.1f), d)),
                                      s.bias ? r.in("bias", rounded(randn(s.OC, 3), d)) : nullptr, s.N, s.C, s.OC);
                       }});
      cases.push_back({case_name("matmul_backward", {{"N", s.N}, {"C", s.C}, {"OC", s.OC}}, name_dims), [=](OpRun& r) {
                         MatmulContext ctx(r.impl(), d);
                         float* dinp = r.out("dinp", NC, norm(kFp32RelNorm));
                         float* dw = r.inout("dweight", randn(W, 5), norm(kFp32RelNorm));  // +=
                         float* db = s.bias ? r.inout("dbias", randn(s.OC, 6), close(kFp32Reduction)) : nullptr;
                         ANVIL_RUN_OP(r, matmul_backward, ctx, dinp, dw, db, r.in("dout", rounded(randn(NO, 4), d)),
                                      s.OC, r.in("inp", rounded(randn(NC, 1), d)),
                                      r.in("weight", rounded(randn(W, 2, 0.1f), d)), s.N, s.C, s.OC, false);
                       }});
    }
  // The LM head's backward a vocabulary chunk at a time: dout a block of columns of the wider
  // logits' gradient (rows ld_dout apart), the input gradient accumulated over the chunks.
  const int N = 64, C = 96, OC = 1001, chunk = 256;  // the last chunk of 233: padded on the GPU
  for (ComputeDtype d : {ComputeDtype::kFp32, ComputeDtype::kBf16})
    cases.push_back(
        {case_name("matmul_backward", {{"N", N}, {"C", C}, {"OC", OC}}, std::string("column_blocks_") + dtype_name(d)),
         [=](OpRun& r) {
           MatmulContext ctx(r.impl(), d);
           float* dinp = r.out("dinp", N * C, norm(kFp32RelNorm));
           float* dw = r.inout("dweight", std::vector<float>(OC * C, 0.0f), norm(kFp32RelNorm));
           float* db = r.inout("dbias", std::vector<float>(OC, 0.0f), close(kFp32Reduction));
           const float *inp = r.in("inp", rounded(randn(N * C, 1), d)),
                       *w = r.in("weight", rounded(randn(OC * C, 2, 0.1f), d)),
                       *dout = r.in("dout", rounded(randn(N * OC, 4), d));
           for (int o0 = 0; o0 < OC; o0 += chunk) {
             const size_t rows = static_cast<size_t>(o0) * C;
             ANVIL_RUN_OP(r, matmul_backward, ctx, dinp, dw + rows, db + o0, dout + o0, OC, inp, w + rows, N, C,
                          std::min(chunk, OC - o0), o0 > 0);
           }
         }});
  // A held weight (the tied LM head: MatmulContext::hold_weight), in the products of both passes
  // with the whole of it, as the GPU's head runs them; the CPU's bf16 products use their packed
  // copy, the GPU's 16-bit products their 16-bit copy (an odd vocabulary: padded to a multiple of 8 rows).
  for (ComputeDtype d : {ComputeDtype::kBf16, ComputeDtype::kFp16})
    for (int V : {OC - 1, OC})
      cases.push_back({case_name("matmul_held_weight", {{"N", N}, {"C", C}, {"OC", V}}, dtype_name(d)), [=](OpRun& r) {
                         MatmulContext ctx(r.impl(), d);
                         const float *inp = r.in("inp", rounded(randn(N * C, 1), d)),
                                     *w = r.in("weight", rounded(randn(V * C, 2, 0.1f), d)),
                                     *dout = r.in("dout", rounded(randn(N * V, 4), d));
                         float* out = r.out("out", N * V, norm(kFp32RelNorm));
                         float* dinp = r.out("dinp", N * C, norm(kFp32RelNorm));
                         ctx.hold_weight(w, V, C);
                         ANVIL_RUN_OP(r, matmul_forward, ctx, out, inp, w, nullptr, N, C, V);
                         ANVIL_RUN_OP(r, matmul_backward, ctx, dinp, nullptr, nullptr, dout, V, inp, w, N, C, V, false);
                         ctx.release_weight();
                       }});
  // A frozen weight (LoRA's base): no weight gradient, the input gradient added to one there.
  cases.push_back({case_name("matmul_backward", {{"N", 37}, {"C", 48}, {"OC", 80}}, "frozen_weight"), [=](OpRun& r) {
                     MatmulContext ctx(r.impl());
                     float* dinp = r.inout("dinp", randn(37 * 48, 7), norm(kFp32RelNorm));
                     ANVIL_RUN_OP(r, matmul_backward, ctx, dinp, nullptr, nullptr, r.in("dout", randn(37 * 80, 4)), 80,
                                  r.in("inp", randn(37 * 48, 1)), r.in("weight", randn(80 * 48, 2, 0.1f)), 37, 48, 80,
                                  true);
                   }});
}

void elementwise_cases(std::vector<OpCase>& cases) {
  for (long n : {1L, 7L, 13L, 4099L, 1L << 20}) {
    const auto x = randn(n, 1, 3.0f), y = randn(n, 2), dout = randn(n, 3);
    // fp32, and the outputs rounded to each 16-bit dtype (every value one of the dtype's).
    for (GeluForm form : {GeluForm::kTanh, GeluForm::kErf})
      for (ComputeDtype d : {ComputeDtype::kFp32, ComputeDtype::kBf16, ComputeDtype::kFp16}) {
        const std::string variant = std::string(form == GeluForm::kTanh ? "tanh" : "erf") +
                                    (d == ComputeDtype::kFp32 ? "" : std::string("_") + dtype_name(d));
        Check check = close(rounded_tolerance(d));
        check.values_of = d;
        cases.push_back({case_name("gelu_forward", {{"N", n}}, variant), [=](OpRun& r) {
          ANVIL_RUN_OP(r, gelu_forward, r.out("out", n, check), r.in("inp", x), n, form, d);
        }});
        cases.push_back({case_name("gelu_backward", {{"N", n}}, variant), [=](OpRun& r) {
          ANVIL_RUN_OP(r, gelu_backward, r.out("dinp", n, check), r.in("inp", x), r.in("dout", dout), n, form, d);
        }});
      }
    for (float p : {0.1f, 0.5f}) {
      // Whole sequences of n elements, numbered from 7 in the step's batch: the same bits on every
      // backend (an integer hash and one product per element).
      const DropoutSite site{dropout_key(11, 4, 1, DropoutKind::kMlpOutput), 7, p};
      cases.push_back({case_name("dropout_apply", {{"B", 2}, {"n", n}, {"pct", std::lround(100 * p)}}), [=](OpRun& r) {
        float* out = r.out("out", 2 * n, exact());
        ANVIL_RUN_OP(r, dropout_apply, out, r.in("x", randn(2 * n, 4)), 2, n, site);
      }});
    }
    cases.push_back({case_name("residual_forward", {{"N", n}}), [=](OpRun& r) {
      float* out = r.out("out", n, close(kFp32Elementwise));
      ANVIL_RUN_OP(r, residual_forward, out, r.in("a", x), r.in("b", y), n);
    }});
    cases.push_back({case_name("residual_backward", {{"N", n}}), [=](OpRun& r) {
      float* da = r.inout("da", randn(n, 4), close(kFp32Elementwise));  // +=
      float* db = r.inout("db", randn(n, 5), close(kFp32Elementwise));
      ANVIL_RUN_OP(r, residual_backward, da, db, r.in("dout", dout), n);
    }});
  }
  // A LoRA branch joining columns [3, 3 + cols) of a product's rows of ld, and its gradient read
  // back; a whole row (cols = ld) too.
  for (auto [N, cols, ld] : {std::tuple{1, 1, 1}, std::tuple{37, 8, 24}, std::tuple{129, 768, 2304}}) {
    const int col0 = cols == ld ? 0 : 3;
    const size_t n_out = static_cast<size_t>(N) * ld, n_delta = static_cast<size_t>(N) * cols;
    const auto dims = {std::pair<const char*, long>{"N", N}, {"cols", cols}, {"ld", ld}};
    cases.push_back({case_name("lora_delta_forward", dims), [=](OpRun& r) {
      float* out = r.inout("out", randn(n_out, 1), close(kFp32Elementwise));  // += on the block
      ANVIL_RUN_OP(r, lora_delta_forward, out + col0, ld, r.in("delta", randn(n_delta, 2)), N, cols, 0.5f);
    }});
    cases.push_back({case_name("lora_delta_backward", dims), [=](OpRun& r) {
      float* ddelta = r.out("ddelta", n_delta, close(kFp32Elementwise));
      ANVIL_RUN_OP(r, lora_delta_backward, ddelta, r.in("dout", randn(n_out, 3)) + col0, ld, N, cols, 2.0f);
    }});
  }
  // Columns [5, 5 + cols) of rows of ld_src copied out to rows of their own, and back into rows of
  // ld_dst; whole rows too; an odd width from the start of aligned rows (the GPU's padded LM head
  // output); and 4 blocks of columns side by side, each to a block of rows of its own (Qwen3's
  // heads).
  for (auto [N, cols, ld, parts] : {std::tuple{1, 1, 1, 1}, std::tuple{37, 8, 24, 1}, std::tuple{129, 768, 1536, 1},
                                    std::tuple{9, 13, 16, 1}, std::tuple{37, 8, 40, 4}}) {
    const int col0 = cols == ld || cols % 4 != 0 ? 0 : 5;
    const size_t block = static_cast<size_t>(N) * cols;
    const auto dims = {std::pair<const char*, long>{"N", N}, {"cols", cols}, {"ld", ld}, {"parts", parts}};
    cases.push_back({case_name("copy_columns_out", dims), [=](OpRun& r) {
      float* dst = r.out("dst", parts * block, exact());
      ANVIL_RUN_OP(r, copy_columns, dst, cols, block, r.in("src", randn(static_cast<size_t>(N) * ld, 6)) + col0, ld,
                   cols, N, cols, parts);
    }});
    cases.push_back({case_name("copy_columns_in", dims), [=](OpRun& r) {
      // Only the blocks are written: the rest of each row keeps its values.
      float* dst = r.inout("dst", randn(static_cast<size_t>(N) * ld, 7), exact());
      ANVIL_RUN_OP(r, copy_columns, dst + col0, ld, cols, r.in("src", randn(parts * block, 8)), cols, block, N, cols,
                   parts);
    }});
  }
  // RoPE on the query and key heads of fused qkv rows (the value heads untouched), at positions
  // up to 2048 where an angle's rounding would show; head dimensions 2, 64 and 128; theta 1e4 and
  // Llama 3's 5e5, with Llama 3.1's scaling and a linear one. Packed examples' positions on one shape.
  const RopeFrequencies llama31{5e5f, RopeScalingKind::kLlama3, 8.0f, 1.0f, 4.0f, 8192};
  const RopeFrequencies linear{1e4f, RopeScalingKind::kLinear, 4.0f};
  struct RopeShape { int B, T, heads, kv_heads, HS; RopeFrequencies freqs; bool packed; };
  for (RopeShape s : {RopeShape{1, 1, 1, 1, 2, {1e4f}, false}, RopeShape{2, 37, 4, 2, 64, {1e4f}, false},
                      RopeShape{1, 130, 3, 1, 128, {5e5f}, false}, RopeShape{1, 2048, 2, 2, 64, {1e4f}, false},
                      RopeShape{1, 2048, 2, 1, 128, llama31, false}, RopeShape{2, 37, 4, 2, 64, linear, false},
                      RopeShape{2, 37, 4, 2, 64, {1e4f}, true}}) {
    const int row_stride = (s.heads + 2 * s.kv_heads) * s.HS, rotated = s.heads + s.kv_heads;
    const size_t n = static_cast<size_t>(s.B) * s.T * row_stride;
    const auto dims = {std::pair<const char*, long>{"B", s.B}, {"T", s.T}, {"NH", s.heads}, {"KV", s.kv_heads},
                       {"HS", s.HS}, {"theta", static_cast<long>(s.freqs.theta)}};
    const std::string suffix = std::string(s.packed ? "packed" : "") +
                               (s.freqs.scaling == RopeScalingKind::kLlama3   ? "llama3"
                                : s.freqs.scaling == RopeScalingKind::kLinear ? "linear"
                                                                              : "");
    cases.push_back({case_name("rope_forward", dims, suffix), [=](OpRun& r) {
      const int32_t* positions = s.packed ? r.in("positions", packed_positions(s.B, s.T, 5)) : nullptr;
      ANVIL_RUN_OP(r, rope_forward, r.inout("qkv", randn(n, 1), close(kFp32Elementwise)), positions, s.B, s.T,
                   row_stride, rotated, s.HS, s.freqs);
    }});
    cases.push_back({case_name("rope_backward", dims, suffix), [=](OpRun& r) {
      const int32_t* positions = s.packed ? r.in("positions", packed_positions(s.B, s.T, 5)) : nullptr;
      ANVIL_RUN_OP(r, rope_backward, r.inout("dqkv", randn(n, 2), close(kFp32Elementwise)), positions, s.B, s.T,
                   row_stride, rotated, s.HS, s.freqs);
    }});
  }
  // Llama's MLP activation over (N, 2F) rows of gate | up.
  struct SwigluShape { int N, F; };
  for (SwigluShape s : {SwigluShape{1, 1}, SwigluShape{3, 7}, SwigluShape{33, 1000}, SwigluShape{64, 2752}}) {
    const size_t NF = static_cast<size_t>(s.N) * s.F;
    const auto inp = randn(2 * NF, 1, 3.0f);
    for (ComputeDtype d : {ComputeDtype::kFp32, ComputeDtype::kBf16, ComputeDtype::kFp16}) {
      const std::string variant = d == ComputeDtype::kFp32 ? "" : dtype_name(d);
      Check check = close(rounded_tolerance(d));
      check.values_of = d;
      cases.push_back({case_name("swiglu_forward", {{"N", s.N}, {"F", s.F}}, variant), [=](OpRun& r) {
        ANVIL_RUN_OP(r, swiglu_forward, r.out("out", NF, check), r.in("inp", inp), s.N, s.F, d);
      }});
      cases.push_back({case_name("swiglu_backward", {{"N", s.N}, {"F", s.F}}, variant), [=](OpRun& r) {
        ANVIL_RUN_OP(r, swiglu_backward, r.out("dinp", 2 * NF, check), r.in("inp", inp), r.in("dout", randn(NF, 2)),
                     s.N, s.F, d);
      }});
    }
  }
  // Rounding is exact, over normal, subnormal, overflowing, tie and NaN inputs.
  std::vector<float> x = randn(1 << 16, 1, 100.0f);
  for (float v : {0.0f, -0.0f, 1e-8f, 6e-8f, 3e-5f, 65519.0f, 65520.0f, 1e30f, INFINITY, NAN, 1.00390625f,
                  1.01171875f})
    x.push_back(v);
  for (size_t i = 0; i < 4096; i++) x.push_back(x[i] * 1e-6f);
  for (ComputeDtype d : {ComputeDtype::kBf16, ComputeDtype::kFp16})
    cases.push_back({case_name("round_to_dtype", {{"N", static_cast<long>(x.size())}}, dtype_name(d)), [=](OpRun& r) {
      ANVIL_RUN_OP(r, round_to_dtype, r.inout("x", x, exact()), static_cast<long>(x.size()), d);
    }});
  // From an element off 16 bytes, over a length no multiple of 4: the GPU's single accesses.
  cases.push_back({case_name("round_to_dtype", {{"N", static_cast<long>(x.size()) - 3}}, "bf16_unaligned"),
                   [=](OpRun& r) {
                     float* all = r.inout("x", x, exact());
                     ANVIL_RUN_OP(r, round_to_dtype, all + 1, static_cast<long>(x.size()) - 3, ComputeDtype::kBf16);
                   }});
  // Widening every bf16 bit pattern (NaNs, infinities and subnormals included) is exact.
  std::vector<uint16_t> bf16(1 << 16);
  for (size_t i = 0; i < bf16.size(); i++) bf16[i] = static_cast<uint16_t>(i);
  cases.push_back({case_name("widen_bf16", {{"N", 1 << 16}}), [=](OpRun& r) {
    ANVIL_RUN_OP(r, widen_bf16, r.out("out", bf16.size(), exact()), r.in("in", bf16), static_cast<long>(bf16.size()));
  }});
}

// An attention case's shape, the options it sets, and its name's dimensions.
struct AttentionShape {
  int B, T;
  AttentionHeads heads;
  int packed = 0;  // > 0: examples packed in each sequence, of about this many tokens
};
AttentionHeads mha(int n_heads, int head_size) { return AttentionHeads{n_heads, n_heads, head_size}; }
AttentionHeads alibi(AttentionHeads a, float bias_max) {
  a.alibi = true;
  a.alibi_bias_max = bias_max;
  return a;
}
// Mistral's sliding window of w keys.
AttentionHeads window(AttentionHeads a, int w) {
  a.window = w;
  return a;
}
// Attention dropout at p, its sequences numbered from 5 in the step's batch.
AttentionHeads dropout(AttentionHeads a, float p) {
  a.dropout = {dropout_key(11, 3, 2, DropoutKind::kAttention), 5, p};
  return a;
}
std::vector<std::pair<const char*, long>> attention_dims(const AttentionShape& s) {
  const AttentionHeads& a = s.heads;
  std::vector<std::pair<const char*, long>> dims = {
      {"B", s.B}, {"T", s.T}, {"NH", a.n_heads}, {"NKV", a.n_kv_heads}, {"HS", a.head_size}};
  if (a.alibi) dims.push_back({"alibi", static_cast<long>(a.alibi_bias_max)});
  if (a.dropout.active()) dims.push_back({"dropout_pct", std::lround(100 * a.dropout.p)});
  if (a.window) dims.push_back({"window", a.window});
  if (s.packed) dims.push_back({"packed", s.packed});
  return dims;
}

void attention_cases(std::vector<OpCase>& cases) {
  using Shape = AttentionShape;
  // T=1; T below, equal to, and not a multiple of the 64-query blocks; one head; HS from 2 to
  // 256; GPT-2's twelve heads of 64. Grouped-query heads (two groups of three; Llama's four per
  // key/value head) and multi-query; ALiBi with a power-of-two head count, with twelve heads
  // (MPT-125M's, slopes interleaved from sixteen) and with grouped-query heads. Sliding windows
  // shorter than a query block, across blocks, of one key, inside packed examples, with ALiBi and
  // dropout.
  for (Shape s : {Shape{1, 1, mha(1, 4)}, Shape{1, 5, mha(2, 4)}, Shape{2, 33, mha(1, 16)}, Shape{2, 70, mha(3, 8)},
                  Shape{1, 64, mha(4, 8)}, Shape{1, 100, mha(2, 64)}, Shape{2, 130, mha(3, 32)},
                  Shape{1, 129, mha(1, 256)}, Shape{2, 256, mha(12, 64)}, Shape{2, 70, {6, 2, 8}},
                  Shape{1, 130, {8, 2, 16}}, Shape{2, 65, {4, 1, 16}}, Shape{1, 1, {3, 1, 4}},
                  Shape{2, 70, alibi(mha(4, 8), 8)}, Shape{1, 130, alibi(mha(12, 16), 8)},
                  Shape{2, 33, alibi({6, 3, 8}, 16)}, Shape{2, 70, dropout(mha(3, 8), 0.1f)},
                  Shape{2, 130, dropout(alibi({4, 2, 16}, 8), 0.5f)}, Shape{2, 70, mha(3, 8), 9},
                  Shape{1, 130, alibi({8, 2, 16}, 8), 20}, Shape{2, 65, dropout({4, 1, 16}, 0.1f), 6},
                  Shape{2, 130, window({4, 2, 16}, 17)}, Shape{1, 200, window(mha(2, 64), 100)},
                  Shape{1, 70, window(mha(2, 8), 1)}, Shape{2, 70, window(mha(3, 8), 5), 9},
                  Shape{2, 130, dropout(window(alibi({4, 2, 16}, 8), 40), 0.1f)}}) {
    const AttentionHeads& a = s.heads;
    const size_t BT = static_cast<size_t>(s.B) * s.T, L = static_cast<size_t>(s.B) * a.n_heads * s.T;
    const auto qkv = randn(BT * a.qkv_channels(), 1);
    const auto dims = attention_dims(s);
    const std::vector<int32_t> pos = s.packed ? packed_positions(s.B, s.T, s.packed) : std::vector<int32_t>();
    cases.push_back({case_name("attention_forward", dims), [=](OpRun& r) {
      float* out = r.out("out", BT * a.q_channels(), close(kFp32Reduction));
      float* lse = r.out("lse", L, close(kFp32Reduction));
      ANVIL_RUN_OP(r, attention_forward, out, lse, r.in("qkv", qkv), s.packed ? r.in("positions", pos) : nullptr,
                   s.B, s.T, a);
    }});
    cases.push_back({case_name("attention_backward", dims), [=](OpRun& r) {
      std::vector<float> out(BT * a.q_channels()), lse(L);  // the forward's, from the reference
      ref::attention_forward(out.data(), lse.data(), qkv.data(), s.packed ? pos.data() : nullptr, s.B, s.T, a);
      Check dqkv_check = norm(kFp32RelNorm);
      dqkv_check.close = kFp32Reduction;
      float* dqkv = r.out("dqkv", BT * a.qkv_channels(), dqkv_check);
      ANVIL_RUN_OP(r, attention_backward, dqkv, r.in("dout", randn(BT * a.q_channels(), 2)), r.in("qkv", qkv),
                   r.in("out", out), r.in("lse", lse), s.packed ? r.in("positions", pos) : nullptr, s.B, s.T, a);
    }});
  }
}

// 16-bit operands (amp_bf16/amp_fp16): q, k, v and dout hold values of the dtype, and the GPU's
// flash kernels round probabilities and score gradients to it too. Every head size they are built
// for; T below, at and across the 64-row blocks; grouped-query and multi-query heads; ALiBi;
// dropout; packed examples. ref and cpu compute in fp32, so their results stand for the exact ones.
void attention_16bit_cases(std::vector<OpCase>& cases) {
  using Shape = AttentionShape;
  for (ComputeDtype d : {ComputeDtype::kBf16, ComputeDtype::kFp16})
    for (Shape s : {Shape{1, 1, {1, 1, 16}}, Shape{2, 70, {3, 3, 16}}, Shape{1, 64, {2, 2, 32}},
                    Shape{1, 130, alibi({4, 2, 32}, 8)}, Shape{2, 65, dropout({4, 1, 64}, 0.1f), 6},
                    Shape{1, 129, {2, 2, 64}, 20}, Shape{1, 100, alibi({2, 1, 128}, 8)},
                    Shape{1, 200, window({4, 2, 64}, 70)}, Shape{2, 130, window({2, 2, 32}, 1)},
                    // tiles wholly visible inside a window and inside long packed examples
                    Shape{1, 256, window({2, 2, 64}, 100)}, Shape{1, 256, {2, 2, 64}, 150}}) {
      AttentionHeads a = s.heads;
      a.operands = d;
      const size_t BT = static_cast<size_t>(s.B) * s.T, L = static_cast<size_t>(s.B) * a.n_heads * s.T;
      const auto qkv = rounded(randn(BT * a.qkv_channels(), 1), d);
      const auto dout = rounded(randn(BT * a.q_channels(), 2), d);
      const auto dims = attention_dims(s);
      const std::vector<int32_t> pos = s.packed ? packed_positions(s.B, s.T, s.packed) : std::vector<int32_t>();
      const double tol = d == ComputeDtype::kBf16 ? kBf16AttentionRelNorm : kFp16AttentionRelNorm;
      cases.push_back({case_name("attention_forward", dims, dtype_name(d)), [=](OpRun& r) {
        float* out = r.out("out", BT * a.q_channels(), norm(tol));
        float* lse = r.out("lse", L, close(kFp32Reduction));
        ANVIL_RUN_OP(r, attention_forward, out, lse, r.in("qkv", qkv), s.packed ? r.in("positions", pos) : nullptr,
                     s.B, s.T, a);
      }});
      cases.push_back({case_name("attention_backward", dims, dtype_name(d)), [=](OpRun& r) {
        std::vector<float> out(BT * a.q_channels()), lse(L);
        ref::attention_forward(out.data(), lse.data(), qkv.data(), s.packed ? pos.data() : nullptr, s.B, s.T, a);
        float* dqkv = r.out("dqkv", BT * a.qkv_channels(), norm(tol));
        ANVIL_RUN_OP(r, attention_backward, dqkv, r.in("dout", dout), r.in("qkv", qkv), r.in("out", out),
                     r.in("lse", lse), s.packed ? r.in("positions", pos) : nullptr, s.B, s.T, a);
      }});
    }
}

// In fp32 and with the amp rounding of logits (read) and gradient (written) in bf16 and fp16;
// every third target ignored.
void crossentropy_cases(std::vector<OpCase>& cases) {
  struct Shape { int N, V; };
  for (ComputeDtype d : {ComputeDtype::kFp32, ComputeDtype::kBf16, ComputeDtype::kFp16})
    for (Shape s : {Shape{1, 1}, Shape{3, 5}, Shape{17, 1000}, Shape{4, 50257}, Shape{64, 50257}}) {
      const size_t NV = static_cast<size_t>(s.N) * s.V;
      const auto logits = randn(NV, 1, 3.0f);
      std::vector<int32_t> targets(s.N);
      for (int n = 0; n < s.N; n++) targets[n] = (n % 3 == 1) ? kIgnoreIndex : (n * 31 + 7) % s.V;
      cases.push_back({case_name("crossentropy_forward", {{"N", s.N}, {"V", s.V}}, dtype_name(d)), [=](OpRun& r) {
        float* losses = r.out("losses", s.N, close(kFp32Reduction));
        float* lse = r.out("lse", s.N, close(kFp32Reduction));
        ANVIL_RUN_OP(r, crossentropy_forward, losses, lse, r.in("logits", logits), r.in("targets", targets), s.N, s.V,
                     d);
      }});
      // The training form, into its own array and in place over the logits (as the model runs it).
      Check gradient = close(rounded_tolerance(d));
      gradient.values_of = d;
      for (bool in_place : {false, true})
        cases.push_back({case_name("crossentropy_forward_backward", {{"N", s.N}, {"V", s.V}},
                                   dtype_name(d) + std::string(in_place ? "_in_place" : "")),
                         [=](OpRun& r) {
                           float* losses = r.out("losses", s.N, close(kFp32Reduction));
                           float* dlogits = in_place ? r.inout("logits", logits, gradient) : r.out("dlogits", NV, gradient);
                           const float* x = in_place ? dlogits : r.in("logits", logits);
                           ANVIL_RUN_OP(r, crossentropy_forward_backward, losses, dlogits, x, r.in("targets", targets),
                                        0.25f, s.N, s.V, d);
                         }});
    }
}

// The vocabulary-parallel steps on one rank's columns: targets in them, elsewhere (-1) or
// ignored; each step's inputs are the reference's results of the steps before.
void crossentropy_slice_cases(std::vector<OpCase>& cases) {
  struct Shape { int N, V; };
  for (ComputeDtype d : {ComputeDtype::kFp32, ComputeDtype::kBf16, ComputeDtype::kFp16})
    for (Shape s : {Shape{1, 1}, Shape{5, 7}, Shape{9, 4200}, Shape{4, 2048}}) {
      const size_t NV = static_cast<size_t>(s.N) * s.V;
      const int NB = (s.V + kCrossentropySumBlock - 1) / kCrossentropySumBlock;
      const auto logits = randn(NV, 3, 3.0f);
      std::vector<int32_t> targets(s.N);
      for (int n = 0; n < s.N; n++) targets[n] = n % 3 == 1 ? kIgnoreIndex : n % 3 == 2 ? -1 : (n * 31 + 7) % s.V;
      std::vector<float> maxes(s.N), picked(s.N), sums(static_cast<size_t>(s.N) * NB), exps(NV);
      ref::crossentropy_slice_max(maxes.data(), picked.data(), logits.data(), targets.data(), s.N, s.V, d);
      ref::crossentropy_slice_sums(sums.data(), exps.data(), logits.data(), maxes.data(), s.N, s.V, d);
      // After the exchange a row whose target another rank holds has that rank's logit.
      std::vector<float> picked_everywhere = picked;
      for (int n = 0; n < s.N; n++)
        if (targets[n] == -1) picked_everywhere[n] = 1.5f;
      const std::string shape = case_name("", {{"N", s.N}, {"V", s.V}}, dtype_name(d));
      cases.push_back({"crossentropy_slice_max" + shape, [=](OpRun& r) {
        float* m = r.out("maxes", s.N, exact());
        float* p = r.out("picked", s.N, exact());
        ANVIL_RUN_OP(r, crossentropy_slice_max, m, p, r.in("logits", logits), r.in("targets", targets), s.N, s.V, d);
      }});
      for (bool training : {false, true})
        cases.push_back({"crossentropy_slice_sums" + shape + (training ? "_exps" : ""), [=](OpRun& r) {
          float* sum = r.out("sums", sums.size(), close(kFp32Reduction));
          float* e = training ? r.out("exps", NV, close(kFp32Elementwise)) : nullptr;
          ANVIL_RUN_OP(r, crossentropy_slice_sums, sum, e, r.in("logits", logits), r.in("shifts", maxes), s.N, s.V, d);
        }});
      Check gradient = close(rounded_tolerance(d));
      gradient.values_of = d;
      for (bool training : {false, true})
        cases.push_back({"crossentropy_slice_finish" + shape + (training ? "_training" : ""), [=](OpRun& r) {
          float* losses = r.out("losses", s.N, close(kFp32Reduction));
          float* lse = training ? nullptr : r.out("lse", s.N, close(kFp32Reduction));
          float* dlogits = training ? r.inout("dlogits", exps, gradient) : nullptr;
          ANVIL_RUN_OP(r, crossentropy_slice_finish, losses, lse, dlogits, r.in("sums", sums), NB,
                       r.in("shifts", maxes), r.in("picked", picked_everywhere), r.in("targets", targets), 0.25f, s.N,
                       s.V, d);
        }});
    }
}

// The optimizer's and deterministic training's ops. The CPU's AdamW and sums give the
// reference's bits; the GPU may contract AdamW's moment updates into fused multiply-adds.
// AdamW's tensors over n elements: sizes of 1 to about n/3 (a GPU block's 256 elements spanning
// several tensors, and tensors spanning many blocks), decaying or not, each at its own exponent, a
// gap between some (elements no tensor covers stay as they were).
std::vector<AdamWTensor> adamw_tensors(size_t n) {
  std::vector<AdamWTensor> t;
  for (size_t at = 0, k = 0; at < n; k++) {
    const size_t count = std::min(n - at, k % 4 == 1 ? size_t{1} : 1 + (k * 7919 + 13) % (n / 3 + 1));
    t.push_back({at, count, k % 3 ? 0.999f : 1.0f, 8 + static_cast<int32_t>(k % 5)});
    at += count + (k % 4 == 2 ? 3 : 0);
  }
  return t;
}

void optimizer_cases(std::vector<OpCase>& cases) {
  const AdamWStep step{0.9f, 0.95f, 1e-8f, 1e-3f, 0.3f, 0.25f};
  Check adamw = close(kFp32Elementwise);
  adamw.bits_on_cpu = true;
  for (long n : {1L, 7L, 1000L, 1L << 20}) {
    auto v = randn(n, 8);
    for (float& e : v) e = e * e;  // a second moment is not negative
    const std::vector<AdamWTensor> tensors = adamw_tensors(n);
    cases.push_back({case_name("adamw_update", {{"N", n}, {"tensors", static_cast<long>(tensors.size())}}),
                     [=](OpRun& r) {
                       ANVIL_RUN_OP(r, adamw_update, r.inout("p", randn(n, 6), adamw), r.in("g", randn(n, 3)),
                                    r.inout("m", randn(n, 7, 0.1f), adamw), r.inout("v", v, adamw), n,
                                    r.in("tensors", tensors), static_cast<int>(tensors.size()), step);
                     }});
    Check sum = close(kFp32Reduction);
    sum.bits_on_cpu = true;
    cases.push_back({case_name("sum_of_squares", {{"N", n}}), [=](OpRun& r) {
      r.result("sum", ANVIL_RUN_OP(r, sum_of_squares, r.in("x", randn(n, 1)), n), sum);
    }});
    for (bool finite : {true, false}) {
      std::vector<float> x = randn(n, 2);
      if (!finite) x[n / 2] = n % 2 ? INFINITY : NAN;
      cases.push_back({case_name("scale_values_check_finite", {{"N", n}}, finite ? "finite" : "not_finite"),
                       [=](OpRun& r) {
                         r.result("finite", ANVIL_RUN_OP(r, scale_values_check_finite, r.inout("x", x, exact()), n,
                                                         0.3f),
                                  exact());
                       }});
    }
  }
  // Odd sizes (partial blocks), and 2·1800·37 values for the CPU's threaded sum of squares.
  struct Shape { size_t rows, row_len; };
  for (Shape s : {Shape{300, 769}, Shape{1800, 37}}) {
    const size_t n = s.rows * s.row_len;
    std::vector<float> x = randn(n, 31, 0.01f);
    x[n / 3] = 0.75f;  // the largest
    std::vector<int32_t> touched;
    for (int row = 0; row < static_cast<int>(s.rows); row += 7) touched.push_back(row);
    const int e = fixed_point_scale(0.75f, 64);
    std::vector<int64_t> acc(n);
    for (size_t i = 0; i < n; i++) acc[i] = static_cast<int64_t>(i * 977) - 5000000;
    const auto dims = {std::pair<const char*, long>{"rows", static_cast<long>(s.rows)},
                       {"row_len", static_cast<long>(s.row_len)}};
    cases.push_back({case_name("fixed_point_accumulate", dims), [=](OpRun& r) {
      float* max_abs = r.inout("max_abs", std::vector<float>{0.0f}, exact());
      ANVIL_RUN_OP(r, fixed_point_accumulate, r.inout("acc", acc, exact()), r.inout("x", x, exact()), n, 1, 0, e,
                   max_abs, true);
    }});
    // Three sequences' contributions at once, spans apart with untouched values between them.
    cases.push_back({case_name("fixed_point_accumulate", dims, "copies"), [=](OpRun& r) {
      float* max_abs = r.inout("max_abs", std::vector<float>{0.0f}, exact());
      ANVIL_RUN_OP(r, fixed_point_accumulate, r.inout("acc", acc, exact()), r.inout("x", x, exact()), n / 4, 3, n / 3,
                   e, max_abs, true);
    }});
    // The same, the contributions written (not cleared after).
    cases.push_back({case_name("fixed_point_accumulate", dims, "copies_kept"), [=](OpRun& r) {
      float* max_abs = r.inout("max_abs", std::vector<float>{0.0f}, exact());
      ANVIL_RUN_OP(r, fixed_point_accumulate, r.inout("acc", acc, exact()), r.inout("x", x, exact()), n / 4, 3, n / 3,
                   e, max_abs, false);
    }});
    // A length that leaves a partial last block, and arrays starting off 16-byte alignment.
    cases.push_back({case_name("fixed_point_accumulate", dims, "tail"), [=](OpRun& r) {
      float* max_abs = r.inout("max_abs", std::vector<float>{0.0f}, exact());
      ANVIL_RUN_OP(r, fixed_point_accumulate, r.inout("acc", acc, exact()), r.inout("x", x, exact()), n - 3, 1, 0, e,
                   max_abs, true);
    }});
    cases.push_back({case_name("fixed_point_accumulate", dims, "unaligned"), [=](OpRun& r) {
      float* max_abs = r.inout("max_abs", std::vector<float>{0.0f}, exact());
      ANVIL_RUN_OP(r, fixed_point_accumulate, r.inout("acc", acc, exact()) + 1, r.inout("x", x, exact()) + 1, n - 2,
                   1, 0, e, max_abs, true);
    }});
    cases.push_back({case_name("fixed_point_accumulate_rows", dims), [=](OpRun& r) {
      float* max_abs = r.inout("max_abs", std::vector<float>{0.0f}, exact());
      ANVIL_RUN_OP(r, fixed_point_accumulate_rows, r.inout("acc", acc, exact()), r.inout("x", x, exact()),
                   r.in("rows", touched), touched.size(), s.row_len, e, max_abs);
    }});
    cases.push_back({case_name("fixed_point_add_arrays", dims), [=](OpRun& r) {
      ANVIL_RUN_OP(r, fixed_point_add_arrays, r.inout("acc", acc, exact()), r.in("x", acc), n);
    }});
    // One range, and a gradient's many: empty ranges at the start, inside and at the end, ranges
    // inside one GPU chunk (4,096 values) and across several, starts on a chunk's first value.
    for (size_t len : {size_t{0}, size_t{1}, size_t{1000}, n})
      cases.push_back({case_name("fixed_point_squares", {{"N", static_cast<long>(len)}}, std::to_string(s.rows)), [=](OpRun& r) {
        auto* squares = r.inout("squares", std::vector<unsigned __int128>{123}, exact());
        ANVIL_RUN_OP(r, fixed_point_squares, r.in("acc", acc), len, r.in("bounds", std::vector<size_t>{0, len}), 1,
                     squares);
      }});
    const std::vector<size_t> bounds = {0, 0, 1, 768, 769, 4096, 4096, 8192, 20000, 20001, n - 1, n, n};
    cases.push_back({case_name("fixed_point_squares", {{"N", static_cast<long>(n)}}, "tensors"), [=](OpRun& r) {
      auto* squares = r.inout("squares", std::vector<unsigned __int128>(bounds.size() - 1, 123), exact());
      ANVIL_RUN_OP(r, fixed_point_squares, r.in("acc", acc), n, r.in("bounds", bounds), bounds.size() - 1, squares);
    }});
    std::vector<AdamWTensor> tensors = adamw_tensors(n);
    for (AdamWTensor& t : tensors) t.exponent += e - 10;
    cases.push_back({case_name("adamw_update_fixed", dims), [=](OpRun& r) {
      ANVIL_RUN_OP(r, adamw_update_fixed, r.inout("p", std::vector<float>(n, 1.0f), adamw), r.in("acc", acc),
                   r.inout("m", std::vector<float>(n, 0.1f), adamw), r.inout("v", std::vector<float>(n, 0.01f), adamw),
                   n, r.in("tensors", tensors), static_cast<int>(tensors.size()), step);
    }});
  }
  // A NaN is infinity in the maximum (which tells the caller that the sums are void).
  cases.push_back({"fixed_point_accumulate_nan", [](OpRun& r) {
    float* max_abs = r.inout("max_abs", std::vector<float>{0.0f}, exact());
    ANVIL_RUN_OP(r, fixed_point_accumulate, r.inout("acc", std::vector<int64_t>(3, 0), unspecified()),
                 r.inout("x", std::vector<float>{1.0f, std::nanf(""), -2.0f}, exact()), 3, 1, 0, 0, max_abs, true);
  }});
}

// The router with and without normalised weights (p 1 and 2), one expert to Mixtral-like eight
// with top-2; a slot map that skips some choices (full experts) and orders the rest expert-major.
void moe_cases(std::vector<OpCase>& cases) {
  struct Shape { int N, E, k; };
  for (Shape s : {Shape{1, 1, 1}, Shape{5, 4, 2}, Shape{37, 8, 2}, Shape{300, 16, 4}})
    for (float norm_p : {0.0f, 1.0f, 2.0f}) {
      const size_t NE = static_cast<size_t>(s.N) * s.E, Nk = static_cast<size_t>(s.N) * s.k;
      const auto logits = randn(NE, 1, 2.0f);
      const auto dims = {std::pair<const char*, long>{"N", s.N}, {"E", s.E}, {"k", s.k}, {"p", norm_p}};
      cases.push_back({case_name("moe_route", dims), [=](OpRun& r) {
        float* probs = r.out("probs", NE, close(kFp32Elementwise));
        int32_t* experts = r.inout("experts", std::vector<int32_t>(Nk, -7), exact());
        float* weights = r.out("weights", Nk, close(kFp32Elementwise));
        ANVIL_RUN_OP(r, moe_route, probs, experts, weights, r.in("logits", logits), s.N, s.E, s.k, norm_p);
      }});
      cases.push_back({case_name("moe_route_backward", dims), [=](OpRun& r) {
        std::vector<float> probs(NE), weights(Nk);  // the forward's, from the reference
        std::vector<int32_t> experts(Nk);
        ref::moe_route(probs.data(), experts.data(), weights.data(), logits.data(), s.N, s.E, s.k, norm_p);
        float* dlogits = r.out("dlogits", NE, close(kFp32Reduction));
        ANVIL_RUN_OP(r, moe_route_backward, dlogits, r.in("probs", probs), r.in("experts", experts),
                     r.in("weights", weights), r.in("dweights", randn(Nk, 2)),
                     norm_p == 1.0f ? nullptr : r.in("dprobs", randn(NE, 3)), s.N, s.E, s.k, norm_p);
      }});
    }
  struct Combine { int N, k, C; };
  for (Combine s : {Combine{1, 1, 1}, Combine{7, 2, 5}, Combine{130, 2, 768}, Combine{70, 4, 33}}) {
    // Every third choice skipped; the others' slots in reverse order of (t, j).
    const size_t Nk = static_cast<size_t>(s.N) * s.k;
    std::vector<int32_t> slots(Nk, -1), slot_tokens, slot_choices;
    for (size_t i = Nk; i-- > 0;)
      if (i % 3 != 1) {
        slots[i] = static_cast<int32_t>(slot_tokens.size());
        slot_tokens.push_back(static_cast<int32_t>(i / s.k));
        slot_choices.push_back(static_cast<int32_t>(i % s.k));
      }
    const long S = static_cast<long>(slot_tokens.size());
    const size_t NC = static_cast<size_t>(s.N) * s.C, SC = static_cast<size_t>(S) * s.C;
    const auto dims = {std::pair<const char*, long>{"N", s.N}, {"k", s.k}, {"C", s.C}};
    cases.push_back({case_name("gather_rows", dims), [=](OpRun& r) {
      ANVIL_RUN_OP(r, gather_rows, r.out("out", SC, exact()), r.in("inp", randn(NC, 1)), r.in("rows", slot_tokens), S,
                   s.C);
    }});
    for (bool weighted : {true, false}) {
      const std::string variant = weighted ? "weighted" : "accumulate";
      cases.push_back({case_name("moe_combine", dims, variant), [=](OpRun& r) {
        float* out = weighted ? r.out("out", NC, close(kFp32Elementwise))
                              : r.inout("out", randn(NC, 4), close(kFp32Elementwise));
        ANVIL_RUN_OP(r, moe_combine, out, r.in("y", randn(SC, 2)), r.in("slots", slots),
                     weighted ? r.in("weights", randn(Nk, 3)) : nullptr, s.N, s.k, s.C, !weighted);
      }});
    }
    cases.push_back({case_name("moe_combine_backward", dims), [=](OpRun& r) {
      float* dy = r.out("dy", SC, exact());
      float* dweights = r.out("dweights", Nk, close(kFp32Reduction));
      ANVIL_RUN_OP(r, moe_combine_backward, dy, dweights, r.in("dout", randn(NC, 1)), r.in("y", randn(SC, 2)),
                   r.in("slots", slots), r.in("slot_tokens", slot_tokens), r.in("slot_choices", slot_choices),
                   r.in("weights", randn(Nk, 3)), s.N, s.k, s.C, S);
    }});
  }
}

std::vector<OpCase> op_cases() {
  std::vector<OpCase> cases;
  embedding_cases(cases);
  norm_cases(cases);
  matmul_cases(cases);
  elementwise_cases(cases);
  attention_cases(cases);
  attention_16bit_cases(cases);
  crossentropy_cases(cases);
  crossentropy_slice_cases(cases);
  optimizer_cases(cases);
  moe_cases(cases);
  return cases;
}

#if defined(ANVIL_OP_TEST_GPU)
constexpr Backend kBackendUnderTest = Backend::kGpu;
#else
constexpr Backend kBackendUnderTest = Backend::kCpu;
#endif

class Op : public ::testing::TestWithParam<OpCase> {
 protected:
  void SetUp() override {
    if (kBackendUnderTest != Backend::kGpu) return;
    if (gpu_devices().empty())
      GTEST_SKIP() << "no GPU visible (" << gpu_backend_description() << "): the GPU op tests need one";
    gpu_select(0);
  }
};

TEST_P(Op, MatchesTheReference) { run_op_case(GetParam(), kBackendUnderTest); }

INSTANTIATE_TEST_SUITE_P(Table, Op, ::testing::ValuesIn(op_cases()),
                         [](const ::testing::TestParamInfo<OpCase>& info) { return info.param.name; });

}  // namespace
}  // namespace anvil::testing
