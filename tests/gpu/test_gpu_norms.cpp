// The norms' backward over several sequences that each form their own parameter gradients
// (layernorm_backward_sequences, rmsnorm_backward_sequences: a microbatch-invariant model's grain
// on the GPU): every sequence's input and parameter gradients the bits of a call on its rows
// alone, whatever the number of sequences, and nothing written between the sequences' spans. The
// op table checks the single calls against the reference.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "compare.h"
#include "device/device.h"
#include "gpu_arrays.h"
#include "kernels/layernorm.h"
#include "kernels/rmsnorm.h"

namespace anvil {
namespace {

TEST(GpuNorms, SequencesHaveTheBitsOfTheirOwnRows) {
  if (gpu_devices().empty()) GTEST_SKIP() << "no GPU visible (" << gpu_backend_description() << ")";
  gpu_select(0);
  constexpr int kMaxB = 5;
  // A sequence of a whole number of the column sums' 32-row chunks, and one that ends inside one.
  for (const int T : {64, 45}) {
    for (const bool rms : {false, true}) {
      const int C = 96;
      const size_t rows = static_cast<size_t>(kMaxB) * T, n = rows * C, span = rms ? C : 2 * C, stride = span + 4;
      auto device = testing::gpu_array;
      float* dout = device(testing::randn(n, 1));
      float* inp = device(testing::randn(n, 2));
      float* weight = device(testing::randn(C, 3));
      std::vector<float> mean_host = testing::randn(rows, 4), rstd_host = testing::randn(rows, 5);
      for (float& r : rstd_host) r = 1.0f + 0.1f * r;
      float* mean = device(mean_host);
      float* rstd = device(rstd_host);
      const std::vector<float> dinp_before = testing::randn(n, 6), grads_before = testing::randn(kMaxB * stride, 7);
      float* dinp = device(dinp_before);
      float* grads = device(grads_before);
      auto reset = [&] {
        gpu_copy_to_device(dinp, dinp_before.data(), n * sizeof(float));
        gpu_copy_to_device(grads, grads_before.data(), grads_before.size() * sizeof(float));
      };
      auto host = testing::host_array;
      for (int q = 0; q < kMaxB; q++) {
        const size_t r = static_cast<size_t>(q) * T;
        float* dw = grads + q * stride;
        if (rms)
          gpu::rmsnorm_backward(dinp + r * C, dw, dout + r * C, inp + r * C, weight, rstd + r, T, C);
        else
          gpu::layernorm_backward(dinp + r * C, dw, dw + C, dout + r * C, inp + r * C, weight, mean + r, rstd + r, T,
                                  C);
      }
      const std::vector<float> dinp_alone = host(dinp, n), grads_alone = host(grads, grads_before.size());
      for (const int B : {1, 2, kMaxB}) {
        reset();
        if (rms)
          gpu::rmsnorm_backward_sequences(dinp, grads, stride, dout, inp, weight, rstd, B, T, C);
        else
          gpu::layernorm_backward_sequences(dinp, grads, grads + C, stride, dout, inp, weight, mean, rstd, B, T, C);
        const std::vector<float> dinp_together = host(dinp, n), grads_together = host(grads, grads_before.size());
        const std::string what = std::to_string(B) + " sequences of " + std::to_string(T) + " rows, " +
                                 (rms ? "RMSNorm" : "LayerNorm");
        EXPECT_EQ(0, std::memcmp(dinp_together.data(), dinp_alone.data(), B * T * C * sizeof(float))) << what;
        EXPECT_EQ(0, std::memcmp(grads_together.data(), grads_alone.data(), B * stride * sizeof(float))) << what;
        EXPECT_EQ(0, std::memcmp(grads_together.data() + B * stride, grads_before.data() + B * stride,
                                 (kMaxB - B) * stride * sizeof(float)))
            << what << ": the later sequences' spans changed";
        EXPECT_NE(grads_together[0], grads_before[0]) << what << ": no gradient formed";
      }
      for (float* p : {dout, inp, weight, mean, rstd, dinp, grads}) gpu_release(p);
    }
  }
}

}  // namespace
}  // namespace anvil
