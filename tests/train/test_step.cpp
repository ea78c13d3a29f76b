// The training step: no heap allocation once warmed up (every operator new is counted), and
// the same bits for any microbatch size.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <new>

#include <omp.h>

#include "compare.h"
#include "config/train_config.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/decoder_layout.h"
#include "train/microbatch.h"
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
std::vector<float> train_steps(int microbatch, int steps, bool deterministic = true, int forced_scale = 0,
                               ComputeDtype precision = ComputeDtype::kFp32, bool activation_checkpointing = false,
                               const ModelConfig* model_config = nullptr) {
  TrainConfig c = small_config(microbatch);
  if (model_config) c.model = *model_config;
  c.deterministic_mode = deterministic;
  c.precision = precision;
  c.activation_checkpointing = activation_checkpointing;
  const std::unique_ptr<Model> built = make_model(c.model, microbatch, c.max_seq_len, model_storage_for(c));
  Model& model = *built;
  model.init_weights(1);
  auto comm = make_communicator();
  DataParallel dp(*comm, model, c.optimizer, data_parallel_options(c));
  if (forced_scale) dp.set_grad_scales(std::vector<int>(model.tensors().size(), forced_scale));
  TrainStep step(c, model, dp, dp.comm(), LrSchedule::constant());
  Batch b(c);
  for (int t = 0; t < steps; t++) step.run(b.tokens.data(), b.targets.data(), 4, c.max_seq_len, t);
  return std::vector<float>(model.params(), model.params() + model.num_params());
}

TEST(TrainStep, DoesNotAllocateOnceWarm) {
  for (bool checkpointing : {false, true}) {
    for (bool deterministic : {true, false}) {
      TrainConfig c = small_config(2);
      c.activation_checkpointing = checkpointing;
      c.deterministic_mode = deterministic;
      const std::unique_ptr<Model> built = make_model(c.model, 2, c.max_seq_len, model_storage_for(c));
      Model& model = *built;
      model.init_weights(1);
      auto comm = make_communicator();
      DataParallel dp(*comm, model, c.optimizer, data_parallel_options(c));
      TrainStep step(c, model, dp, dp.comm(), LrSchedule::constant());
      Batch b(c);
      step.run(b.tokens.data(), b.targets.data(), 4, c.max_seq_len, 0);  // warm-up
      const long before = g_allocations.load();
      for (int t = 1; t < 4; t++) step.run(b.tokens.data(), b.targets.data(), 4, c.max_seq_len, t);
      EXPECT_EQ(g_allocations.load() - before, 0) << "activation checkpointing " << checkpointing
                                                  << ", deterministic " << deterministic;
    }
  }
}

// Activation checkpointing recomputes each block's activations in the backward pass: the same
// bits, so the same weights, in every precision and microbatch size, for less memory.
TEST(TrainStep, ActivationCheckpointingDoesNotChangeABit) {
  for (ComputeDtype precision : {ComputeDtype::kFp32, ComputeDtype::kBf16}) {
    const std::vector<float> stored = train_steps(4, 3, true, 0, precision);
    for (int mb : {4, 3})
      EXPECT_TRUE(train_steps(mb, 3, true, 0, precision, /*activation_checkpointing=*/true) == stored)
          << choice_name(precision) << ", microbatch " << mb;
  }
  const ModelConfig m = small_config(4).model;
  ModelStorage storage;
  const size_t stored = model_activation_bytes(m, 4, 16, storage);
  EXPECT_EQ(make_model(m, 4, 16)->activation_bytes(), stored);
  storage.activation_checkpointing = true;
  const size_t recomputed = model_activation_bytes(m, 4, 16, storage);
  EXPECT_EQ(make_model(m, 4, 16, storage)->activation_bytes(), recomputed);
  EXPECT_LT(recomputed, stored);
  // Not microbatch-invariant: the blocks' backward holds a microbatch's gradients, not a sequence's.
  storage.microbatch_invariant = false;
  EXPECT_EQ(make_model(m, 4, 16, storage)->activation_bytes(), model_activation_bytes(m, 4, 16, storage));
  EXPECT_GT(model_activation_bytes(m, 4, 16, storage), recomputed);
}

