// The training step: no heap allocation once warmed up (every operator new is counted), and
// the same bits for any microbatch size.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <limits>
#include <new>

#include <omp.h>

#include "compare.h"
#include "config/train_config.h"
#include "core/error.h"
#include "core/rng.h"
#include "train/step.h"

namespace {
std::atomic<long> g_allocations{0};
}

// Counts every allocation through operator new. new and delete are replaced as a pair (a
// sanitizer's own delete must never see our malloc'd blocks). GCC 12 warns that the replacement
// delete frees what "operator new" returned, which is exactly what a replacement pair does.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
  g_allocations++;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace anvil {
namespace {

TrainConfig small_config(int microbatch) {
  TrainConfig c;
  c.max_seq_len = 16;
  c.model = {2, 2, 32, 97, 16};
  c.global_train_batch_size = 4;
  c.device_train_microbatch_size = microbatch;
  c.optimizer.lr = 1e-3;
  c.clipping_threshold = 1.0;
  return c;
}

struct Batch {
  std::vector<int32_t> tokens, targets;
  explicit Batch(const TrainConfig& c) {
    const size_t n = static_cast<size_t>(c.global_train_batch_size) * c.max_seq_len;
    Rng rng(3, 0);
    for (size_t i = 0; i <= n; i++) tokens.push_back(static_cast<int32_t>(rng.below(c.model.vocab_size)));
    targets.assign(tokens.begin() + 1, tokens.end());
    tokens.pop_back();
  }
};

// Final parameters after `steps` optimizer steps on the fixed batch.
// forced_scale: start every tensor's fixed-point scale there (a huge one overflows at once).
std::vector<float> train_steps(int microbatch, int steps, bool deterministic = true, int forced_scale = 0) {
  TrainConfig c = small_config(microbatch);
  c.deterministic_mode = deterministic;
  Gpt2 model(c.model, microbatch, c.max_seq_len);
  model.init_weights(1);
  auto comm = make_communicator();
  DataParallel dp(*comm, model, c.optimizer, data_parallel_options(c));
  if (forced_scale) dp.set_grad_scales(std::vector<int>(model.tensors().size(), forced_scale));
  TrainStep step(c, model, dp, LrSchedule{"constant", 0, 0.0, 10});
  Batch b(c);
  for (int t = 0; t < steps; t++) step.run(b.tokens.data(), b.targets.data(), 4, c.max_seq_len, t);
  return std::vector<float>(model.params(), model.params() + model.num_params());
}

TEST(TrainStep, DoesNotAllocateOnceWarm) {
  TrainConfig c = small_config(2);
  Gpt2 model(c.model, 2, c.max_seq_len);
  model.init_weights(1);
  auto comm = make_communicator();
  DataParallel dp(*comm, model, c.optimizer, data_parallel_options(c));
  TrainStep step(c, model, dp, LrSchedule{"constant", 0, 0.0, 10});
  Batch b(c);
  step.run(b.tokens.data(), b.targets.data(), 4, c.max_seq_len, 0);  // warm-up
  const long before = g_allocations.load();
  for (int t = 1; t < 4; t++) step.run(b.tokens.data(), b.targets.data(), 4, c.max_seq_len, t);
  EXPECT_EQ(g_allocations.load() - before, 0);
}

// Fixed-point gradients: the grouping of sequences into microbatches cannot change a bit.
TEST(TrainStep, MicrobatchSizeDoesNotChangeABit) {
  const std::vector<float> whole = train_steps(4, 3);
  for (int mb : {2, 1, 3}) EXPECT_TRUE(train_steps(mb, 3) == whole) << "microbatch " << mb;  // 3: a last one of 1
}

// Gradients far beyond the fixed-point range on the first step: the step is detected, run again
// at the measured scale, and the result is still independent of the microbatch size and close
// to an ordinary run (which rounded at other scales).
TEST(TrainStep, OverflowedStepRunsAgain) {
  const std::vector<float> forced = train_steps(4, 3, true, 80);
  EXPECT_TRUE(train_steps(1, 3, true, 80) == forced);
  const std::vector<float> normal = train_steps(4, 3);
  EXPECT_TRUE(testing::rel_norm_close(forced.data(), normal.data(), normal.size(), testing::kFp32RelNorm));
}

// A NaN weight makes NaN gradients: the step stops with an error naming a tensor, rather than
// losing the NaN in the gradient maximum or taking it for a fixed-point overflow.
TEST(TrainStep, NonFiniteGradientIsAnError) {
  TrainConfig c = small_config(2);
  Gpt2 model(c.model, 2, c.max_seq_len);
  model.init_weights(1);
  model.params()[model.tensors().back().offset] = std::numeric_limits<float>::quiet_NaN();  // lnfb[0]
  auto comm = make_communicator();
  DataParallel dp(*comm, model, c.optimizer, data_parallel_options(c));
  TrainStep step(c, model, dp, LrSchedule{"constant", 0, 0.0, 10});
  Batch b(c);
  try {
    step.run(b.tokens.data(), b.targets.data(), 4, c.max_seq_len, 0);
    ADD_FAILURE() << "a NaN weight trained without an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step 1: the gradient of '"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("is not finite"), std::string::npos) << e.what();
  }
}

// deterministic_mode: false sums in fp32: the same math, equal to fp32 rounding only.
TEST(TrainStep, FloatGradientsFollowTheDeterministicResult) {
  const std::vector<float> exact = train_steps(4, 3);
  for (int mb : {4, 1, 3}) {
    const std::vector<float> f = train_steps(mb, 3, /*deterministic=*/false);
    EXPECT_TRUE(testing::rel_norm_close(f.data(), exact.data(), exact.size(), testing::kFp32RelNorm)) << "microbatch " << mb;
  }
}

// The thread count changes who computes what, never the order of any sum: bitwise equal.
TEST(TrainStep, OneAndTwoThreadsGiveTheSameBits) {
  std::vector<std::vector<float>> finals;
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    finals.push_back(train_steps(2, 3));
  }
  omp_set_num_threads(saved);
  EXPECT_TRUE(finals[0] == finals[1]);
}

}  // namespace
}  // namespace anvil
