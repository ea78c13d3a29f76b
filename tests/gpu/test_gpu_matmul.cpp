// The GPU's matrix products with a held weight (MatmulContext::hold_weight): under 16-bit
// operands the GPU keeps the held weight's 16-bit copy for the products that follow, so a new
// hold must make a new copy even when the weight is the same array with new values (the LM head
// after an optimizer step). The op table checks the products themselves against the reference.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "compare.h"
#include "device/device.h"
#include "kernels/matmul.h"
#include "kernels/round.h"

namespace anvil {
namespace {

std::vector<float> bf16_values(size_t n, uint64_t stream) {
  std::vector<float> v = testing::randn(n, stream);
  ref::round_to_dtype(v.data(), static_cast<long>(v.size()), ComputeDtype::kBf16);
  return v;
}

TEST(GpuMatmul, HeldWeightFollowsEachHold) {
  if (gpu_devices().empty()) GTEST_SKIP() << "no GPU visible (" << gpu_backend_description() << ")";
  gpu_select(0);
  const int N = 16, C = 32, OC = 48;
  const size_t w_bytes = sizeof(float) * OC * C, x_bytes = sizeof(float) * N * C, y_bytes = sizeof(float) * N * OC;
  auto* w = static_cast<float*>(gpu_alloc(w_bytes));
  auto* x = static_cast<float*>(gpu_alloc(x_bytes));
  auto* y = static_cast<float*>(gpu_alloc(y_bytes));
  gpu_copy_to_device(x, bf16_values(static_cast<size_t>(N) * C, 1).data(), x_bytes);
  MatmulContext ctx(KernelImpl::kGpu, ComputeDtype::kBf16);
  // The forward product with weight values `values`, held or not.
  const auto product = [&](const std::vector<float>& values, bool held) {
    gpu_copy_to_device(w, values.data(), w_bytes);
    if (held) ctx.hold_weight(w, OC, C);
    gpu::matmul_forward(ctx, y, x, w, nullptr, N, C, OC);
    if (held) ctx.release_weight();
    std::vector<float> out(static_cast<size_t>(N) * OC);
    gpu_copy_to_host(out.data(), y, y_bytes);
    return out;
  };
  const std::vector<float> first = bf16_values(static_cast<size_t>(OC) * C, 2);
  const std::vector<float> second = bf16_values(static_cast<size_t>(OC) * C, 3);
  const std::vector<float> first_held = product(first, true), second_held = product(second, true);
  EXPECT_EQ(first_held, product(first, false)) << "the held copy gives other bits than the weight itself";
  EXPECT_EQ(second_held, product(second, false)) << "a new hold of the same array kept the old copy";
  EXPECT_NE(first_held, second_held);
  gpu_release(w);
  gpu_release(x);
  gpu_release(y);
}

}  // namespace
}  // namespace anvil
