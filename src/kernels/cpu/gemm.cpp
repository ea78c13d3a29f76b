// gemm(): chooses the instruction set's blocked implementation (gemm_blocked.h) and gives it
// this thread's packing buffers.
#include "kernels/cpu/gemm.h"

#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <vector>

#include "core/cpu.h"
#include "core/error.h"
#include "kernels/cpu/best_rate.h"

namespace anvil::cpu {
namespace {

// This thread's packing buffers, allocated on its first product and reused after.
struct PackBuffers {
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> a{std::aligned_alloc(64, sizeof(float) * kGemmMc * kGemmKc)};
  std::unique_ptr<void, Free> b{std::aligned_alloc(64, sizeof(float) * kGemmNc * kGemmKc)};
};
PackBuffers& pack_buffers() {
  thread_local PackBuffers buffers;
  ANVIL_CHECK(buffers.a && buffers.b, "out of memory for the GEMM packing buffers");
  return buffers;
}

const GemmKernels& kernels_for(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::amx: return gemm_kernels_amx();
    case GemmIsa::avx512bf16: return gemm_kernels_avx512bf16();
    case GemmIsa::avx512: return gemm_kernels_avx512();
    case GemmIsa::avx2: return gemm_kernels_avx2();
    case GemmIsa::portable: break;
  }
  return gemm_kernels_portable();
}

// bf16 products run with subnormals flushed to zero on input and output (the x86 FTZ and DAZ
// bits), which is what VDPBF16PS does whatever the control register says; restored on exit.
class FlushSubnormals {
 public:
  FlushSubnormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }
  ~FlushSubnormals() { _mm_setcsr(saved_); }
  FlushSubnormals(const FlushSubnormals&) = delete;
  FlushSubnormals& operator=(const FlushSubnormals&) = delete;

 private:
  unsigned saved_;
};

// parallel_gemm: every element has the same bits however the output is cut, so the grid is
// chosen for speed alone: each block is one single-threaded gemm() call, handed out
// over OpenMP threads. A call packs its A rows and B columns once for the whole block, so large
// blocks pack less; but threads take blocks dynamically, and the last block finishing alone is
// what large blocks cost. Sides start at kMaxSide at most; then the longer side is halved (which
// adds the least packing) until there are four blocks per thread, stopping at kMinSide.
// Outputs of at most kGemmMc rows (one sequence's gradients) are the exception: there each
// column block packs all of A again and adds no B packing, so the columns are cut evenly into
// as few blocks as give every thread the same number (measured: 64-row input gradients with
// long sums went from 0.7 to 0.8-0.9 of OpenBLAS).
constexpr int kMaxSide = 512, kMinSide = 64;

// Blocks of band rows × width columns (the last ones smaller).
struct BlockGrid {
  int band, width;
};

BlockGrid block_grid(int rows, int cols) {
  const int threads = std::max(1, omp_get_max_threads());
  int band = std::min(rows, kMaxSide), width = std::min(cols, kMaxSide);
  if (rows <= kGemmMc) {
    const int per_thread = (cols + threads * kMaxSide - 1) / (threads * kMaxSide);
    const int even = (cols + threads * per_thread - 1) / (threads * per_thread);
    width = std::min(cols, (even + 31) / 32 * 32);  // whole 32-column tiles (NR divides 32)
  } else {
    auto count = [&] { return ((rows + band - 1) / band) * ((cols + width - 1) / width); };
    while (count() < 4 * threads && (band > kMinSide || width > kMinSide)) {
      if (band >= width && band > kMinSide)
        band = std::max(kMinSide, (band + 1) / 2);
      else
        width = std::max(kMinSide, (width + 1) / 2);
    }
  }
  return {band, width};
}

// Calls block(r0, rows, c0, cols) for each block of a rows × cols output, in parallel.
template <typename Block>
void for_each_block(int rows, int cols, BlockGrid grid, const Block& block) {
  const int col_blocks = (cols + grid.width - 1) / grid.width, row_blocks = (rows + grid.band - 1) / grid.band;
#pragma omp parallel for schedule(dynamic)
  for (int t = 0; t < row_blocks * col_blocks; t++) {
    const int r0 = (t / col_blocks) * grid.band, c0 = (t % col_blocks) * grid.width;
    block(r0, std::min(grid.band, rows - r0), c0, std::min(grid.width, cols - c0));
  }
}

