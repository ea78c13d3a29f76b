// Learning-rate schedules (Composer's and DeepSpeed's definitions), the two AdamW weight-decay conventions, and
// global-norm clipping.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "kernels/optimizer.h"
#include "optim/adamw.h"
#include "optim/schedule.h"

namespace anvil {
namespace {

LrSchedule composer(SchedulerKind kind, int64_t t_warmup, double alpha_f, int64_t t_max) {
  SchedulerConfig c;
  c.name = kind;
  c.alpha_f = alpha_f;
  return LrSchedule(c, t_warmup, t_max, t_max);
}

TEST(LrSchedule, CosineWithWarmup) {
  const LrSchedule s = composer(SchedulerKind::kCosineWithWarmup, 10, 0.1, 110);
  EXPECT_DOUBLE_EQ(s.lr(0, 0, 1.0), 0.0);
  EXPECT_DOUBLE_EQ(s.lr(5, 5, 1.0), 0.5);
  EXPECT_DOUBLE_EQ(s.lr(10, 10, 2.0), 2.0);
  EXPECT_NEAR(s.lr(60, 60, 1.0), 0.1 + 0.9 * 0.5, 1e-12);  // halfway down
  EXPECT_NEAR(s.lr(110, 110, 1.0), 0.1, 1e-12);
  EXPECT_NEAR(s.lr(500, 500, 1.0), 0.1, 1e-12);              // clipped past the end
  EXPECT_DOUBLE_EQ(s.lr(5, 2, 1.0), 0.5);  // Composer's schedules follow the batch, skipped or not
}

TEST(LrSchedule, OtherShapes) {
  EXPECT_DOUBLE_EQ(composer(SchedulerKind::kConstant, 10, 0.0, 100).lr(0, 0, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(composer(SchedulerKind::kConstantWithWarmup, 4, 0.0, 100).lr(1, 1, 1.0), 0.25);
  EXPECT_DOUBLE_EQ(composer(SchedulerKind::kConstantWithWarmup, 4, 0.0, 100).lr(50, 50, 1.0), 1.0);
  EXPECT_NEAR(composer(SchedulerKind::kLinearDecayWithWarmup, 0, 0.2, 100).lr(50, 50, 1.0), 0.6, 1e-12);
}

// DeepSpeed's schedules as its engine steps them (deepspeed/runtime/lr_schedules.py and
// engine.py): the first update runs at the rate set at construction (iteration -1), the schedule
// advances after each applied update, and a skipped update does not advance it.
TEST(LrSchedule, DeepSpeedWarmupLR) {
  SchedulerConfig c;
  c.name = SchedulerKind::kWarmupLR;
  c.warmup_min_lr = 1e-4;
  c.warmup_max_lr = 1e-3;
  c.warmup_num_steps = 100;
  const LrSchedule log_warmup(c, 0, 0, 1000);
  EXPECT_DOUBLE_EQ(log_warmup.lr(0, 0, 7.0), 1e-4);  // optimizer.lr (7) is not used
  EXPECT_DOUBLE_EQ(log_warmup.lr(1, 1, 7.0), 1e-4);  // iteration 0: log(1) = 0
  EXPECT_DOUBLE_EQ(log_warmup.lr(2, 2, 7.0), 1e-4 + 9e-4 * std::log(2.0) / std::log(100.0));
  EXPECT_DOUBLE_EQ(log_warmup.lr(9, 2, 7.0), log_warmup.lr(2, 2, 7.0));  // skipped updates do not count
  EXPECT_DOUBLE_EQ(log_warmup.lr(101, 101, 7.0), 1e-3);
  c.warmup_type = WarmupType::kLinear;
  const LrSchedule linear(c, 0, 0, 1000);
  EXPECT_DOUBLE_EQ(linear.lr(51, 51, 7.0), 1e-4 + 9e-4 * 50 / 100.0);
}

TEST(LrSchedule, DeepSpeedWarmupDecayAndCosine) {
  SchedulerConfig c;
  c.name = SchedulerKind::kWarmupDecayLR;
  c.warmup_max_lr = 2e-3;
  c.warmup_num_steps = 10;
  c.warmup_type = WarmupType::kLinear;
  c.total_num_steps = 0;  // the run's length
  const LrSchedule decay(c, 0, 0, 110);
  EXPECT_DOUBLE_EQ(decay.lr(6, 6, 1.0), 2e-3 * 5 / 10.0);
  EXPECT_DOUBLE_EQ(decay.lr(61, 61, 1.0), 2e-3 * (110 - 60) / 100.0);
  EXPECT_DOUBLE_EQ(decay.lr(300, 300, 1.0), 0.0);
  c.name = SchedulerKind::kWarmupCosineLR;
  c.warmup_min_ratio = 0.1;
  c.cos_min_ratio = 0.01;
  c.total_num_steps = 110;
  const LrSchedule cosine(c, 0, 0, 500);
  EXPECT_DOUBLE_EQ(cosine.lr(0, 0, 3.0), 0.0);
  EXPECT_DOUBLE_EQ(cosine.lr(1, 1, 3.0), 3.0 * 0.1);
  EXPECT_DOUBLE_EQ(cosine.lr(6, 6, 3.0), 3.0 * (0.1 + 0.9 * 5 / 10.0));
  EXPECT_NEAR(cosine.lr(60, 60, 3.0), 3.0 * (0.01 + 0.99 * (1 + std::cos(M_PI * 50 / 100.0)) / 2), 1e-15);
  EXPECT_NEAR(cosine.lr(110, 110, 3.0), 3.0 * 0.01, 1e-15);
}

TEST(LrSchedule, DeepSpeedOneCycle) {
  SchedulerConfig c;
  c.name = SchedulerKind::kOneCycle;
  c.cycle_min_lr = 0.004;
  c.cycle_max_lr = 0.015;
  c.cycle_first_step_size = 1000;
  c.cycle_second_step_size = 100;
  c.decay_step_size = 1000;
  c.decay_lr_rate = 0.01;
  const LrSchedule s(c, 0, 0, 5000);
  EXPECT_DOUBLE_EQ(s.lr(0, 0, 1.0), 0.004);
  EXPECT_NEAR(s.lr(501, 501, 1.0), 0.004 + 0.011 * 500 / 1000.0, 1e-15);   // rising
  EXPECT_NEAR(s.lr(1001, 1001, 1.0), 0.015, 1e-15);                        // the peak
  EXPECT_NEAR(s.lr(1051, 1051, 1.0), 0.004 + 0.011 * 0.5, 1e-15);          // halfway down
  EXPECT_NEAR(s.lr(2101, 2101, 1.0), 0.004 * (1 + 0.01 * 1000 / 1000.0), 1e-15);  // decay phase
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
  AdamW a(KernelImpl::kCpu, composer, two_tensors(), 6), b(KernelImpl::kCpu, torch, two_tensors(), 6);
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
  AdamW opt(KernelImpl::kCpu, c, two_tensors(), 6);
  opt.step(p.data(), g.data(), 1e-3, 1.0f);
  for (int i = 0; i < 6; i++) EXPECT_NEAR(p[i], 1.0f - 1e-3f * (g[i] > 0 ? 1 : -1), 1e-6) << i;
}

TEST(AdamW, FirstStepWithoutBiasCorrection) {
  // DeepSpeed's bias_correction false: m = (1-β1)·g and √v = √(1-β2)·|g| uncorrected, so the first
  // step moves each weight by lr·(1-β1)/√(1-β2) (about 3.16·lr here), decay aside.
  OptimizerConfig c{OptimizerKind::kAdamW, 1e-3, 0.9, 0.999, 1e-12, 0.0};
  c.bias_correction = false;
  std::vector<float> p = {1, 1, 1, 1, 1, 1};
  const std::vector<float> g = {0.5f, -2.0f, 1e-3f, -1e-3f, 3.0f, -0.25f};
  AdamW opt(KernelImpl::kCpu, c, two_tensors(), 6);
  opt.step(p.data(), g.data(), 1e-3, 1.0f);
  const double move = 1e-3 * 0.1 / std::sqrt(0.001);
  for (int i = 0; i < 6; i++) EXPECT_NEAR(p[i], 1.0 - move * (g[i] > 0 ? 1 : -1), 1e-6) << i;
  // The second step's moments are uncorrected too: m = 0.19·g, √v = √0.001999·|g|.
  opt.step(p.data(), g.data(), 1e-3, 1.0f);
  const double move2 = 1e-3 * 0.19 / std::sqrt(0.001999);
  for (int i = 0; i < 6; i++) EXPECT_NEAR(p[i], 1.0 - (move + move2) * (g[i] > 0 ? 1 : -1), 2e-6) << i;
}

// DeepSpeed's bf16 master weights and optimizer states: each step is the fp32 step from the held
// values, its weights and moments then rounded to the nearest bf16; weights a run starts from are
// rounded when held.
TEST(AdamW, Bf16MasterWeightsAndStatesRoundEachStepsFp32Result) {
  OptimizerConfig fp32{OptimizerKind::kAdamW, 1e-2, 0.9, 0.95, 1e-8, 0.1};
  OptimizerConfig bf16 = fp32;
  bf16.master_weights_dtype = StateDtype::kBf16;
  bf16.states_dtype = StateDtype::kBf16;
  auto rne = [](float x) { return bf16_to_float(float_to_bf16(x)); };
  const std::vector<float> g = {0.5f, -2.0f, 1e-3f, -1e-3f, 3.0f, -0.25f};
  const std::vector<float> start = {0.3f, -1.1f, 2.05f, 0.27f, 0.1f, -0.2f};
  std::vector<float> p = start;
  AdamW b(KernelImpl::kCpu, bf16, two_tensors(), 6);
  EXPECT_TRUE(b.hold(p.data()));
  for (int i = 0; i < 6; i++) EXPECT_EQ(p[i], rne(start[i])) << i;
  int rounded = 0;
  for (int step = 1; step <= 3; step++) {
    AdamW a(KernelImpl::kCpu, fp32, two_tensors(), 6);
    std::copy(b.exp_avg(), b.exp_avg() + 6, a.exp_avg());
    std::copy(b.exp_avg_sq(), b.exp_avg_sq() + 6, a.exp_avg_sq());
    a.set_steps_taken(step - 1);
    std::vector<float> pa = p;
    a.step(pa.data(), g.data(), 1e-2, 1.0f);
    b.step(p.data(), g.data(), 1e-2, 1.0f);
    for (int i = 0; i < 6; i++) {
      EXPECT_EQ(p[i], rne(pa[i])) << step << " " << i;
      EXPECT_EQ(b.exp_avg()[i], rne(a.exp_avg()[i])) << step << " " << i;
      EXPECT_EQ(b.exp_avg_sq()[i], rne(a.exp_avg_sq()[i])) << step << " " << i;
      rounded += p[i] != pa[i];
    }
  }
  EXPECT_GT(rounded, 0);  // the fp32 results were not all bf16 values already
  // A ZeRO shard [3, 6) that starts inside the first tensor: params points at element 3.
  AdamW shard(KernelImpl::kCpu, bf16, two_tensors(), 3, 6);
  std::vector<float> tail(start.begin() + 3, start.end());
  EXPECT_TRUE(shard.hold(tail.data()));
  for (int i = 0; i < 3; i++) EXPECT_EQ(tail[i], rne(start[3 + i])) << i;
  AdamW plain(KernelImpl::kCpu, fp32, two_tensors(), 6);
  std::vector<float> q = start;
  EXPECT_FALSE(plain.hold(q.data()));
  EXPECT_EQ(q, start);
}

TEST(ClipGradNorm, ScalesOnlyAboveTheThreshold) {
  const std::vector<float> g = {3, 4};  // norm 5
  EXPECT_DOUBLE_EQ(grad_norm(KernelImpl::kCpu, g.data(), 2), 5.0);
  EXPECT_EQ(clip_coefficient(5.0, 10.0), 1.0f);
  EXPECT_EQ(clip_coefficient(5.0, 0.0), 1.0f);  // 0: no clipping
  EXPECT_NEAR(5.0 * clip_coefficient(5.0, 1.0), 1.0, 1e-6);
  std::vector<float> big(300000, 1e-3f);  // several chunks
  EXPECT_NEAR(grad_norm(KernelImpl::kCpu, big.data(), big.size()), std::sqrt(300000.0) * 1e-3, 1e-6);
}

// Clipping folded into the update is the update of the clipped gradient, bit for bit, and leaves
// the gradient as it was; the fast kernel matches the reference bit for bit.
TEST(AdamW, ClippingInsideTheUpdateIsClippingBefore) {
  const std::vector<float> g0 = {0.5f, -2.0f, 1e-3f, -1e-3f, 3.0f, -0.25f};
  const float coef = clip_coefficient(7.0, 1.0);
  std::vector<float> clipped = g0;
  for (float& x : clipped) x *= coef;
  const AdamWStep s{0.9f, 0.95f, 1e-8f, 1e-3f, 0.2f, coef}, plain{0.9f, 0.95f, 1e-8f, 1e-3f, 0.2f, 1.0f};
  const AdamWTensor all{0, 6, 0.999f, 0};
  std::vector<float> p1(6, 1.0f), m1(6, 0.1f), v1(6, 0.01f), p2 = p1, m2 = m1, v2 = v1, p3 = p1, m3 = m1, v3 = v1;
  std::vector<float> g = g0;
  cpu::adamw_update(p1.data(), g.data(), m1.data(), v1.data(), 6, &all, 1, s);
  cpu::adamw_update(p2.data(), clipped.data(), m2.data(), v2.data(), 6, &all, 1, plain);
  ref::adamw_update(p3.data(), g.data(), m3.data(), v3.data(), 6, &all, 1, s);
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
  const AdamWStep s{0.9f, 0.95f, 1e-8f, 1e-3f, 0.2f, 0.75f};
  const AdamWTensor all{0, n, 0.999f, e};
  std::vector<float> p1(n, 1.0f), m1(n, 0.1f), v1(n, 0.01f), p2 = p1, m2 = m1, v2 = v1, p3 = p1, m3 = m1, v3 = v1;
  cpu::adamw_update(p1.data(), g.data(), m1.data(), v1.data(), n, &all, 1, s);
  cpu::adamw_update_fixed(p2.data(), acc.data(), m2.data(), v2.data(), n, &all, 1, s);
  ref::adamw_update_fixed(p3.data(), acc.data(), m3.data(), v3.data(), n, &all, 1, s);
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(m1, m2);
  EXPECT_EQ(v1, v2);
  EXPECT_EQ(p1, p3);
  EXPECT_EQ(m1, m3);
  EXPECT_EQ(v1, v3);
}

}  // namespace
}  // namespace anvil
