// What the golden tests of every family share: loading a fixture written by tests/golden/*.py, and
// checking a model against it.
#pragma once
#include <string>

#include "ckpt/safetensors.h"
#include "model/decoder.h"

namespace anvil::testing {

// tests/golden/name, found from ANVIL_SOURCE_DIR (or the working directory).
SafeTensorsFile load_golden(const std::string& name);

// From the fixture's params_init, on its batch of B sequences of T tokens (three targets
// ignored, more where given): the logits (a sequence at a time), the mean loss, the fused
// forward-backward's loss and every parameter's gradient agree with the fixture's, each tensor to
// kFp32RelNorm. A fixture with `positions` packs examples into its sequences.
void expect_matches_fixture(Decoder& model, const SafeTensorsFile& f, int B, int T);

// From params_init, the fixture's AdamW steps (its metadata: lr, betas, eps, weight_decay, and
// the warmup-then-cosine schedule and clipping threshold) on its batch: every step's loss and
// gradient norm, and the final parameters, agree with the fixture's to kFp32RelNorm.
void expect_adamw_steps_match(Decoder& model, const SafeTensorsFile& f, int B, int T);

}  // namespace anvil::testing