// device_train_microbatch_size: auto picks the largest microbatch whose activations fit in what
// memory_limit leaves after the model states; a limit nothing fits in is an error that says so.
TEST(Microbatch, AutoPicksTheLargestThatFits) {
  TrainConfig c = small_config(0);
  c.global_train_batch_size = 8;
  c.microbatch_auto = true;
  const size_t model_bytes = 1 << 20;
  const size_t one = model_activation_bytes(c.model, 1, c.max_seq_len, model_storage_for(c));
  const size_t five = model_activation_bytes(c.model, 5, c.max_seq_len, model_storage_for(c));
  c.memory_limit = static_cast<int64_t>(model_bytes + five + (one / 4));
  MicrobatchPlan plan = plan_microbatch(c, 8, model_bytes, 1);
  EXPECT_EQ(plan.microbatch, 5);
  EXPECT_EQ(plan.eval_batch, 5);
  EXPECT_EQ(plan.activation_bytes, five);
  EXPECT_EQ(plan_microbatch(c, 3, model_bytes, 1).microbatch, 3);  // never more than the rank's batch
  c.activation_checkpointing = true;
  EXPECT_GT(plan_microbatch(c, 8, model_bytes, 1).microbatch, 5);
  c.activation_checkpointing = false;
  c.memory_limit = static_cast<int64_t>(model_bytes + one / 2);
  try {
    plan_microbatch(c, 8, model_bytes, 1);
    ADD_FAILURE() << "a limit below one sequence's activations was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("one sequence of 16 tokens needs"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("activation_checkpointing"), std::string::npos) << e.what();
  }
  // An explicit microbatch is checked against an explicit limit.
  c.microbatch_auto = false;
  c.device_train_microbatch_size = 8;
  c.memory_limit = static_cast<int64_t>(model_bytes + five);
  EXPECT_THROW(plan_microbatch(c, 8, model_bytes, 1), Error);
  c.device_train_microbatch_size = 5;
  EXPECT_EQ(plan_microbatch(c, 8, model_bytes, 1).microbatch, 5);
  // Without a limit: the memory available now (auto then fits at least one sequence here).
  c.memory_limit = -1;
  c.microbatch_auto = true;
  EXPECT_GE(plan_microbatch(c, 8, model_bytes, 1).microbatch, 1);
  // ICL tasks during training: what their evaluation keeps beside the activations is counted.
  c.memory_limit = static_cast<int64_t>(model_bytes + five + (one / 4));
  c.icl_tasks = "tasks.yaml";
  plan = plan_microbatch(c, 8, model_bytes, 1);
  EXPECT_LT(plan.microbatch, 5);
  EXPECT_EQ(plan.activation_bytes,
            model_activation_bytes(c.model, plan.microbatch, c.max_seq_len, model_storage_for(c)) +
                model_evaluation_bytes(c.model, plan.microbatch, c.max_seq_len));
}

