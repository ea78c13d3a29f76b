// anvil's CPU GEMM: every element is fixed k blocks of fused multiply-add chains added in order,
// so each instruction set's kernels must give exactly the bits of a scalar std::fma loop, for
// any shape, operand layout and blocking (kernels/cpu/gemm.h).
#include <gtest/gtest.h>

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <functional>
#include <string>
#include <cmath>
#include <cstring>
#include <vector>

#include "compare.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_blocked.h"
#include "kernels/cpu/gemm_portable.h"
#include "kernels/cpu/gemm_tiles.h"

namespace anvil::cpu {
namespace {

std::vector<GemmIsa> supported_isas() {
  std::vector<GemmIsa> isas;
  for (GemmIsa isa : {GemmIsa::portable, GemmIsa::avx2, GemmIsa::avx512, GemmIsa::avx512bf16, GemmIsa::amx})
    if (gemm_isa_supported(isa)) isas.push_back(isa);
  return isas;
}

float flush(float f) {  // a subnormal to a zero of its sign, as VDPBF16PS does
  return std::fabs(f) < 1.17549435e-38f ? std::copysign(0.0f, f) : f;
}
float bf16(float f) { return flush(bf16_to_float(float_to_bf16(f))); }

// The specification of gemm.h, one element at a time: fp32, bf16's pair chain, or (tiles) bf16
// in AMX's order.
float reference_element(GemmPrecision precision, int i, int j, int K, const GemmOperand& a, const GemmOperand& b,
                        bool accumulate, float init, bool tiles = false) {
  auto A = [&](int k) { return k < K ? a.data[i * a.row_stride + k * a.col_stride] : 0.0f; };  // zero pads
  auto B = [&](int k) { return k < K ? b.data[k * b.row_stride + j * b.col_stride] : 0.0f; };
  float c = init;
  for (int k0 = 0; k0 < K; k0 += kGemmKc) {
    const int k1 = std::min(K, k0 + kGemmKc);
    float s = 0.0f;
    if (precision == GemmPrecision::fp32) {
      for (int k = k0; k < k1; k++) s = std::fma(A(k), B(k), s);
    } else if (tiles) {
      for (int chunk = k0; chunk < k1; chunk += 32) {  // 16 pairs, zero-padded
        float even = 0.0f, odd = 0.0f;
        for (int k = chunk; k < chunk + 32; k += 2) {
          even = flush(std::fma(bf16(A(k)), bf16(B(k)), even));
          odd = flush(std::fma(bf16(A(k + 1)), bf16(B(k + 1)), odd));
        }
        s = flush(s + flush(even + odd));
      }
    } else {
      for (int k = k0; k < k1; k += 2) {
        s = flush(std::fma(bf16(A(k + 1)), bf16(B(k + 1)), s));  // k + 1 = K: the zero pad of an odd K
        s = flush(std::fma(bf16(A(k)), bf16(B(k)), s));
      }
    }
    if (k0 == 0 && !accumulate)
      c = s;
    else
      c = precision == GemmPrecision::fp32 ? c + s : flush(flush(c) + s);
  }
  return c;
}

struct Shape {
  int M, N, K;
};

// One way of computing C = A·B (+ C), under test; tiles: its bf16 is AMX's order.
struct Implementation {
  std::string name;
  std::function<void(GemmPrecision, int M, int N, int K, const GemmOperand& a, const GemmOperand& b, float* c,
                     bool accumulate)>
      run;
  bool tiles = false;
};

std::vector<Implementation> instruction_sets() {
  std::vector<Implementation> out;
  for (GemmIsa isa : supported_isas())
    out.push_back({gemm_isa_name(isa),
                   [isa](GemmPrecision precision, int M, int N, int K, const GemmOperand& a, const GemmOperand& b,
                         float* c, bool accumulate) { gemm(precision, M, N, K, a, b, c, N, accumulate, isa); },
                   isa == GemmIsa::amx});
  return out;
}

void check_against_reference(GemmPrecision precision, const std::vector<Implementation>& implementations) {
  // Edge tiles in every direction, k blocks (256) split with an odd tail, and more columns than
  // one packed B block (2048).
  const Shape shapes[] = {{1, 1, 1}, {5, 7, 3}, {13, 37, 300}, {100, 70, 513}, {3, 2100, 20}, {97, 33, 256}};
  int checked = 0;
  for (const Shape& s : shapes)
    for (bool a_rows : {true, false})
      for (bool b_rows : {true, false})
        for (bool accumulate : {false, true}) {
          const std::vector<float> av = testing::randn(static_cast<size_t>(s.M) * s.K, 1);
          const std::vector<float> bv = testing::randn(static_cast<size_t>(s.K) * s.N, 2);
          const std::vector<float> init = testing::randn(static_cast<size_t>(s.M) * s.N, 3);
          // A stored row-major (M×K) or column-major; likewise B (K×N).
          const GemmOperand a = a_rows ? GemmOperand{av.data(), s.K, 1} : GemmOperand{av.data(), 1, s.M};
          const GemmOperand b = b_rows ? GemmOperand{bv.data(), s.N, 1} : GemmOperand{bv.data(), 1, s.K};
          std::vector<float> want(init.size()), want_tiles(init.size());
          for (int i = 0; i < s.M; i++)
            for (int j = 0; j < s.N; j++) {
              want[i * s.N + j] = reference_element(precision, i, j, s.K, a, b, accumulate, init[i * s.N + j]);
              want_tiles[i * s.N + j] =
                  reference_element(precision, i, j, s.K, a, b, accumulate, init[i * s.N + j], true);
            }
          for (const Implementation& impl : implementations) {
            std::vector<float> c = init;
            impl.run(precision, s.M, s.N, s.K, a, b, c.data(), accumulate);
            const std::vector<float>& wanted = impl.tiles && precision == GemmPrecision::bf16 ? want_tiles : want;
            ASSERT_EQ(0, std::memcmp(c.data(), wanted.data(), sizeof(float) * c.size()))
                << impl.name << " M=" << s.M << " N=" << s.N << " K=" << s.K << " a_rows=" << a_rows
                << " b_rows=" << b_rows << " accumulate=" << accumulate;
            checked++;
          }
        }
  std::string names;
  for (const Implementation& impl : implementations) names += " " + impl.name;
  std::printf("checked %d products on:%s\n", checked, names.c_str());
}

TEST(Gemm, Fp32MatchesTheSpecificationOnEveryInstructionSet) {
  check_against_reference(GemmPrecision::fp32, instruction_sets());
}

TEST(Gemm, Bf16MatchesTheSpecificationOnEveryInstructionSet) {
  check_against_reference(GemmPrecision::bf16, instruction_sets());
}

// The AVX-512 kernels' blocking (12 × 32 tiles; VDPBF16PS's packed pairs of k) through the same
// templates (gemm_blocked.h) on vector types that compute lane by lane, so that everything but
// the intrinsics runs on any CPU, single-threaded and as a thread team.
// bf16 products run with subnormals flushed (FTZ and DAZ) as gemm.cpp runs them; the lanes'
// std::fma follows the control register like the vector instructions.
using Lanes16 = PortableLanes<16>;

// VDPBF16PS as the instruction set reference describes it: per lane, the odd members' product
// added first, then the even ones', each rounded to fp32, subnormals read and written as zero.
struct Lanes16Pairs : Lanes16 {
  struct Pairs {
    uint32_t w[W];
  };
  using PairScalar = uint32_t;
  static Pairs load_pairs(const uint32_t* p) {
    Pairs v;
    std::memcpy(v.w, p, sizeof v.w);
    return v;
  }
  static PairScalar bcast_pair(uint32_t w) { return w; }
  static float high(uint32_t w) { return std::bit_cast<float>(w & 0xFFFF0000u); }
  static float low(uint32_t w) { return std::bit_cast<float>(w << 16); }
  static Vec dot_pair(PairScalar a, const Pairs& b, Vec acc) {
    for (int i = 0; i < W; i++) {
      const float odd = flush(std::fma(flush(high(a)), flush(high(b.w[i])), flush(acc.x[i])));
      acc.x[i] = flush(std::fma(flush(low(a)), flush(low(b.w[i])), odd));
    }
    return acc;
  }
};

// Runs one of gemm_blocked.h's implementations as gemm() and parallel_gemm()'s thread team do.
Implementation lanes(std::string name, void (*blocked)(const GemmCall&), bool bf16_operands, int threads) {
  return {name, [=](GemmPrecision precision, int M, int N, int K, const GemmOperand& a, const GemmOperand& b, float* c,
                    bool accumulate) {
            std::vector<float> shared_b(static_cast<size_t>(kGemmTeamMaxN) * kGemmTeamBlocks * kGemmKc);
            const bool team = threads > 1 && N <= kGemmTeamMaxN;
#pragma omp parallel num_threads(team ? threads : 1)
            {
              const unsigned control = _mm_getcsr();  // per thread
              if (precision == GemmPrecision::bf16) _mm_setcsr(control | 0x8040u);
              if (team) {
                EXPECT_EQ(threads, omp_get_num_threads());
              }
              std::vector<float> a_buffer(static_cast<size_t>(kGemmMc) * kGemmKc);
              std::vector<float> b_buffer(static_cast<size_t>(kGemmNc) * kGemmKc);
              const int thread = team ? omp_get_thread_num() : 0;
              const GemmCall call{M, N, K, a, {b.data, b.col_stride, b.row_stride}, c, N, accumulate,
                                  bf16_operands, a_buffer.data(), team ? shared_b.data() : b_buffer.data(),
                                  thread, team ? omp_get_num_threads() : 1, nullptr, 0};
              blocked(call);
              _mm_setcsr(control);
            }
          }};
}

TEST(Gemm, Avx512BlockingMatchesTheSpecification) {
  check_against_reference(GemmPrecision::fp32, {lanes("12x32", blocked_fp32<Lanes16, 12, 2>, false, 1),
                                                lanes("12x32 team", blocked_fp32<Lanes16, 12, 2>, false, 2)});
  // bf16 without VDPBF16PS: the fp32 kernel on rounded operands in swapped pair order.
  check_against_reference(GemmPrecision::bf16, {lanes("12x32 rounded", blocked_fp32<Lanes16, 12, 2>, true, 1)});
}

TEST(Gemm, Vdpbf16psBlockingMatchesTheSpecification) {
  check_against_reference(GemmPrecision::bf16, {lanes("12x32 pairs", blocked_pairs<Lanes16Pairs, 12, 2>, false, 1),
                                                lanes("12x32 pairs team", blocked_pairs<Lanes16Pairs, 12, 2>, false, 2)});
}

// AMX's tiles as the instruction set reference describes them: eight tiles of 16 rows × 64
// bytes, and TDPBF16PS, for each element of C, summing the low halves' products of A's row and
// B's column in one chain from zero and the high halves' in another (each a fused multiply-add,
// subnormals read and written as zero), then adding the two sums, then that to the element.
struct EmulatedTiles {
  static inline thread_local uint32_t tile[8][16][16];
  static void configure() { std::memset(tile, 0, sizeof tile); }
  static void release() {}
  static void zero() { std::memset(tile, 0, 4 * sizeof tile[0]); }
  static void load(int t, const uint32_t* p, long stride) {
    for (int r = 0; r < 16; r++) std::memcpy(tile[t][r], p + r * stride, sizeof tile[t][r]);
  }
  static void dot(int c, int a, int b) {
    for (int m = 0; m < 16; m++)
      for (int n = 0; n < 16; n++) {
        float low = 0.0f, high = 0.0f;
        for (int k = 0; k < 16; k++) {
          const uint32_t x = tile[a][m][k], y = tile[b][k][n];
          low = flush(std::fma(flush(Lanes16Pairs::low(x)), flush(Lanes16Pairs::low(y)), low));
          high = flush(std::fma(flush(Lanes16Pairs::high(x)), flush(Lanes16Pairs::high(y)), high));
        }
        const float sum = flush(low + high);
        tile[c][m][n] = std::bit_cast<uint32_t>(flush(std::bit_cast<float>(tile[c][m][n]) + sum));
      }
  }
  static void step(const uint32_t* a, long a_stride, const uint32_t* b, long b_stride) {
    load(4, a, a_stride), load(5, a + 16 * a_stride, a_stride), load(6, b, b_stride), load(7, b + 16, b_stride);
    dot(0, 4, 6), dot(1, 4, 7), dot(2, 5, 6), dot(3, 5, 7);
  }
  static void store(float* c, long ldc) {
    for (int t = 0; t < 4; t++)
      for (int r = 0; r < 16; r++)
        std::memcpy(c + (t / 2 * 16 + r) * ldc + t % 2 * 16, tile[t][r], sizeof tile[t][r]);
  }
};

TEST(Gemm, AmxTileBlockingMatchesTheSpecification) {
  std::vector<Implementation> tiles = {lanes("32x32 tiles", blocked_tiles<EmulatedTiles, Lanes16>, false, 1),
                                       lanes("32x32 tiles team", blocked_tiles<EmulatedTiles, Lanes16>, false, 2)};
  for (Implementation& impl : tiles) impl.tiles = true;
  check_against_reference(GemmPrecision::bf16, tiles);
}

// B packed ahead for the tiles (GemmPackedB's layout: pack_b_pairs with the tiles' panel width)
// gives the bits of B packed by the product itself.
TEST(Gemm, AmxTilesPackedBGivesTheBitsOfB) {
  const int M = 40, K = kGemmKc + 75, N = 70;  // an odd K and a last chunk of 6 pairs; edge tiles
  const std::vector<float> av = testing::randn(M * K, 12), bv = testing::randn(K * N, 13);
  const GemmOperand a{av.data(), K, 1}, b{bv.data(), N, 1};
  const GemmKernels kernels = with_tiles<EmulatedTiles, Lanes16>(gemm_kernels_portable());
  const int panels = (N + kTileNR - 1) / kTileNR, blocks = (K + 1 + kGemmKc - 1) / kGemmKc;
  std::vector<uint32_t> packed(static_cast<size_t>(blocks) * panels * (kGemmKc / 2) * kTileNR);
  std::vector<float> a_buffer(static_cast<size_t>(kGemmMc) * kGemmKc), b_buffer(static_cast<size_t>(kGemmNc) * kGemmKc);
  const unsigned control = _mm_getcsr();
  _mm_setcsr(control | 0x8040u);
  const GemmCall pack{0, N, K, {}, {b.data, b.col_stride, b.row_stride}, nullptr, 0, false, false, nullptr, nullptr,
                      0, 1, nullptr, 0};
  kernels.pairs_pack_b(pack, packed.data());
  std::vector<float> want = testing::randn(M * N, 14), got = want;
  kernels.pairs({M, N, K, a, {b.data, b.col_stride, b.row_stride}, want.data(), N, true, false, a_buffer.data(),
                 b_buffer.data(), 0, 1, nullptr, 0});
  kernels.pairs({M, N, K, a, {}, got.data(), N, true, false, a_buffer.data(), b_buffer.data(), 0, 1, packed.data(),
                 panels});
  _mm_setcsr(control);
  EXPECT_TRUE(got == want);
}

// A sub-block of the output (another M, N, leading dimension) holds the same bits as the whole.
TEST(Gemm, BlockOfTheOutputEqualsTheWhole) {
  const int M = 70, N = 90, K = 130;
  const std::vector<float> av = testing::randn(M * K, 4), bv = testing::randn(K * N, 5);
  for (GemmPrecision precision : {GemmPrecision::fp32, GemmPrecision::bf16}) {
    std::vector<float> whole(M * N), part(M * N, 0.0f);
    gemm(precision, M, N, K, {av.data(), K, 1}, {bv.data(), N, 1}, whole.data(), N, false);
    const int i0 = 13, j0 = 21;
    gemm(precision, 40, 50, K, {av.data() + i0 * K, K, 1}, {bv.data() + j0, N, 1}, part.data() + i0 * N + j0, N,
         false);
    for (int i = i0; i < i0 + 40; i++)
      for (int j = j0; j < j0 + 50; j++) ASSERT_EQ(part[i * N + j], whole[i * N + j]) << i << "," << j;
  }
}

// parallel_gemm cuts the output into blocks on threads, or packs a small B once for many row
// bands: the bits of one gemm() call either way, for each grid it chooses.
TEST(Gemm, ParallelProductEqualsOneCall) {
  struct Shape { int M, N, K; };
  for (Shape s : {Shape{1100, 300, 280}, Shape{600, 2100, 70}, Shape{64, 3000, 300}, Shape{300, 200, 1500}}) {
    const std::vector<float> av = testing::randn(s.M * s.K, 9), bv = testing::randn(s.K * s.N, 10);
    for (GemmPrecision precision : {GemmPrecision::fp32, GemmPrecision::bf16}) {
      SCOPED_TRACE(::testing::Message() << "M=" << s.M << " N=" << s.N << " K=" << s.K
                                        << (precision == GemmPrecision::bf16 ? " bf16" : " fp32"));
      std::vector<float> want = testing::randn(s.M * s.N, 11), got = want;
      gemm(precision, s.M, s.N, s.K, {av.data(), s.K, 1}, {bv.data(), s.N, 1}, want.data(), s.N, true);
      parallel_gemm(precision, s.M, s.N, s.K, {av.data(), s.K, 1}, {bv.data(), s.N, 1}, got.data(), s.N, true);
      ASSERT_TRUE(got == want);
    }
  }
}

// A B packed ahead gives the bits of B itself, whole or in parts that start at a k block and a
// panel (an odd K only at B's end), and parts elsewhere are refused.
TEST(Gemm, PackedBGivesTheBitsOfB) {
  const int M = 50, K = 2 * kGemmKc + 75, N = 2 * kGemmNc + 70;  // an odd K; a partial last panel
  const std::vector<float> av = testing::randn(M * K, 6), bv = testing::randn(K * N, 7);
  struct Mode { GemmIsa isa; GemmPrecision precision; bool b_transposed; };  // Bᵀ stored: the forward's
  std::vector<Mode> modes;
  for (GemmIsa isa : supported_isas())
    for (GemmPrecision precision : {GemmPrecision::fp32, GemmPrecision::bf16})
      for (bool b_transposed : {false, true}) modes.push_back({isa, precision, b_transposed});
  for (const auto& [isa, precision, b_transposed] : modes) {
    SCOPED_TRACE(::testing::Message() << gemm_isa_name(isa) << (precision == GemmPrecision::bf16 ? " bf16" : " fp32")
                                      << (b_transposed ? ", Bᵀ stored" : ", B stored"));
    std::vector<float> bt(bv.size());
    for (int k = 0; k < K; k++)
      for (int j = 0; j < N; j++) bt[static_cast<size_t>(j) * K + k] = bv[static_cast<size_t>(k) * N + j];
    const GemmOperand b = b_transposed ? GemmOperand{bt.data(), 1, K} : GemmOperand{bv.data(), N, 1};
    GemmPackedB packed;
    packed.pack(precision, K, N, b, isa);
    struct Part { int k0, K, j0, N; };
    for (Part p : {Part{0, K, 0, N}, Part{kGemmKc, K - kGemmKc, 0, N}, Part{0, kGemmKc, kGemmNc, N - kGemmNc},
                   Part{kGemmKc, kGemmKc, 64, 96}}) {
      SCOPED_TRACE(::testing::Message() << "k0=" << p.k0 << " K=" << p.K << " j0=" << p.j0 << " N=" << p.N);
      const GemmOperand a{av.data() + p.k0, K, 1};
      const GemmOperand b_part{b.data + p.k0 * b.row_stride + p.j0 * b.col_stride, b.row_stride, b.col_stride};
      std::vector<float> want = testing::randn(M * p.N, 8), got = want;
      parallel_gemm(precision, M, p.N, p.K, a, b_part, want.data(), p.N, true);
      parallel_gemm(precision, M, p.N, p.K, a, packed, p.k0, p.j0, got.data(), p.N, true);
      ASSERT_TRUE(got == want);
    }
    std::vector<float> c(M * 64);
    EXPECT_THROW(parallel_gemm(precision, M, 64, 100, {av.data() + 100, K, 1}, packed, 100, 0, c.data(), 64, false),
                 Error);  // not at a k block
    EXPECT_THROW(parallel_gemm(precision, M, 64, 100, {av.data(), K, 1}, packed, 0, 3, c.data(), 64, false),
                 Error);  // not at a panel
    if (precision == GemmPrecision::bf16) {
      EXPECT_THROW(parallel_gemm(precision, M, 64, 101, {av.data(), K, 1}, packed, 0, 0, c.data(), 64, false),
                   Error);  // an odd K short of B's end
    }
  }
}

// bf16 operands: rounding to nearest even, NaN kept, subnormal inputs read as zero.
TEST(Gemm, Bf16RoundsOperandsAndFlushesSubnormals) {
  const float third = 1.0f / 3.0f;
  std::vector<float> a = {third, 1e-39f}, b = {3.0f, 1e30f}, c(1);
  gemm(GemmPrecision::bf16, 1, 1, 2, {a.data(), 2, 1}, {b.data(), 1, 1}, c.data(), 1, false);
  EXPECT_EQ(c[0], bf16_to_float(float_to_bf16(third)) * 3.0f);  // 1e-39 · 1e30 flushed to 0
  a[0] = std::nanf("");
  gemm(GemmPrecision::bf16, 1, 1, 2, {a.data(), 2, 1}, {b.data(), 1, 1}, c.data(), 1, false);
  EXPECT_TRUE(std::isnan(c[0]));
}

}  // namespace
}  // namespace anvil::cpu
