// The GPU's matrix products with a held weight (MatmulContext::hold_weight): under 16-bit
// operands the GPU keeps the held weight's 16-bit copy for the products that follow, so a new
// hold must make a new copy even when the weight is the same array with new values (the LM head
// after an optimizer step). And matmul_forward_sequences and matmul_backward_sequences: each
// sequence the bits of its own products alone, whatever the number of sequences (on the hardware,
// the library's batched kernels running one sequence's algorithm). The op table checks the
// products themselves against the reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "compare.h"
#include "core/dtype.h"
#include "device/device.h"
#include "gpu_arrays.h"
#include "kernels/gpu/internal.h"
#include "kernels/matmul.h"
#include "kernels/round.h"

namespace anvil {
namespace {

std::vector<float> bf16_values(size_t n, uint64_t stream) {
  std::vector<float> v = testing::randn(n, stream);
  ref::round_to_dtype(v.data(), static_cast<long>(v.size()), ComputeDtype::kBf16);
  return v;
}

// The products of several sequences: a GPT-2-like block product, one whose outputs 16-bit products
// pad (196 to 200), a small one.
struct SequenceShape {
  int T, C, OC;
  bool bias;
};
constexpr SequenceShape kSequenceShapes[] = {{512, 256, 768, true}, {256, 128, 196, true}, {64, 40, 48, false}};
constexpr int kMaxSequences = 5;

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

TEST(GpuMatmul, SequencesHaveTheBitsOfTheirOwnProducts) {
  if (gpu_devices().empty()) GTEST_SKIP() << "no GPU visible (" << gpu_backend_description() << ")";
  gpu_select(0);
  constexpr int kMaxB = kMaxSequences;
  for (const ComputeDtype d : {ComputeDtype::kFp32, ComputeDtype::kBf16}) {
    for (const SequenceShape& s : kSequenceShapes) {
      const size_t x_n = static_cast<size_t>(kMaxB) * s.T * s.C, w_n = static_cast<size_t>(s.OC) * s.C,
                   y_n = static_cast<size_t>(kMaxB) * s.T * s.OC;
      auto* x = static_cast<float*>(gpu_alloc(x_n * sizeof(float)));
      auto* w = static_cast<float*>(gpu_alloc(w_n * sizeof(float)));
      auto* bias = static_cast<float*>(gpu_alloc(s.OC * sizeof(float)));
      auto* y = static_cast<float*>(gpu_alloc(y_n * sizeof(float)));
      gpu_copy_to_device(x, bf16_values(x_n, 4).data(), x_n * sizeof(float));
      gpu_copy_to_device(w, bf16_values(w_n, 5).data(), w_n * sizeof(float));
      gpu_copy_to_device(bias, bf16_values(s.OC, 6).data(), s.OC * sizeof(float));
      MatmulContext ctx(KernelImpl::kGpu, d);
      const float* b = s.bias ? bias : nullptr;
      const size_t seq_out = static_cast<size_t>(s.T) * s.OC, seq_in = static_cast<size_t>(s.T) * s.C;
      // Each sequence's product alone.
      std::vector<float> alone(y_n);
      for (int q = 0; q < kMaxB; q++) {
        gpu::matmul_forward(ctx, y + q * seq_out, x + q * seq_in, w, b, s.T, s.C, s.OC);
      }
      gpu_copy_to_host(alone.data(), y, y_n * sizeof(float));
      for (const int B : {1, 2, kMaxB}) {
        const std::vector<float> poison(y_n, std::numeric_limits<float>::quiet_NaN());
        gpu_copy_to_device(y, poison.data(), y_n * sizeof(float));
        gpu::matmul_forward_sequences(ctx, y, x, w, b, B, s.T, s.C, s.OC);
        std::vector<float> together(y_n);
        gpu_copy_to_host(together.data(), y, y_n * sizeof(float));
        const size_t n = B * seq_out;
        EXPECT_EQ(0, std::memcmp(together.data(), alone.data(), n * sizeof(float)))
            << B << " sequences of " << s.T << "x" << s.C << " -> " << s.OC << " in " << dtype_name(d)
            << ": not each sequence's own bits";
      }
      // The way taken where the library cannot batch them: a sequence at a time.
      gpu::matmul_split_batches(true);
      gpu_copy_to_device(y, std::vector<float>(y_n, std::numeric_limits<float>::quiet_NaN()).data(),
                         y_n * sizeof(float));
      gpu::matmul_forward_sequences(ctx, y, x, w, b, kMaxB, s.T, s.C, s.OC);
      gpu::matmul_split_batches(false);
      std::vector<float> split(y_n);
      gpu_copy_to_host(split.data(), y, y_n * sizeof(float));
      EXPECT_EQ(0, std::memcmp(split.data(), alone.data(), y_n * sizeof(float)))
          << "one at a time, " << s.T << "x" << s.C << " -> " << s.OC << " in " << dtype_name(d);
      gpu_release(x);
      gpu_release(w);
      gpu_release(bias);
      gpu_release(y);
    }
  }
}

// matmul_backward_sequences: each sequence's input gradient, and the weight and bias gradients it
// adds to (or writes into) a span of its own, the bits of that sequence alone (matmul_backward
// adding; one sequence's call writing), whatever the number of sequences; batched and a sequence at
// a time. Written spans' old values are not read.
TEST(GpuMatmul, SequencesGradientsHaveTheBitsOfTheirOwnProducts) {
  if (gpu_devices().empty()) GTEST_SKIP() << "no GPU visible (" << gpu_backend_description() << ")";
  gpu_select(0);
  constexpr int kMaxB = kMaxSequences;
  for (const ComputeDtype d : {ComputeDtype::kFp32, ComputeDtype::kBf16}) {
    for (const SequenceShape& s : kSequenceShapes) {
      const size_t seq_in = static_cast<size_t>(s.T) * s.C, seq_out = static_cast<size_t>(s.T) * s.OC,
                   span = static_cast<size_t>(s.OC) * s.C + s.OC, stride = span + 4;  // a gap between spans
      const size_t x_n = kMaxB * seq_in, g_n = kMaxB * seq_out, w_n = static_cast<size_t>(s.OC) * s.C,
                   grads_n = kMaxB * stride;
      float* x = testing::gpu_array(bf16_values(x_n, 7));
      float* dout = testing::gpu_array(bf16_values(g_n, 8));
      float* w = testing::gpu_array(bf16_values(w_n, 9));
      float* dinp = testing::gpu_array(std::vector<float>(x_n));
      const std::vector<float> grads_before = testing::randn(grads_n, 10);  // products that add add to them
      float* grads = testing::gpu_array(grads_before);
      MatmulContext ctx(KernelImpl::kGpu, d);
      auto bias_of = [&](float* dweight) { return s.bias ? dweight + w_n : nullptr; };
      struct Result {
        std::vector<float> dinp, grads;
      };
      auto result = [&]() { return Result{testing::host_array(dinp, x_n), testing::host_array(grads, grads_n)}; };
      auto reset = [&](const std::vector<float>& grads_now) {
        gpu_copy_to_device(dinp, std::vector<float>(x_n, std::numeric_limits<float>::quiet_NaN()).data(),
                           x_n * sizeof(float));
        gpu_copy_to_device(grads, grads_now.data(), grads_n * sizeof(float));
      };
      // The products added to zero spans: what written spans must come close to.
      reset(std::vector<float>(grads_n));
      for (int q = 0; q < kMaxB; q++)
        gpu::matmul_backward(ctx, dinp + q * seq_in, grads + q * stride, bias_of(grads + q * stride),
                             dout + q * seq_out, s.OC, x + q * seq_in, w, s.T, s.C, s.OC, false);
      const std::vector<float> from_zero = testing::host_array(grads, grads_n);
      for (const bool write : {false, true}) {
        // Written spans start as NaN: any value read from them would show.
        const std::vector<float> before =
            write ? std::vector<float>(grads_n, std::numeric_limits<float>::quiet_NaN()) : grads_before;
        reset(before);
        for (int q = 0; q < kMaxB; q++) {
          float* dw = grads + q * stride;
          if (write)
            gpu::matmul_backward_sequences(ctx, dinp + q * seq_in, dw, bias_of(dw), 0, dout + q * seq_out,
                                           x + q * seq_in, w, 1, s.T, s.C, s.OC, true);
          else
            gpu::matmul_backward(ctx, dinp + q * seq_in, dw, bias_of(dw), dout + q * seq_out, s.OC, x + q * seq_in,
                                 w, s.T, s.C, s.OC, false);
        }
        const Result alone = result();
        const std::string what = std::to_string(s.T) + "x" + std::to_string(s.C) + " -> " + std::to_string(s.OC) +
                                 " in " + dtype_name(d) + (write ? ", written" : ", added");
        if (write)
          for (int q = 0; q < kMaxB; q++)
            for (size_t i = 0; i < w_n + (s.bias ? s.OC : 0); i++) {
              const float want = from_zero[q * stride + i];
              ASSERT_NEAR(alone.grads[q * stride + i], want, 1e-3f * (1.0f + std::fabs(want))) << what << ", " << i;
            }
        auto expect_alone = [&](const Result& r, int B, const char* how) {
          EXPECT_EQ(0, std::memcmp(r.dinp.data(), alone.dinp.data(), B * seq_in * sizeof(float)))
              << how << ", " << B << " sequences of " << what << ": not each input gradient's own bits";
          EXPECT_EQ(0, std::memcmp(r.grads.data(), alone.grads.data(), B * stride * sizeof(float)))
              << how << ", " << B << " sequences of " << what << ": not each parameter gradient's own bits";
          EXPECT_EQ(0, std::memcmp(r.grads.data() + B * stride, before.data() + B * stride,
                                   (grads_n - B * stride) * sizeof(float)))
              << how << ": gradients past the " << B << " sequences' changed";
        };
        for (const int B : {1, 2, kMaxB}) {
          reset(before);
          gpu::matmul_backward_sequences(ctx, dinp, grads, bias_of(grads), stride, dout, x, w, B, s.T, s.C, s.OC,
                                         write);
          expect_alone(result(), B, "batched");
        }
        gpu::matmul_split_batches(true);
        reset(before);
        gpu::matmul_backward_sequences(ctx, dinp, grads, bias_of(grads), stride, dout, x, w, kMaxB, s.T, s.C, s.OC,
                                       write);
        gpu::matmul_split_batches(false);
        expect_alone(result(), kMaxB, "one at a time");
      }
      for (float* a : {x, dout, w, dinp, grads}) gpu_release(a);
    }
  }
}

// A shape whose first batch has other bits than its products one at a time (forced here; the
// hardware has not shown one): the outputs are then the products one at a time, accumulated onto
// what the outputs held, and the shape goes one at a time from then on.
TEST(GpuMatmul, BatchesWithOtherBitsFallBackToOneAtATime) {
  if (gpu_devices().empty()) GTEST_SKIP() << "no GPU visible (" << gpu_backend_description() << ")";
  gpu_select(0);
  const int B = 3, T = 48, C = 24, OC = 40;  // a shape no other test uses: its plans are new
  const size_t seq_in = static_cast<size_t>(T) * C, seq_out = static_cast<size_t>(T) * OC,
               w_n = static_cast<size_t>(OC) * C, stride = w_n + OC + 8;
  auto device = testing::gpu_array;
  auto host = testing::host_array;
  float* x = device(bf16_values(B * seq_in, 11));
  float* dout = device(bf16_values(B * seq_out, 12));
  float* w = device(bf16_values(w_n, 13));
  const std::vector<float> grads_before = testing::randn(B * stride, 14);
  float* grads = device(grads_before);
  float* dinp = device(std::vector<float>(B * seq_in));
  float* y = device(std::vector<float>(B * seq_out));
  MatmulContext ctx(KernelImpl::kGpu, ComputeDtype::kBf16);
  for (int q = 0; q < B; q++) {
    gpu::matmul_forward(ctx, y + q * seq_out, x + q * seq_in, w, nullptr, T, C, OC);
    gpu::matmul_backward(ctx, dinp + q * seq_in, grads + q * stride, grads + q * stride + w_n, dout + q * seq_out, OC,
                         x + q * seq_in, w, T, C, OC, false);
  }
  const std::vector<float> y_alone = host(y, B * seq_out), dinp_alone = host(dinp, B * seq_in),
                           grads_alone = host(grads, B * stride);
  for (const bool first : {true, false}) {
    gpu_copy_to_device(grads, grads_before.data(), grads_before.size() * sizeof(float));
    for (float* p : {y, dinp}) gpu_zero(p, (p == y ? B * seq_out : B * seq_in) * sizeof(float));
    gpu::matmul_batches_differ(first);
    gpu::matmul_forward_sequences(ctx, y, x, w, nullptr, B, T, C, OC);
    gpu::matmul_backward_sequences(ctx, dinp, grads, grads + w_n, stride, dout, x, w, B, T, C, OC, false);
    gpu::matmul_batches_differ(false);
    const char* when = first ? "on the first use" : "after it";
    EXPECT_EQ(host(y, B * seq_out), y_alone) << when;
    EXPECT_EQ(host(dinp, B * seq_in), dinp_alone) << when;
    EXPECT_EQ(host(grads, B * stride), grads_alone) << when << ": not the accumulated products one at a time";
  }
  for (float* p : {x, dout, w, grads, dinp, y}) gpu_release(p);
}

}  // namespace
}  // namespace anvil