// With B packed ahead, what a block adds to its products is packing its rows of A, once per
// kGemmNc columns whatever the block's width: so blocks span kGemmNc columns (or all of a
// narrower output), and rows are cut into as many bands as give each thread the same number
// of blocks, up to four of at least 256 rows each (whole 12-row tiles: 12 is a multiple of the
// vector kernels' MR; AMX's 32-row tiles get an edge tile in a band).
BlockGrid packed_block_grid(int rows, int cols) {
  const int threads = std::max(1, omp_get_max_threads());
  const int width = std::min(cols, kGemmNc), col_blocks = (cols + width - 1) / width;
  const int per_thread = std::clamp(rows / (threads * 256), 1, 4);
  const int bands = std::max(1, (threads * per_thread + col_blocks - 1) / col_blocks);
  return {std::max(12, ((rows + bands - 1) / bands + 11) / 12 * 12), width};
}

// A B small enough to pack once for the whole product, where blocks would each pack it again.
constexpr long kPackOnceMax = 1L << 21;  // elements: 8 MB of fp32

void run(GemmPrecision precision, GemmIsa isa, GemmCall call) {
  const GemmKernels& kernels = kernels_for(isa);
  if (precision == GemmPrecision::fp32) return kernels.fp32(call);
  const FlushSubnormals flush;
  if (kernels.pairs) return kernels.pairs(call);
  call.bf16_operands = true;
  kernels.fp32(call);
}

// The B block a team of threads packs together (parallel_gemm), allocated on first use: one per
// calling thread, so that products called from several threads at once (the tests run
// tensor-parallel ranks as threads of one process) do not share it.
void* team_b_buffer() {
  thread_local const std::unique_ptr<void, PackBuffers::Free> buffer{
      std::aligned_alloc(64, sizeof(float) * kGemmTeamMaxN * kGemmTeamBlocks * kGemmKc)};
  ANVIL_CHECK(buffer, "out of memory for the GEMM packing buffers");
  return buffer.get();
}

// Linux gives a process AMX's tile state (8 KB more per thread's saved context) only when the
// process asks for it; without it the first tile instruction is a fault.
bool tile_state_granted() {
  constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;  // <asm/prctl.h>, the kernel's xstate
  static const bool granted = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return granted;
}

// The bf16 product's rate on isa: one thread, a block of a sequence's rows into a model's width.
double bf16_rate(GemmIsa isa) {
  constexpr int M = 192, N = 512, K = 512;
  std::vector<float> a(static_cast<size_t>(M) * K), b(static_cast<size_t>(K) * N), c(static_cast<size_t>(M) * N);
  for (size_t i = 0; i < a.size(); i++) a[i] = static_cast<float>(i % 97) * 0.01f;
  for (size_t i = 0; i < b.size(); i++) b[i] = static_cast<float>(i % 89) * 0.01f;
  return best_gflops(2.0 * M * N * K, 0.005, 3, [&] {
    gemm(GemmPrecision::bf16, M, N, K, {a.data(), K, 1}, {b.data(), N, 1}, c.data(), N, false, isa);
  });
}

}  // namespace

bool gemm_isa_supported(GemmIsa isa) {
  const CpuInfo& cpu = cpu_info();
  switch (isa) {
    case GemmIsa::amx: return cpu.avx512 && cpu.fma && cpu.amx_bf16 && tile_state_granted();
    case GemmIsa::avx512bf16: return cpu.avx512 && cpu.avx512bf16 && cpu.fma;
    case GemmIsa::avx512: return cpu.avx512 && cpu.fma;
    case GemmIsa::avx2: return cpu.avx2 && cpu.fma;
    case GemmIsa::portable: return true;
  }
  return false;
}

GemmIsa gemm_isa(GemmPrecision precision) {
  static const GemmIsa fp32 = [] {
    for (GemmIsa isa : {GemmIsa::avx512, GemmIsa::avx2})
      if (gemm_isa_supported(isa)) return isa;
    return GemmIsa::portable;
  }();
  if (precision == GemmPrecision::fp32) return fp32;
  static const GemmIsa bf16 = [] {
    if (gemm_isa_supported(GemmIsa::amx)) return GemmIsa::amx;
    if (!gemm_isa_supported(GemmIsa::avx512bf16)) return fp32;
    return bf16_rate(GemmIsa::avx512bf16) >= bf16_rate(fp32) ? GemmIsa::avx512bf16 : fp32;
  }();
  return bf16;
}

