// The tensor-core product of device/mma.h against a plain matrix product, its fragments filled
// element by element from the PTX ISA's formulas for mma.m16n8k16 (not through the helpers the
// kernels use), so that the layout the flash kernels assume is the instruction's: on an NVIDIA GPU
// this checks the mma instruction; on the emulated GPU (both warp widths) the portable version.
// The values are small integers, so every sum is exact and the results must match bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "device/device.h"
#include "device/mma.h"
#include "device/stream.h"

namespace anvil::gpu {
namespace {

constexpr int kGroups = 2;  // two 32-lane groups per block: two warps, or one AMD wavefront

// For group q: d (16x8) = c + a (16x16) · b (16x8), all row-major floats, the q-th of each.
template <ComputeDtype D>
__global__ void mma_kernel(float* d, const float* a, const float* b, const float* c) {
  const int q = static_cast<int>(threadIdx.x) / kMmaLanes, lane = static_cast<int>(threadIdx.x) % kMmaLanes;
  const int group = lane >> 2, in_group = lane % 4;
  a += q * 256;
  b += q * 128;
  c += q * 128;
  d += q * 128;
  uint32_t ra[4] = {}, rb[2] = {};
  for (int i = 0; i < 8; i++) {
    const int row = (i < 2 || (i >= 4 && i < 6)) ? group : group + 8;
    const int col = in_group * 2 + (i & 1) + (i >= 4 ? 8 : 0);
    ra[i / 2] |= bits16<D>(a[row * 16 + col]) << (16 * (i & 1));
  }
  for (int i = 0; i < 4; i++) {
    const int row = in_group * 2 + (i & 1) + (i >= 2 ? 8 : 0);
    rb[i / 2] |= bits16<D>(b[row * 8 + group]) << (16 * (i & 1));
  }
  float acc[4];
  for (int i = 0; i < 4; i++) acc[i] = c[(i < 2 ? group : group + 8) * 8 + in_group * 2 + (i & 1)];
  mma_16816<D>(acc, ra, rb);
  for (int i = 0; i < 4; i++) d[(i < 2 ? group : group + 8) * 8 + in_group * 2 + (i & 1)] = acc[i];
}

template <ComputeDtype D>
void check_mma() {
  std::vector<float> a(kGroups * 256), b(kGroups * 128), c(kGroups * 128), want(kGroups * 128);
  for (size_t i = 0; i < a.size(); i++) a[i] = static_cast<float>(static_cast<int>((i * 37 + 11) % 17) - 8);
  for (size_t i = 0; i < b.size(); i++) b[i] = static_cast<float>(static_cast<int>((i * 53 + 5) % 15) - 7);
  for (size_t i = 0; i < c.size(); i++) c[i] = static_cast<float>(static_cast<int>(i % 9) - 4) * 0.5f;
  for (int q = 0; q < kGroups; q++)
    for (int r = 0; r < 16; r++)
      for (int n = 0; n < 8; n++) {
        float s = c[q * 128 + r * 8 + n];
        for (int k = 0; k < 16; k++) s += a[q * 256 + r * 16 + k] * b[q * 128 + k * 8 + n];
        want[q * 128 + r * 8 + n] = s;
      }
  auto* da = static_cast<float*>(gpu_alloc(a.size() * sizeof(float)));
  auto* db = static_cast<float*>(gpu_alloc(b.size() * sizeof(float)));
  auto* dc = static_cast<float*>(gpu_alloc(c.size() * sizeof(float)));
  auto* dd = static_cast<float*>(gpu_alloc(want.size() * sizeof(float)));
  gpu_copy_to_device(da, a.data(), a.size() * sizeof(float));
  gpu_copy_to_device(db, b.data(), b.size() * sizeof(float));
  gpu_copy_to_device(dc, c.data(), c.size() * sizeof(float));
  GPU_LAUNCH(mma_kernel<D>, 1, kGroups * kMmaLanes)(dd, da, db, dc);
  std::vector<float> got(want.size());
  gpu_copy_to_host(got.data(), dd, got.size() * sizeof(float));
  for (float* p : {da, db, dc, dd}) gpu_release(p);
  for (size_t i = 0; i < got.size(); i++) ASSERT_EQ(got[i], want[i]) << "group " << i / 128 << ", row "
                                                                      << i % 128 / 8 << ", column " << i % 8;
}

TEST(Mma, Bf16ProductMatchesTheLayout) {
  if (gpu_devices().empty()) GTEST_SKIP() << "no GPU visible (" << gpu_backend_description() << ")";
  gpu_select(0);
  check_mma<ComputeDtype::kBf16>();
}

TEST(Mma, Fp16ProductMatchesTheLayout) {
  if (gpu_devices().empty()) GTEST_SKIP() << "no GPU visible (" << gpu_backend_description() << ")";
  gpu_select(0);
  check_mma<ComputeDtype::kFp16>();
}

// bits16 rounds as round_to_dtype does: ties to even, fp16's overflow and subnormals, NaN kept.
TEST(Mma, SixteenBitConversionRoundsToNearestEven) {
  const auto bf16 = [](float x) { return bits16<ComputeDtype::kBf16>(x); };
  const auto fp16 = [](float x) { return bits16<ComputeDtype::kFp16>(x); };
  EXPECT_EQ(bf16(1.0f), 0x3f80u);
  EXPECT_EQ(bf16(1.0f + 1.0f / 256), 0x3f80u);              // a tie: to the even neighbour
  EXPECT_EQ(bf16(1.0f + 3.0f / 256), 0x3f82u);              // a tie: up to the even one
  EXPECT_EQ(bf16(-2.5f), 0xc020u);
  EXPECT_EQ(bf16(std::nanf("")) & 0x7fc0u, 0x7fc0u);
  EXPECT_EQ(fp16(1.0f), 0x3c00u);
  EXPECT_EQ(fp16(1.0f + 1.0f / 2048), 0x3c00u);             // a tie: to even
  EXPECT_EQ(fp16(1.0f + 3.0f / 2048), 0x3c02u);
  EXPECT_EQ(fp16(-65504.0f), 0xfbffu);                       // the largest half
  EXPECT_EQ(fp16(65520.0f), 0x7c00u);                        // rounds past it: infinity
  EXPECT_EQ(fp16(1.0f / 16777216), 0x0001u);                 // the smallest subnormal
  EXPECT_EQ(fp16(1.5f / 16777216), 0x0002u);                 // a tie between subnormals: to even
  EXPECT_EQ(fp16(1.0f / 16384 - 1.0f / 33554432), 0x0400u);  // rounds up to the smallest normal
  EXPECT_EQ(fp16(std::nanf("")) & 0x7e00u, 0x7e00u);
  for (float x : {0.0f, 1.0f, -3.25f, 1000.5f, -65504.0f, 1.0f / 16384, 1.0f / 16777216, 3.0f / 16777216})
    EXPECT_EQ(float16_value<ComputeDtype::kFp16>(fp16(x)), x) << x;  // values of fp16: exact
}

}  // namespace
}  // namespace anvil::gpu
