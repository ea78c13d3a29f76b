// Learning-rate schedules (Composer's definitions), the two AdamW weight-decay conventions, and
// global-norm clipping.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "kernels/optimizer.h"
#include "optim/adamw.h"
#include "optim/schedule.h"

namespace anvil {
namespace {

TEST(LrSchedule, CosineWithWarmup) {
  LrSchedule s{SchedulerKind::kCosineWithWarmup, 10, 0.1, 110};
  EXPECT_DOUBLE_EQ(s.multiplier(0), 0.0);
  EXPECT_DOUBLE_EQ(s.multiplier(5), 0.5);
  EXPECT_DOUBLE_EQ(s.multiplier(10), 1.0);
  EXPECT_NEAR(s.multiplier(60), 0.1 + 0.9 * 0.5, 1e-12);  // halfway down
  EXPECT_NEAR(s.multiplier(110), 0.1, 1e-12);
  EXPECT_NEAR(s.multiplier(500), 0.1, 1e-12);              // clipped past the end
}

TEST(LrSchedule, OtherShapes) {
  EXPECT_DOUBLE_EQ((LrSchedule{SchedulerKind::kConstant, 10, 0.0, 100}.multiplier(0)), 1.0);
  EXPECT_DOUBLE_EQ((LrSchedule{SchedulerKind::kConstantWithWarmup, 4, 0.0, 100}.multiplier(1)), 0.25);
  EXPECT_DOUBLE_EQ((LrSchedule{SchedulerKind::kConstantWithWarmup, 4, 0.0, 100}.multiplier(50)), 1.0);
  EXPECT_NEAR((LrSchedule{SchedulerKind::kLinearDecayWithWarmup, 0, 0.2, 100}.multiplier(50)), 0.6, 1e-12);
}

std::vector<ParamTensor> two_tensors() {
  return {{"w", {2, 2}, 0, 4, 0, true, 0.02f, 0}, {"b", {2}, 4, 2, 0, false, 0, 0}};
}

TEST(AdamW, DecoupledDecayIsPyTorchDecayScaledByInitialLr) {
  // Composer's decay (lr / initial_lr)·wd equals PyTorch's lr·wd' with wd' = wd / initial_lr.
  OptimizerConfig composer{OptimizerKind::kDecoupledAdamW, 1e-2, 0.9, 0.95, 1e-8, 1e-4};
  OptimizerConfig torch{OptimizerKind::kAdamW, 1e-2, 0.9, 0.95, 1e-8, 1e-4 / 1e-2};
  std::vector<float> p1 = {0.5f, -1.0f, 2.0f, 0.25f, 0.1f, -0.2f}, p2 = p1;
  const std::vector<float> g = {0.1f, 0.2f, -0.3f, 0.05f, 0.4f, -0.1f};
  AdamW a(composer, two_tensors(), 6), b(torch, two_tensors(), 6);
  for (int step = 0; step < 3; step++) {
    a.step(p1.data(), g.data(), 5e-3, 1.0f);
    b.step(p2.data(), g.data(), 5e-3, 1.0f);
  }
  for (int i = 0; i < 6; i++) EXPECT_NEAR(p1[i], p2[i], 1e-7) << i;
  // Without decay on the bias tensor, both conventions move it identically to plain Adam.
  EXPECT_EQ(a.steps_taken(), 3);
}

TEST(AdamW, FirstStepMovesEachWeightByLr) {
  // Adam's bias-corrected first step is lr·sign(g) (up to eps), decay aside.
  OptimizerConfig c{OptimizerKind::kAdamW, 1e-3, 0.9, 0.999, 1e-12, 0.0};
  std::vector<float> p = {1, 1, 1, 1, 1, 1};
  const std::vector<float> g = {0.5f, -2.0f, 1e-3f, -1e-3f, 3.0f, -0.25f};
  AdamW opt(c, two_tensors(), 6);
  opt.step(p.data(), g.data(), 1e-3, 1.0f);
  for (int i = 0; i < 6; i++) EXPECT_NEAR(p[i], 1.0f - 1e-3f * (g[i] > 0 ? 1 : -1), 1e-6) << i;
}

TEST(ClipGradNorm, ScalesOnlyAboveTheThreshold) {
  const std::vector<float> g = {3, 4};  // norm 5
  EXPECT_DOUBLE_EQ(grad_norm(g.data(), 2), 5.0);
  EXPECT_EQ(clip_coefficient(5.0, 10.0), 1.0f);
  EXPECT_EQ(clip_coefficient(5.0, 0.0), 1.0f);  // 0: no clipping
  EXPECT_NEAR(5.0 * clip_coefficient(5.0, 1.0), 1.0, 1e-6);
  std::vector<float> big(300000, 1e-3f);  // several chunks
  EXPECT_NEAR(grad_norm(big.data(), big.size()), std::sqrt(300000.0) * 1e-3, 1e-6);
}

// Clipping folded into the update is the update of the clipped gradient, bit for bit, and leaves
// the gradient as it was; the fast kernel matches the reference bit for bit.
TEST(AdamW, ClippingInsideTheUpdateIsClippingBefore) {
  const std::vector<float> g0 = {0.5f, -2.0f, 1e-3f, -1e-3f, 3.0f, -0.25f};
  const float coef = clip_coefficient(7.0, 1.0);
  std::vector<float> clipped = g0;
  for (float& x : clipped) x *= coef;
  const AdamWStep s{0.9f, 0.95f, 1e-8f, 1e-3f, 0.2f, 0.999f, coef}, plain{0.9f, 0.95f, 1e-8f, 1e-3f, 0.2f, 0.999f, 1.0f};
  std::vector<float> p1(6, 1.0f), m1(6, 0.1f), v1(6, 0.01f), p2 = p1, m2 = m1, v2 = v1, p3 = p1, m3 = m1, v3 = v1;
  std::vector<float> g = g0;
  cpu::adamw_update(p1.data(), g.data(), m1.data(), v1.data(), 6, s);
  cpu::adamw_update(p2.data(), clipped.data(), m2.data(), v2.data(), 6, plain);
  ref::adamw_update(p3.data(), g.data(), m3.data(), v3.data(), 6, s);
  EXPECT_EQ(g, g0);
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(m1, m2);
  EXPECT_EQ(v1, v2);
  EXPECT_EQ(p1, p3);
  EXPECT_EQ(v1, v3);
}

// AdamW reading a fixed-point gradient is AdamW on the floats the integers stand for, bit for
// bit: small and huge integers (beyond 2^53, where the conversion to double rounds), negative
// ones, and enough of them for the threaded loop.
TEST(AdamW, FixedPointGradientIsTheFloatsItStandsFor) {
  const size_t n = 100003;
  const int e = 47;
  Rng rng(5, 0);
  std::vector<int64_t> acc(n);
  for (size_t i = 0; i < n; i++) {
    const double magnitude = std::ldexp(rng.uniform(), static_cast<int>(rng.below(62)));
    acc[i] = static_cast<int64_t>(i % 2 ? magnitude : -magnitude);
  }
  acc[0] = (int64_t{1} << 53) + 1;
  acc[1] = -((int64_t{1} << 61) + 12345);
  std::vector<float> g(n);
  for (size_t i = 0; i < n; i++) g[i] = static_cast<float>(std::ldexp(static_cast<double>(acc[i]), -e));
  const AdamWStep s{0.9f, 0.95f, 1e-8f, 1e-3f, 0.2f, 0.999f, 0.75f};
  std::vector<float> p1(n, 1.0f), m1(n, 0.1f), v1(n, 0.01f), p2 = p1, m2 = m1, v2 = v1, p3 = p1, m3 = m1, v3 = v1;
  cpu::adamw_update(p1.data(), g.data(), m1.data(), v1.data(), n, s);
  cpu::adamw_update_fixed(p2.data(), acc.data(), e, m2.data(), v2.data(), n, s);
  ref::adamw_update_fixed(p3.data(), acc.data(), e, m3.data(), v3.data(), n, s);
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(m1, m2);
  EXPECT_EQ(v1, v2);
  EXPECT_EQ(p1, p3);
  EXPECT_EQ(m1, m3);
  EXPECT_EQ(v1, v3);
}

}  // namespace
}  // namespace anvil