// On a GPU a microbatch-invariant model's backward forms a gradient span per sequence of its
// microbatch: what deterministic training's scratch holds beyond one sequence's span grows with
// the microbatch. (plan_microbatch adds it to the activations; under kernels=gpu it asks the GPU
// for its free memory, so a build without one cannot plan for it here.)
TEST(Microbatch, CountsAGpuGrainsGradientSpans) {
  const TrainConfig c = small_config(0);
  ModelStorage storage;  // invariant
  EXPECT_EQ(model_grain_grads_bytes(c.model, 4, storage), 0u) << "the CPU's grain is one sequence";
  storage.kernels = KernelImpl::kGpu;
  const size_t C = c.model.d_model, H = c.model.mlp_width();
  const size_t largest = C * H + std::max(C, H);  // an MLP product's weight and bias
  // and the LM head's, a group of sequences at once (small enough here for all four)
  const size_t head = static_cast<size_t>(c.model.vocab_size) * C;
  ASSERT_EQ(head_grain_sequences(c.model, 4, storage), 4);
  const size_t spans = 3 * (sequence_span_stride(largest) + sequence_span_stride(head)) * sizeof(float);
  EXPECT_EQ(model_grain_grads_bytes(c.model, 4, storage), spans);
  EXPECT_EQ(model_grain_grads_bytes(c.model, 1, storage), 0u);
  // An untied head's spans share the blocks' scratch: it grows to the larger of the two.
  ModelConfig untied = c.model;
  untied.tied_embeddings = false;
  const size_t blocks_4 = 3 * sequence_span_stride(largest) + largest, head_4 = 3 * sequence_span_stride(head) + head;
  EXPECT_EQ(model_grain_grads_bytes(untied, 4, storage),
            (std::max(blocks_4, head_4) - std::max(largest, head)) * sizeof(float));
  // The head's groups stay within kHeadSpansBytes, as even as the microbatch allows: GPT-2 124M's
  // head (154.5 MB a span) six at most, Llama 3.2 1B's (1,051 MB) one.
  ModelConfig wide = c.model;
  wide.vocab_size = 50304;
  wide.d_model = 768;
  EXPECT_EQ(head_grain_sequences(wide, 8, storage), 4);
  EXPECT_EQ(head_grain_sequences(wide, 16, storage), 6);
  EXPECT_EQ(head_grain_sequences(wide, 5, storage), 5);
  wide.vocab_size = 128256;
  wide.d_model = 2048;
  EXPECT_EQ(head_grain_sequences(wide, 8, storage), 1);
  storage.microbatch_invariant = false;
  EXPECT_EQ(model_grain_grads_bytes(c.model, 4, storage), 0u) << "one span for the whole microbatch";
}

// Fixed-point gradients: the grouping of sequences into microbatches cannot change a bit.
TEST(TrainStep, MicrobatchSizeDoesNotChangeABit) {
  const std::vector<float> whole = train_steps(4, 3);
  for (int mb : {2, 1, 3}) EXPECT_TRUE(train_steps(mb, 3) == whole) << "microbatch " << mb;  // 3: a last one of 1
}

// The same where a block's backward has every kind of op that sums over rows into a parameter
// gradient: RMSNorm, SwiGLU, rotary positions, grouped key/value heads, per-head query and key
// norms (Qwen3's) and a bias on the qkv product alone (Qwen2's), in fp32 and amp_bf16.
TEST(TrainStep, MicrobatchSizeDoesNotChangeABitWithQkNormsAndBiases) {
  ModelConfig m = small_config(1).model;
  m.name = ModelFamily::kLlama;
  m.norm = NormKind::kRmsNorm;
  m.positions = PositionKind::kRope;
  m.mlp = MlpKind::kSwiglu;
  m.n_kv_heads = 1;
  m.qk_norm = QkNorm::kPerHead;
  m.linear_bias = m.norm_bias = m.tied_embeddings = false;
  m.qkv_bias = true;
  for (ComputeDtype precision : {ComputeDtype::kFp32, ComputeDtype::kBf16}) {
    const std::vector<float> whole = train_steps(4, 3, true, 0, precision, false, &m);
    for (int mb : {1, 3})
      EXPECT_TRUE(train_steps(mb, 3, true, 0, precision, false, &m) == whole)
          << "microbatch " << mb << ", " << choice_name(precision);
  }
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
  const std::unique_ptr<Model> built =
      make_model(c.model, 2, c.max_seq_len, model_storage_for(data_parallel_options(c)));
  Model& model = *built;
  model.init_weights(1);
  model.params()[model.tensors().back().offset] = std::numeric_limits<float>::quiet_NaN();  // lnfb[0]
  auto comm = make_communicator();
  DataParallel dp(*comm, model, c.optimizer, data_parallel_options(c));
  TrainStep step(c, model, dp, dp.comm(), LrSchedule::constant());
  Batch b(c);
  try {
    step.run(b.tokens.data(), b.targets.data(), 4, c.max_seq_len, 0);
    ADD_FAILURE() << "a NaN weight trained without an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step 1: the gradient of '"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("is not finite"), std::string::npos) << e.what();
  }
}

