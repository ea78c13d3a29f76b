// Causal attention on tensor cores in FlashAttention-2's form, for 16-bit matrix operands: the
// scores of a block of 64 queries are made 64 keys at a time in registers (device/mma.h), folded
// into an online softmax and multiplied by the values, so nothing T×T exists. The backward pass
// recomputes the probabilities from the forward's log-sum-exp in two kernels: one per block of
// keys (dK, dV: each key/value head sums its query heads and query blocks in order) and one per
// block of queries (dQ, over the key blocks in order). Every sum has one owner and a fixed order:
// no atomics, so runs repeat bit for bit in any mode.
//
// Operands (q, k, v, dout, the probabilities and the score gradients) are rounded to the 16-bit
// dtype as they enter a product; scores, softmax statistics, row sums D and every accumulator
// are fp32 (attention.h: heads.operands). Head sizes 16, 32, 64 and 128.
#include <cmath>

#include "kernels/gpu/internal.h"

// NVIDIA only: AMD's matrix cores (MFMA) have other fragment layouts, and device/mma.h's portable
// product, which runs there, is no faster than the fp32 GEMMs of attention.cpp that AMD keeps.
#if defined(ANVIL_HIP)
namespace anvil::gpu {
bool flash_attention_supported(const AttentionHeads&) { return false; }
void flash_attention_forward(float*, float*, const float*, const int32_t*, int, int, const AttentionHeads&) {}
void flash_attention_backward(float*, const float*, const float*, const float*, const float*, const int32_t*, int, int,
                              const AttentionHeads&) {}
}  // namespace anvil::gpu
#else
#include <cstdint>
#include <type_traits>

#include "core/error.h"
#include "device/device.h"
#include "device/mma.h"
#include "device/stream.h"
#include "kernels/attention.h"

