// A model on the GPU with its own gradient arrays (no data parallelism), microbatch-invariant as
// built by default: each sequence's gradient spans are formed apart and added to the model's
// gradient in sequence order, so a batch cut into microbatches of any size gives the same bits.
// (Untied: a tied embedding's two fp32 contributions, the LM head's and the token rows', would
// interleave by microbatch; deterministic training sums them in fixed point instead.)
#include <gtest/gtest.h>

#include <vector>

#include "device/device.h"
#include "model/model.h"

namespace anvil {
namespace {

TEST(GpuModel, OwnGradientsDoNotDependOnTheMicrobatch) {
  if (gpu_devices().empty()) GTEST_SKIP() << "no GPU visible (" << gpu_backend_description() << ")";
  gpu_select(0);
  ModelConfig cfg;
  cfg.n_layers = 2;
  cfg.n_heads = 2;
  cfg.d_model = 32;
  cfg.vocab_size = 97;
  cfg.max_seq_len = 16;
  cfg.tied_embeddings = false;
  ModelStorage storage;
  storage.kernels = KernelImpl::kGpu;
  const int B = 4, T = 16;
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (int i = 0; i < B * T; i++) {
    tokens[i] = (i * 37 + 11) % cfg.vocab_size;
    targets[i] = (i * 53 + 5) % cfg.vocab_size;
  }
  auto grads_of = [&](int microbatch) {
    auto model = make_model(cfg, microbatch, T, storage);
    model->init_weights(7);
    model->zero_grad();
    for (int b = 0; b < B; b += microbatch) {
      int64_t n_targets = 0;
      model->forward_backward(tokens.data() + b * T, targets.data() + b * T, microbatch, T, 0.5f, &n_targets);
    }
    std::vector<float> grads(model->num_params());
    gpu_copy_to_host(grads.data(), model->grads(), grads.size() * sizeof(float));
    return grads;
  };
  const std::vector<float> whole = grads_of(4);
  bool any = false;
  for (float g : whole) any = any || g != 0.0f;
  EXPECT_TRUE(any) << "no gradient formed";
  EXPECT_EQ(grads_of(1), whole) << "microbatch 1";
  EXPECT_EQ(grads_of(2), whole) << "microbatch 2";
}

}  // namespace
}  // namespace anvil