// 16-bit matrix products: close to fp32 (bf16 keeps 8 significant bits, fp16 11), and still
// the same bits for any microbatch size.
TEST(TrainStep, MixedPrecisionFollowsFp32AndStaysDeterministic) {
  const std::vector<float> fp32 = train_steps(4, 3);
  for (ComputeDtype precision : {ComputeDtype::kBf16, ComputeDtype::kFp16}) {
    const std::vector<float> amp = train_steps(4, 3, true, 0, precision);
    EXPECT_FALSE(amp == fp32) << choice_name(precision) << " changed nothing";
    EXPECT_TRUE(testing::rel_norm_close(amp.data(), fp32.data(), fp32.size(), testing::kBf16RelNorm))
        << choice_name(precision);
    EXPECT_TRUE(train_steps(1, 3, true, 0, precision) == amp) << choice_name(precision) << ", microbatch 1";
    // fp32 sums differ from the fixed-point ones by fp32 rounding, but a 16-bit rounding of an
    // activation that sits on a boundary then flips by one 16-bit step, and AdamW turns a near-zero
    // gradient's change into a weight change of up to lr: close, not to fp32 precision.
    EXPECT_TRUE(testing::rel_norm_close(train_steps(4, 3, false, 0, precision).data(), amp.data(), amp.size(),
                                        testing::kBf16RelNorm / 10)) << choice_name(precision) << ", fp32 sums";
  }
}

// amp_fp16 with a loss scale far too large: the first steps overflow and are skipped (no
// update), the scale backs off by DeepSpeed's rules, and training then proceeds.
TEST(TrainStep, Fp16LossScalerSkipsOverflowsAndRecovers) {
  for (bool deterministic : {true, false}) {
    TrainConfig c = small_config(2);
    c.precision = ComputeDtype::kFp16;
    c.deterministic_mode = deterministic;
    c.loss_scaler.init_scale = 0x1p40;
    c.loss_scaler.hysteresis = 2;
    c.loss_scaler.growth_interval = 3;
    const std::unique_ptr<Model> built =
        make_model(c.model, 2, c.max_seq_len, model_storage_for(data_parallel_options(c)));
    Model& model = *built;
    model.init_weights(1);
    const std::vector<float> initial(model.params(), model.params() + model.num_params());
    auto comm = make_communicator();
    DataParallel dp(*comm, model, c.optimizer, data_parallel_options(c));
    TrainStep step(c, model, dp, dp.comm(), LrSchedule::constant());
    Batch b(c);
    StepResult r = step.run(b.tokens.data(), b.targets.data(), 4, c.max_seq_len, 0);
    EXPECT_TRUE(r.skipped);
    EXPECT_EQ(step.loss_scaler().scale(), 0x1p40);  // hysteresis 2: the first overflow keeps the scale
    EXPECT_TRUE(std::equal(initial.begin(), initial.end(), model.params())) << "a skipped step changed the weights";
    r = step.run(b.tokens.data(), b.targets.data(), 4, c.max_seq_len, 1);
    EXPECT_TRUE(r.skipped);
    EXPECT_EQ(step.loss_scaler().scale(), 0x1p39);
    int skipped = 2, t = 2;
    for (; t < 60 && r.skipped; t++, skipped += r.skipped)
      r = step.run(b.tokens.data(), b.targets.data(), 4, c.max_seq_len, t);
    ASSERT_FALSE(r.skipped) << "no clean step in 60";
    EXPECT_TRUE(std::isfinite(r.loss));
    const double working = step.loss_scaler().scale();
    for (int k = 0; k < 3; k++) r = step.run(b.tokens.data(), b.targets.data(), 4, c.max_seq_len, t++);
    EXPECT_TRUE(r.skipped || step.loss_scaler().scale() == 2 * working) << "no growth after 3 clean steps";
    EXPECT_FALSE(std::equal(initial.begin(), initial.end(), model.params()));
    std::printf("deterministic %d: %d skipped steps, then trained at loss scale 2^%d\n", deterministic, skipped,
                std::ilogb(working));
  }
}