namespace anvil::gpu {
namespace {

constexpr int kWarps = 4;                       // 32-lane groups per block, 16 rows each
constexpr int kThreads = kWarps * kMmaLanes;
constexpr int kRows = 16 * kWarps;              // a block's queries (forward, dQ) or keys (dK, dV)
constexpr int kTile = 64;                       // the keys or queries of one step
constexpr int kPad = 8;                         // 16-bit values after each shared row: see kRowWords
// Exponentials are taken base 2: a multiply-add and exp2f per score, where expf adds a range
// reduction to each. They bound the speed as much as the products do: on an H100 a score's 4·HS
// tensor-core flops take an SM 1/16 of a cycle at head size 64 (about 4096 bf16 flops a cycle),
// and its exponential as long on the special-function units (16 a cycle). Scores are scaled by
// log2(e) as they are formed; lse is stored in natural log, as attention.h says.
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// Shared tiles hold 16-bit pairs, row-major, kRowWords<HS> words per row of HS values: rows of
// HS + 8 values put the rows g = 0..7 that one fragment load reads on distinct banks, and keep
// every row 16-byte aligned for b_fragment_transposed (device/mma.h).
template <int HS>
constexpr int kRowWords = (HS + kPad) / 2;
static_assert(kRowWords<16> % 4 == 0 && kRowWords<32> % 4 == 0 && kRowWords<64> % 4 == 0 && kRowWords<128> % 4 == 0);

// A sequence's causal window: key j is visible to query i when first(i) <= j <= i < T.
struct Window {
  const int32_t* positions;  // this sequence's, or null
  int T;
  int window;  // AttentionHeads::window
  __device__ int first(int i) const { return attention_first_key(positions, 0, T, i, window); }
  __device__ bool visible(int i, int j) const { return i < T && j <= i && j >= first(i); }
  // Whether keys [k0, k1] are all visible to queries [i0, i1]: a tile that needs no mask. first(i)
  // never decreases with i (an example's start, or the window's), so the last query's is the
  // largest.
  __device__ bool all_visible(int i0, int i1, int k0, int k1) const { return k1 <= i0 && i1 < T && k0 >= first(i1); }
};

// Calls f(std::true_type) for a tile that needs the mask, f(std::false_type) for one whose every
// score is visible: the element-wise steps then test nothing, and they bound these kernels' speed
// as much as the products do (see kLog2e). The choice is the same across a 32-lane group.
template <class F>
__device__ inline void with_mask(bool masked, const F& f) {
  if (masked)
    f(std::true_type{});
  else
    f(std::false_type{});
}

// rows (N, HS) of src, rows ld apart, as 16-bit pairs into dst (kRowWords<HS> per row); rows at or
// past n are zero. Four values a thread in one 16-byte load: src and ld are multiples of 4 floats
// (flash_attention_forward checks the arrays).
template <int HS, int N, ComputeDtype D>
__device__ void load_tile(uint32_t* dst, const float* src, long ld, int n) {
  constexpr int quads = HS / 4;
  for (int w = threadIdx.x; w < N * quads; w += kThreads) {
    const int r = w / quads, c = 4 * (w % quads);
    uint2 packed = {0u, 0u};
    if (r < n) {
      const float4 f = *reinterpret_cast<const float4*>(src + r * ld + c);
      packed = {pack16<D>(f.x, f.y), pack16<D>(f.z, f.w)};
    }
    *reinterpret_cast<uint2*>(dst + r * kRowWords<HS> + c / 2) = packed;
  }
}

// The A fragments of 16 rows (row0 on) of a (rows, HS) matrix in global memory, ld apart: frag[k]
// covers channels 16k..16k+15. Rows at or past n are zero.
template <int HS, ComputeDtype D>
__device__ void load_a_rows(uint32_t frag[][4], const float* src, long ld, int row0, int n) {
  const int lane = static_cast<int>(threadIdx.x) % kMmaLanes, g = lane / 4, t = lane % 4;
  const int r0 = row0 + g, r1 = row0 + g + 8;
  const float* a = src + static_cast<long>(r0) * ld;
  const float* b = src + static_cast<long>(r1) * ld;
  const auto pair = [](const float* p) {
    const float2 f = *reinterpret_cast<const float2*>(p);
    return pack16<D>(f.x, f.y);
  };
  ANVIL_UNROLL
  for (int k = 0; k < HS / 16; k++) {
    const int c = 16 * k + 2 * t;
    frag[k][0] = r0 < n ? pair(a + c) : 0u;
    frag[k][1] = r1 < n ? pair(b + c) : 0u;
    frag[k][2] = r0 < n ? pair(a + c + 8) : 0u;
    frag[k][3] = r1 < n ? pair(b + c + 8) : 0u;
  }
}

// C (16 x N) = A (16 x HS, fragments) · Tileᵀ, Tile (N, HS) in shared memory: the scores of 16
// rows against a tile's N rows. c[n] covers tile rows 8n..8n+7.
template <int HS, int N, ComputeDtype D>
__device__ void product_with_tile_rows(float c[][4], const uint32_t a[][4], const uint32_t* tile) {
  const int lane = static_cast<int>(threadIdx.x) % kMmaLanes, g = lane / 4, t = lane % 4;
  ANVIL_UNROLL
  for (int n = 0; n < N / 8; n++)
    ANVIL_UNROLL
    for (int e = 0; e < 4; e++) c[n][e] = 0.0f;
  ANVIL_UNROLL
  for (int k = 0; k < HS / 16; k++)
    ANVIL_UNROLL
    for (int n = 0; n < N / 8; n++) {
      const uint32_t* row = tile + (8 * n + g) * kRowWords<HS>;
      const uint32_t b[2] = {row[8 * k + t], row[8 * k + t + 4]};
      mma_16816<D>(c[n], a[k], b);
    }
}

// acc (16 x HS) += P (16 x N, the C fragments of product_with_tile_rows, rounded to D) · Tile,
// Tile (N, HS) in shared memory.
template <int HS, int N, ComputeDtype D>
__device__ void accumulate_product(float acc[][4], const float p[][4], const uint32_t* tile) {
  ANVIL_UNROLL
  for (int k = 0; k < N / 16; k++) {
    // C fragments of columns 16k..16k+7 and 16k+8..16k+15 are this A fragment's halves.
    const uint32_t a[4] = {pack16<D>(p[2 * k][0], p[2 * k][1]), pack16<D>(p[2 * k][2], p[2 * k][3]),
                           pack16<D>(p[2 * k + 1][0], p[2 * k + 1][1]), pack16<D>(p[2 * k + 1][2], p[2 * k + 1][3])};
    ANVIL_UNROLL
    for (int n = 0; n < HS / 8; n++) {
      uint32_t b[2];
      b_fragment_transposed(b, tile, kRowWords<HS>, 16 * k, 8 * n);
      mma_16816<D>(acc[n], a, b);
    }
  }
}

// The first key any query of rows [q0, q0 + kRows) sees, into shared memory.
__device__ void first_key_of_block(int* first, const Window& w, int q0) {
  if (threadIdx.x == 0) {
    int f = q0;
    for (int i = q0; i < q0 + kRows && i < w.T; i++) f = min(f, w.first(i));
    *first = f;
  }
  __syncthreads();
}

// Across the four lanes that hold one row of a C fragment.
__device__ inline float quad_max(float v) {
  v = fmaxf(v, shfl_xor(v, 1));
  return fmaxf(v, shfl_xor(v, 2));
}
__device__ inline float quad_sum(float v) {
  v += shfl_xor(v, 1);
  return v + shfl_xor(v, 2);
}

// Where a head's operands start in a qkv row (attention.h).
struct Columns {
  int q, k, v;
  __device__ Columns(const AttentionHeads& a, int h)
      : q(h * a.head_size),
        k(a.q_channels() + (h / a.group()) * a.head_size),
        v(a.q_channels() + a.kv_channels() + (h / a.group()) * a.head_size) {}
};

// The dropout factor of probability (h, i, j) of a sequence: 0, or 1/(1-p) when kept.
struct DropoutMask {
  DropoutSite site;
  uint64_t stream;
  int T;
  __device__ DropoutMask(const DropoutSite& s, int b, int T_) : site(s), stream(dropout_stream(s.key, s.first_sample + b)), T(T_) {}
  __device__ float factor(int h, int i, int j) const {
    return dropout_keep(stream, attention_dropout_index(h, i, j, T), site.threshold()) ? site.scale() : 0.0f;
  }
};

// What the forward and dQ kernels' blocks (64 queries of one head of one sequence: blockIdx x,
// y, z) and their 32-lane groups (16 of the queries each) start from.
struct QueryBlock {
  int h, b, q0, row0;
  int rows[2];  // this lane's rows of the C fragments: row0 + g and row0 + g + 8
  const float* x;  // the sequence's qkv rows
  Window w;
  Columns col;
  float scale2, slope2;  // scale and the head's ALiBi slope, times log2(e)
  DropoutMask drop;
  __device__ QueryBlock(const float* qkv, const int32_t* positions, int T, float scale, const AttentionHeads& heads)
      : h(blockIdx.y),
        b(blockIdx.z),
        q0(blockIdx.x * kRows),
        row0(q0 + static_cast<int>(threadIdx.x) / kMmaLanes * 16),
        rows{row0 + static_cast<int>(threadIdx.x) % kMmaLanes / 4, row0 + static_cast<int>(threadIdx.x) % kMmaLanes / 4 + 8},
        x(qkv + static_cast<long>(b) * T * heads.qkv_channels()),
        w{positions ? positions + static_cast<long>(b) * T : nullptr, T, heads.window},
        col(heads, h),
        scale2(scale * kLog2e),
        slope2((heads.alibi ? alibi_slope(h, heads.n_heads, heads.alibi_bias_max) : 0.0f) * kLog2e),
        drop(heads.dropout, b, T) {}
};

// ---- forward: a block per (64 queries, head, sequence)

template <int HS, ComputeDtype D>
__global__ void flash_forward_kernel(float* out, float* lse, const float* qkv, const int32_t* positions, int T,
                                     float scale, AttentionHeads heads) {
  __shared__ __align__(16) uint32_t keys[kTile * kRowWords<HS>];
  __shared__ __align__(16) uint32_t values[kTile * kRowWords<HS>];
  __shared__ int first;
  const QueryBlock qb(qkv, positions, T, scale, heads);
  const int h = qb.h, b = qb.b, q0 = qb.q0, row0 = qb.row0, ld = heads.qkv_channels(), t = threadIdx.x % 4;
  const int* rows = qb.rows;
  const float* x = qb.x;
  const Window& w = qb.w;
  const Columns& col = qb.col;
  const float scale2 = qb.scale2, slope2 = qb.slope2;
  const DropoutMask& drop = qb.drop;

  uint32_t q[HS / 16][4];
  load_a_rows<HS, D>(q, x + col.q, ld, row0, T);
  float o[HS / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // this lane's share of each row's sum

  first_key_of_block(&first, w, q0);
  const int last = min(q0 + kRows, T) - 1;
  for (int j0 = first / kTile * kTile; j0 <= last; j0 += kTile) {
    __syncthreads();  // the previous tile is no longer read
    load_tile<HS, kTile, D>(keys, x + static_cast<long>(j0) * ld + col.k, ld, T - j0);
    load_tile<HS, kTile, D>(values, x + static_cast<long>(j0) * ld + col.v, ld, T - j0);
    __syncthreads();
    float s[8][4];
    product_with_tile_rows<HS, kTile, D>(s, q, keys);
    float tile_max[2] = {-INFINITY, -INFINITY};
    with_mask(!w.all_visible(row0, row0 + 15, j0, j0 + kTile - 1), [&](auto masked) {
      ANVIL_UNROLL
      for (int n = 0; n < 8; n++)
        ANVIL_UNROLL
        for (int e = 0; e < 4; e++) {
          const int i = rows[e / 2], j = j0 + 8 * n + 2 * t + (e & 1);
          const bool visible = !decltype(masked)::value || w.visible(i, j);
          s[n][e] = visible ? s[n][e] * scale2 + slope2 * static_cast<float>(j - i) : -INFINITY;
          tile_max[e / 2] = fmaxf(tile_max[e / 2], s[n][e]);
        }
    });
    float base[2];
    ANVIL_UNROLL
    for (int r = 0; r < 2; r++) {
      const float m_new = fmaxf(m[r], quad_max(tile_max[r]));
      // A row with no visible key yet keeps zeros (2^(-inf - 0)), never 2^(-inf + inf).
      base[r] = m_new == -INFINITY ? 0.0f : m_new;
      const float alpha = exp2f(m[r] - base[r]);
      l[r] *= alpha;
      ANVIL_UNROLL
      for (int n = 0; n < HS / 8; n++) {
        o[n][2 * r] *= alpha;
        o[n][2 * r + 1] *= alpha;
      }
      m[r] = m_new;
    }
    ANVIL_UNROLL
    for (int n = 0; n < 8; n++)
      ANVIL_UNROLL
      for (int e = 0; e < 4; e++) {
        const float p = exp2f(s[n][e] - base[e / 2]);
        l[e / 2] += p;
        const int i = rows[e / 2], j = j0 + 8 * n + 2 * t + (e & 1);
        s[n][e] = heads.dropout.active() && p != 0.0f ? p * drop.factor(h, i, j) : p;
      }
    accumulate_product<HS, kTile, D>(o, s, values);
  }
  ANVIL_UNROLL
  for (int r = 0; r < 2; r++) {
    const int i = rows[r];
    const float sum = quad_sum(l[r]);
    if (i >= T) continue;
    float* y = out + (static_cast<long>(b) * T + i) * heads.q_channels() + col.q;
    ANVIL_UNROLL
    for (int n = 0; n < HS / 8; n++) {
      y[8 * n + 2 * t] = o[n][2 * r] / sum;
      y[8 * n + 2 * t + 1] = o[n][2 * r + 1] / sum;
    }
    if (t == 0) lse[(static_cast<long>(b) * heads.n_heads + h) * T + i] = (m[r] + log2f(sum)) * kLn2;
  }
}

// ---- backward

// Probability and score gradient at (i, j) from the recomputed raw score s and dP = dout·vᵀ:
// p·m and scale·p·(m·dP - D), m the dropout factor (1 without dropout); 0 where j is hidden.
// lse2_i is the row's log-sum-exp times log2(e); scale2 and slope2 are scale and slope times it.
// Without kMasked, (i, j) is known to be visible.
struct Gradients {
  float pm, ds;
};
template <bool kMasked>
__device__ inline Gradients score_gradients(float s, float dp, int h, int i, int j, float lse2_i, float d_i,
                                            const Window& w, float scale, float scale2, float slope2,
                                            const AttentionHeads& heads, const DropoutMask& drop) {
  if (kMasked && !w.visible(i, j)) return {0.0f, 0.0f};
  const float p = exp2f(s * scale2 - (lse2_i - slope2 * static_cast<float>(j - i)));
  const float m = heads.dropout.active() ? drop.factor(h, i, j) : 1.0f;
  return {p * m, scale * p * (dp * m - d_i)};
}

// dK and dV of 64 keys of one key/value head: a block per (64 keys, key/value head, sequence).
// Each group of 32 lanes owns 16 keys and sums over the group's query heads in order, and over
// each head's query blocks in order, kQ queries a step: 32 at head size 128, where this kernel's
// registers (K's and V's fragments besides dK's and dV's) are full (ptxas, sm_90a: 255 registers
// and a 144-byte spill frame; 64 queries need 424 bytes).
template <int HS, ComputeDtype D>
__global__ void flash_backward_kv_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                                         const float* delta, const int32_t* positions, int T, float scale,
                                         AttentionHeads heads) {
  constexpr int kQ = HS == 128 ? 32 : kTile;
  __shared__ __align__(16) uint32_t queries[kQ * kRowWords<HS>];
  __shared__ __align__(16) uint32_t grads[kQ * kRowWords<HS>];  // dout's rows
  __shared__ float tile_lse[kQ], tile_delta[kQ];  // lse times log2(e)
  const int kvh = blockIdx.y, b = blockIdx.z, ld = heads.qkv_channels(), C = heads.q_channels();
  const int lane = static_cast<int>(threadIdx.x) % kMmaLanes, g = lane / 4, t = lane % 4;
  const int j0 = blockIdx.x * kRows, key0 = j0 + static_cast<int>(threadIdx.x) / kMmaLanes * 16;
  const int keys[2] = {key0 + g, key0 + g + 8};
  const float* x = qkv + static_cast<long>(b) * T * ld;
  const Window w{positions ? positions + static_cast<long>(b) * T : nullptr, T, heads.window};
  const Columns kv_col(heads, kvh * heads.group());
  const DropoutMask drop(heads.dropout, b, T);

  uint32_t k[HS / 16][4], v[HS / 16][4];
  load_a_rows<HS, D>(k, x + kv_col.k, ld, key0, T);
  load_a_rows<HS, D>(v, x + kv_col.v, ld, key0, T);
  float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};
  const float scale2 = scale * kLog2e;
  for (int h = kvh * heads.group(); h < (kvh + 1) * heads.group(); h++) {
    const Columns col(heads, h);
    const float slope2 = (heads.alibi ? alibi_slope(h, heads.n_heads, heads.alibi_bias_max) : 0.0f) * kLog2e;
    const long stats = (static_cast<long>(b) * heads.n_heads + h) * T;
    for (int i0 = j0; i0 < T; i0 += kQ) {
      __syncthreads();
      load_tile<HS, kQ, D>(queries, x + static_cast<long>(i0) * ld + col.q, ld, T - i0);
      load_tile<HS, kQ, D>(grads, dout + (static_cast<long>(b) * T + i0) * C + col.q, C, T - i0);
      for (int r = threadIdx.x; r < kQ; r += kThreads) {
        tile_lse[r] = i0 + r < T ? lse[stats + i0 + r] * kLog2e : 0.0f;
        tile_delta[r] = i0 + r < T ? delta[stats + i0 + r] : 0.0f;
      }
      __syncthreads();
      // Sᵀ (16 keys x kQ queries) = K Qᵀ and dPᵀ = V dOᵀ.
      float s[kQ / 8][4], dp[kQ / 8][4];
      product_with_tile_rows<HS, kQ, D>(s, k, queries);
      product_with_tile_rows<HS, kQ, D>(dp, v, grads);
      const float *lse2 = tile_lse, *d = tile_delta;
      with_mask(!w.all_visible(i0, i0 + kQ - 1, key0, key0 + 15), [&](auto masked) {
        ANVIL_UNROLL
        for (int n = 0; n < kQ / 8; n++)
          ANVIL_UNROLL
          for (int e = 0; e < 4; e++) {
            const int r = 8 * n + 2 * t + (e & 1), i = i0 + r, j = keys[e / 2];
            const Gradients gr = score_gradients<decltype(masked)::value>(
                s[n][e], dp[n][e], h, i, j, lse2[r], d[r], w, scale, scale2, slope2, heads, drop);
            s[n][e] = gr.pm;
            dp[n][e] = gr.ds;
          }
      });
      // dV += Pᵀ dO and dK += dSᵀ Q, the tiles' rows being the products' k.
      accumulate_product<HS, kQ, D>(dv, s, grads);
      accumulate_product<HS, kQ, D>(dk, dp, queries);
    }
  }
  ANVIL_UNROLL
  for (int r = 0; r < 2; r++) {
    if (keys[r] >= T) continue;
    float* row = dqkv + (static_cast<long>(b) * T + keys[r]) * ld;
    ANVIL_UNROLL
    for (int n = 0; n < HS / 8; n++)
      ANVIL_UNROLL
      for (int e = 0; e < 2; e++) {
        row[kv_col.k + 8 * n + 2 * t + e] = dk[n][2 * r + e];
        row[kv_col.v + 8 * n + 2 * t + e] = dv[n][2 * r + e];
      }
  }
}

// dQ of 64 queries of one head: a block per (64 queries, head, sequence), over the key blocks in
// order.
template <int HS, ComputeDtype D>
__global__ void flash_backward_q_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                                        const float* delta, const int32_t* positions, int T, float scale,
                                        AttentionHeads heads) {
  __shared__ __align__(16) uint32_t keys[kTile * kRowWords<HS>];
  __shared__ __align__(16) uint32_t values[kTile * kRowWords<HS>];
  __shared__ int first;
  const QueryBlock qb(qkv, positions, T, scale, heads);
  const int h = qb.h, b = qb.b, q0 = qb.q0, row0 = qb.row0, ld = heads.qkv_channels(), C = heads.q_channels();
  const int t = threadIdx.x % 4;
  const int* rows = qb.rows;
  const float* x = qb.x;
  const Window& w = qb.w;
  const Columns& col = qb.col;
  const float scale2 = qb.scale2, slope2 = qb.slope2;
  const DropoutMask& drop = qb.drop;
  const long stats = (static_cast<long>(b) * heads.n_heads + h) * T;

  uint32_t q[HS / 16][4], go[HS / 16][4];
  load_a_rows<HS, D>(q, x + col.q, ld, row0, T);
  load_a_rows<HS, D>(go, dout + static_cast<long>(b) * T * C + col.q, C, row0, T);
  float row_lse[2], row_delta[2];  // lse times log2(e)
  ANVIL_UNROLL
  for (int r = 0; r < 2; r++) {
    row_lse[r] = rows[r] < T ? lse[stats + rows[r]] * kLog2e : 0.0f;
    row_delta[r] = rows[r] < T ? delta[stats + rows[r]] : 0.0f;
  }
  float dq[HS / 8][4] = {};

  first_key_of_block(&first, w, q0);
  const int last = min(q0 + kRows, T) - 1;
  for (int j0 = first / kTile * kTile; j0 <= last; j0 += kTile) {
    __syncthreads();
    load_tile<HS, kTile, D>(keys, x + static_cast<long>(j0) * ld + col.k, ld, T - j0);
    load_tile<HS, kTile, D>(values, x + static_cast<long>(j0) * ld + col.v, ld, T - j0);
    __syncthreads();
    float s[8][4], dp[8][4];
    product_with_tile_rows<HS, kTile, D>(s, q, keys);
    product_with_tile_rows<HS, kTile, D>(dp, go, values);
    with_mask(!w.all_visible(row0, row0 + 15, j0, j0 + kTile - 1), [&](auto masked) {
      ANVIL_UNROLL
      for (int n = 0; n < 8; n++)
        ANVIL_UNROLL
        for (int e = 0; e < 4; e++) {
          const int i = rows[e / 2], j = j0 + 8 * n + 2 * t + (e & 1);
          dp[n][e] = score_gradients<decltype(masked)::value>(s[n][e], dp[n][e], h, i, j, row_lse[e / 2],
                                                              row_delta[e / 2], w, scale, scale2, slope2, heads, drop)
                         .ds;
        }
    });
    // dQ += dS K.
    accumulate_product<HS, kTile, D>(dq, dp, keys);
  }
  ANVIL_UNROLL
  for (int r = 0; r < 2; r++) {
    if (rows[r] >= T) continue;
    float* row = dqkv + (static_cast<long>(b) * T + rows[r]) * ld + col.q;
    ANVIL_UNROLL
    for (int n = 0; n < HS / 8; n++)
      ANVIL_UNROLL
      for (int e = 0; e < 2; e++) row[8 * n + 2 * t + e] = dq[n][2 * r + e];
  }
}

