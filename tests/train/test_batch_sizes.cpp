// DeepSpeed's batch rule, resolved once the ranks are known: global = microbatch x accumulation
// steps x ranks, any two giving the third, and an error naming all three when they disagree.
#include <gtest/gtest.h>

#include <string>

#include "config/train_config.h"
#include "core/error.h"
#include "train/microbatch.h"

namespace anvil {
namespace {

TrainConfig sizes(int global, int micro, int steps) {
  TrainConfig c;
  c.global_train_batch_size = global;
  c.device_train_microbatch_size = micro;
  c.gradient_accumulation_steps = steps;
  return c;
}

TEST(BatchSizes, AnyTwoGiveTheThird) {
  // A ds_config's micro batch alone: one accumulation step, the ranks decide the global batch.
  TrainConfig c = sizes(0, 2, 0);
  resolve_batch_sizes(c, 2);
  EXPECT_EQ(c.global_train_batch_size, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.device_eval_batch_size, 2);

  c = sizes(16, 0, 1);  // train_batch_size and gradient_accumulation_steps over 4 ranks
  resolve_batch_sizes(c, 4);
  EXPECT_EQ(c.device_train_microbatch_size, 4);

  c = sizes(12, 0, 0);  // anvil's own rule: the global batch alone is left to the trainer
  resolve_batch_sizes(c, 3);
  EXPECT_EQ(c.device_train_microbatch_size, 0);
  EXPECT_EQ(c.gradient_accumulation_steps, 0);

  c = sizes(8, 2, 2);  // all three, agreeing over 2 ranks
  resolve_batch_sizes(c, 2);
  EXPECT_EQ(c.global_train_batch_size, 8);
}

TEST(BatchSizes, DisagreementNamesTheThree) {
  TrainConfig c = sizes(8, 3, 2);
  try {
    resolve_batch_sizes(c, 1);
    ADD_FAILURE() << "8 != 3 x 2 x 1 must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("global_train_batch_size 8 (DeepSpeed's train_batch_size) must be "
                                         "device_train_microbatch_size 3 x gradient_accumulation_steps 2 x 1 ranks = 6"),
              std::string::npos) << e.what();
  }
  c = sizes(10, 0, 4);
  EXPECT_THROW(resolve_batch_sizes(c, 1), Error);  // 10 is not divisible by 4 x 1
}

}  // namespace
}  // namespace anvil