std::vector<GemmIsa> gemm_bf16_isas() {
  std::vector<GemmIsa> isas{gemm_isa(GemmPrecision::fp32)};
  for (GemmIsa isa : {GemmIsa::avx512bf16, GemmIsa::amx})
    if (gemm_isa_supported(isa)) isas.push_back(isa);
  return isas;
}

std::string gemm_isa_name(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::amx: return "amx";
    case GemmIsa::avx512bf16: return "avx512_bf16";
    case GemmIsa::avx512: return "avx512";
    case GemmIsa::avx2: return "avx2";
    case GemmIsa::portable: break;
  }
  return "portable";
}

void gemm(GemmPrecision precision, int M, int N, int K, GemmOperand a, GemmOperand b, float* c, long ldc,
          bool accumulate, GemmIsa isa) {
  ANVIL_CHECK(gemm_isa_supported(isa), "this CPU cannot run the {} GEMM kernels", gemm_isa_name(isa));
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    if (!accumulate)
      for (int i = 0; i < M; i++) std::fill(c + i * ldc, c + i * ldc + N, 0.0f);
    return;
  }
  PackBuffers& buffers = pack_buffers();
  run(precision, isa, {M, N, K, a, {b.data, b.col_stride, b.row_stride}, c, ldc, accumulate, false, buffers.a.get(),
                        buffers.b.get(), 0, 1, nullptr, 0});
}

void gemm(GemmPrecision precision, int M, int N, int K, GemmOperand a, GemmOperand b, float* c, long ldc,
          bool accumulate) {
  gemm(precision, M, N, K, a, b, c, ldc, accumulate, gemm_isa(precision));
}

void parallel_gemm(GemmPrecision precision, int M, int N, int K, GemmOperand a, GemmOperand b, float* c, long ldc,
                   bool accumulate) {
  parallel_gemm(precision, M, N, K, a, b, c, ldc, accumulate, gemm_isa(precision));
}

void parallel_gemm(GemmPrecision precision, int M, int N, int K, GemmOperand a, GemmOperand b, float* c, long ldc,
                   bool accumulate, GemmIsa isa) {
  ANVIL_CHECK(gemm_isa_supported(isa), "this CPU cannot run the {} GEMM kernels", gemm_isa_name(isa));
  // A long sum into a small output (the LM head's input gradient: 256 × 256 from 50257 terms)
  // would have every block pack most of both operands; there the threads work as one team on
  // one product, sharing the packed B. Not where B is read in place anyway (few rows, B's rows
  // contiguous: gemm_blocked.h). Elsewhere, independent blocks.
  const int threads = omp_get_max_threads();
  const bool b_in_place = precision == GemmPrecision::fp32 && b.col_stride == 1 && M <= kGemmMc;
  if (threads > 1 && K > 2 * std::max(M, N) && N <= kGemmTeamMaxN && !b_in_place && !omp_in_parallel()) {
    void* shared_b = team_b_buffer();
#pragma omp parallel
    {
      const GemmCall call{M, N, K, a, {b.data, b.col_stride, b.row_stride}, c, ldc, accumulate, false,
                          pack_buffers().a.get(), shared_b, omp_get_thread_num(), omp_get_num_threads(), nullptr, 0};
      run(precision, isa, call);
    }
    return;
  }
  const BlockGrid grid = block_grid(M, N);
  if (grid.band < M && static_cast<long>(K) * N <= kPackOnceMax && !omp_in_parallel()) {
    // Several bands of rows would each pack all of B: pack it once (the weight gradients'
    // inputs, the microbatch's forward products).
    thread_local GemmPackedB packed;
    packed.pack(precision, K, N, b, isa);
    return parallel_gemm(precision, M, N, K, a, packed, 0, 0, c, ldc, accumulate);
  }
  for_each_block(M, N, grid, [&](int i0, int rows, int j0, int cols) {
    gemm(precision, rows, cols, K, {a.data + i0 * a.row_stride, a.row_stride, a.col_stride},
         {b.data + j0 * b.col_stride, b.row_stride, b.col_stride}, c + i0 * ldc + j0, ldc, accumulate, isa);
  });
}