// The row sums D of every sequence.
GpuScratch delta_scratch;

// f.run<HS, D>() for the heads' size and operand dtype (flash_attention_supported).
template <class F>
void with_shape(const AttentionHeads& heads, const F& f) {
  const bool bf16 = heads.operands == ComputeDtype::kBf16;
  constexpr ComputeDtype kBf16 = ComputeDtype::kBf16, kFp16 = ComputeDtype::kFp16;
  switch (heads.head_size) {
    case 16: return bf16 ? f.template run<16, kBf16>() : f.template run<16, kFp16>();
    case 32: return bf16 ? f.template run<32, kBf16>() : f.template run<32, kFp16>();
    case 64: return bf16 ? f.template run<64, kBf16>() : f.template run<64, kFp16>();
    default: return bf16 ? f.template run<128, kBf16>() : f.template run<128, kFp16>();
  }
}

struct Forward {
  float* out;
  float* lse;
  const float* qkv;
  const int32_t* positions;
  int B, T;
  float scale;
  AttentionHeads heads;
  template <int HS, ComputeDtype D>
  void run() const {
    const dim3 grid((T + kRows - 1) / kRows, heads.n_heads, B);
    GPU_LAUNCH((flash_forward_kernel<HS, D>), grid, kThreads)(out, lse, qkv, positions, T, scale, heads);
    GPU_CHECK_LAUNCH();
  }
};

