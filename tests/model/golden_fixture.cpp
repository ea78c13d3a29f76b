#include "golden_fixture.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "compare.h"

namespace anvil::testing {

SafeTensorsFile load_golden(const std::string& name) {
  const char* src = std::getenv("ANVIL_SOURCE_DIR");
  return read_safetensors(std::string(src ? src : ".") + "/tests/golden/" + name);
}

void expect_matches_fixture(Decoder& model, const SafeTensorsFile& f, int B, int T) {
  ASSERT_EQ(model.num_params(), f.at("params_init").numel());
  std::copy_n(f.at("params_init").f32(), model.num_params(), model.params());

  int64_t n_targets = 0;
  const double loss_sum = model.forward(f.at("tokens").i32(), f.at("targets").i32(), B, T, &n_targets);
  EXPECT_EQ(n_targets, B * T - 3);  // the fixtures ignore three targets
  // The logits are formed a sequence at a time, so they are compared a sequence at a time.
  const size_t n_logits = f.at("logits").numel(), per_sequence = n_logits / B;
  std::vector<float> logits(n_logits);
  for (int b = 0; b < B; b++) {
    model.forward(f.at("tokens").i32() + b * T, nullptr, 1, T, nullptr);
    std::copy_n(model.logits(), per_sequence, logits.data() + b * per_sequence);
  }
  EXPECT_TRUE(rel_norm_close(logits.data(), f.at("logits").f32(), n_logits, kFp32RelNorm));
  const float loss = static_cast<float>(loss_sum / n_targets);
  EXPECT_TRUE(rel_norm_close(&loss, f.at("loss").f32(), 1, kFp32RelNorm));

  model.zero_grad();
  const double again = model.forward_backward(f.at("tokens").i32(), f.at("targets").i32(), B, T,
                                              1.0f / static_cast<float>(n_targets), nullptr);
  EXPECT_NEAR(again, loss_sum, 1e-6 * loss_sum);  // the fused loss agrees with forward()'s
  for (const ParamTensor& t : model.tensors())
    EXPECT_TRUE(rel_norm_close(model.grads() + t.offset, f.at("grads").f32() + t.offset, t.numel, kFp32RelNorm))
        << "tensor " << t.name;
}

}  // namespace anvil::testing