TEST(LossScaler, HysteresisGrowthAndMinimum) {
  LossScalerConfig c;
  c.init_scale = 8;
  c.min_scale = 2;
  c.hysteresis = 2;
  c.growth_interval = 2;
  LossScaler s(c, true);
  s.update(true, 1);
  EXPECT_EQ(s.scale(), 8);  // the first overflow is absorbed by hysteresis
  s.update(true, 2);
  EXPECT_EQ(s.scale(), 4);
  s.update(true, 3);
  EXPECT_EQ(s.scale(), 2);  // hysteresis is spent until the scale grows again
  s.update(false, 4);
  s.update(false, 5);
  EXPECT_EQ(s.scale(), 4);  // growth_interval clean steps
  const std::string saved = s.to_json();
  s.update(true, 6);
  EXPECT_EQ(s.scale(), 4);  // hysteresis restored by the growth
  s.update(true, 7);
  EXPECT_EQ(s.scale(), 2);
  EXPECT_THROW(s.update(true, 8), Error);  // at the minimum
  LossScaler restored(c, true);
  restored.restore(saved, "test");
  EXPECT_EQ(restored.to_json(), saved);
  EXPECT_THROW(restored.restore("{\"scale\": 3}", "test"), Error);
  LossScaler off(c, false);
  off.update(true, 1);
  EXPECT_EQ(off.scale(), 1);
}

// DeepSpeed's consecutive_hysteresis: a clean step restores the hysteresis, so only overflows in
// a row lower the scale; without it, overflows count until the scale next grows.
TEST(LossScaler, ConsecutiveHysteresis) {
  LossScalerConfig c;
  c.init_scale = 64;
  c.hysteresis = 2;
  c.growth_interval = 100;
  for (bool consecutive : {false, true}) {
    c.consecutive_hysteresis = consecutive;
    LossScaler s(c, true);
    s.update(true, 1);
    s.update(false, 2);
    s.update(true, 3);
    EXPECT_EQ(s.scale(), consecutive ? 64 : 32) << "consecutive_hysteresis " << consecutive;
    s.update(true, 4);
    EXPECT_EQ(s.scale(), consecutive ? 32 : 16) << "consecutive_hysteresis " << consecutive;
  }
}

// Deterministic training sums a sequence's gradient at a time: a model that forms them a
// microbatch at a time is refused, naming the way to build the right one.
TEST(TrainStep, DeterministicModeRefusesAModelThatIsNotMicrobatchInvariant) {
  TrainConfig c = small_config(2);
  ModelStorage storage = model_storage_for(c);
  storage.microbatch_invariant = false;
  const std::unique_ptr<Model> built = make_model(c.model, 2, c.max_seq_len, storage);
  Model& model = *built;
  auto comm = make_communicator();
  try {
    DataParallel dp(*comm, model, c.optimizer, data_parallel_options(c));
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model_storage_for"), std::string::npos) << e.what();
  }
}

// deterministic_mode: false sums in fp32, each layer's backward one product over the microbatch
// (a model that is not microbatch-invariant): the same math, equal to fp32 rounding only.
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