struct Backward {
  float* dqkv;
  const float* dout;
  const float* qkv;
  const float* lse;
  const float* delta;
  const int32_t* positions;
  int B, T;
  float scale;
  AttentionHeads heads;
  template <int HS, ComputeDtype D>
  void run() const {
    const int blocks = (T + kRows - 1) / kRows;
    GPU_LAUNCH((flash_backward_kv_kernel<HS, D>), dim3(blocks, heads.n_kv_heads, B), kThreads)(
        dqkv, dout, qkv, lse, delta, positions, T, scale, heads);
    GPU_CHECK_LAUNCH();
    GPU_LAUNCH((flash_backward_q_kernel<HS, D>), dim3(blocks, heads.n_heads, B), kThreads)(
        dqkv, dout, qkv, lse, delta, positions, T, scale, heads);
    GPU_CHECK_LAUNCH();
  }
};

// The tiles are read 16 bytes at a time: each array starts on 16 bytes, and its rows, heads and
// sequences are multiples of 4 floats (every supported head size is).
void check_aligned(const float* a, const char* name) {
  ANVIL_CHECK(reinterpret_cast<uintptr_t>(a) % 16 == 0, "flash attention: {} is not 16-byte aligned", name);
}

}  // namespace

bool flash_attention_supported(const AttentionHeads& heads) {
  const int hs = heads.head_size;
  return heads.operands != ComputeDtype::kFp32 && (hs == 16 || hs == 32 || hs == 64 || hs == 128);
}

void flash_attention_forward(float* out, float* lse, const float* qkv, const int32_t* positions, int B, int T,
                             const AttentionHeads& heads) {
  check_aligned(qkv, "qkv");
  const float scale = 1.0f / std::sqrt(static_cast<float>(heads.head_size));
  with_shape(heads, Forward{out, lse, qkv, positions, B, T, scale, heads});
}

void flash_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                              const int32_t* positions, int B, int T, const AttentionHeads& heads) {
  check_aligned(qkv, "qkv");
  check_aligned(dout, "dout");
  const float scale = 1.0f / std::sqrt(static_cast<float>(heads.head_size));
  const int C = heads.q_channels(), NH = heads.n_heads;
  float* delta = static_cast<float*>(delta_scratch.get(static_cast<size_t>(B) * NH * T * sizeof(float)));
  for (int b = 0; b < B; b++) {
    const long rows = static_cast<long>(b) * T * C;
    attention_delta(delta + static_cast<long>(b) * NH * T, dout + rows, out + rows, T, C, NH);
  }
  with_shape(heads, Backward{dqkv, dout, qkv, lse, delta, positions, B, T, scale, heads});
}

}  // namespace anvil::gpu
#endif  // ANVIL_HIP