void GemmPackedB::Free::operator()(void* p) const { std::free(p); }

void GemmPackedB::pack(GemmPrecision precision, int K, int N, GemmOperand b, GemmIsa isa) {
  ANVIL_CHECK(gemm_isa_supported(isa), "this CPU cannot run the {} GEMM kernels", gemm_isa_name(isa));
  ANVIL_CHECK(K > 0 && N > 0, "GemmPackedB::pack: an empty matrix ({} × {})", K, N);
  const GemmKernels& kernels = kernels_for(isa);
  const bool pairs = precision == GemmPrecision::bf16 && kernels.pairs;
  const int nr = pairs ? kernels.pairs_nr : kernels.fp32_nr;
  const int k_per_step = pairs ? 2 : 1;
  const long panels = (N + nr - 1) / nr, slot = static_cast<long>(kGemmKc / k_per_step) * nr;
  const long blocks = (K + (precision == GemmPrecision::bf16 ? K & 1 : 0) + kGemmKc - 1) / kGemmKc;
  const size_t bytes = sizeof(float) * static_cast<size_t>(blocks * panels * slot);
  if (bytes > capacity_) {
    data_.reset();  // the old storage goes before the new is taken
    data_.reset(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
    ANVIL_CHECK(data_, "out of memory for a packed GEMM operand ({} bytes)", bytes);
    capacity_ = bytes;
  }
  precision_ = precision, isa_ = isa, K_ = K, N_ = N, nr_ = nr, panels_ = panels, slot_ = slot;
  const bool emulated = !pairs && precision == GemmPrecision::bf16;  // the fp32 kernel on rounded pairs
  const GemmCall call{0, N, K, {}, {b.data, b.col_stride, b.row_stride}, nullptr, 0, false, emulated, nullptr, nullptr,
                      0, 1, nullptr, 0};
  void* dst = data_.get();
#pragma omp parallel
  {
    if (pairs)
      kernels.pairs_pack_b(call, dst);
    else
      kernels.fp32_pack_b(call, dst);
  }
}

void parallel_gemm(GemmPrecision precision, int M, int N, int K, GemmOperand a, const GemmPackedB& b, int k0, int j0,
                   float* c, long ldc, bool accumulate) {
  ANVIL_CHECK(!b.empty() && b.precision_ == precision, "parallel_gemm: B was not packed for this precision");
  ANVIL_CHECK(k0 >= 0 && j0 >= 0 && K >= 0 && N >= 0 && k0 + K <= b.K_ && j0 + N <= b.N_,
              "parallel_gemm: rows [{}, {}) × columns [{}, {}) are outside the packed {} × {} B", k0, k0 + K, j0,
              j0 + N, b.K_, b.N_);
  ANVIL_CHECK(k0 % kGemmKc == 0 && j0 % b.nr_ == 0,
              "parallel_gemm: a packed B's part must start at a k block ({}) and a panel ({})", kGemmKc, b.nr_);
  ANVIL_CHECK(precision == GemmPrecision::fp32 || K % 2 == 0 || k0 + K == b.K_,
              "parallel_gemm: a bf16 part of a packed B with an odd K must end at B's last k");
  if (M <= 0 || N <= 0) return;
  if (K == 0) return gemm(precision, M, N, 0, a, {nullptr, 0, 0}, c, ldc, accumulate, b.isa_);
  const auto* words = static_cast<const uint32_t*>(b.data_.get());
  for_each_block(M, N, packed_block_grid(M, N), [&](int i0, int rows, int c0, int cols) {
    PackBuffers& buffers = pack_buffers();
    run(precision, b.isa_,
        {rows, cols, K, {a.data + i0 * a.row_stride, a.row_stride, a.col_stride}, {}, c + i0 * ldc + c0, ldc,
         accumulate, false, buffers.a.get(), buffers.b.get(), 0, 1,
         words + (k0 / kGemmKc * b.panels_ + (j0 + c0) / b.nr_) * b.slot_, b.panels_});
  });
}

}  // namespace anvil::cpu
