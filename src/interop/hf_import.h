// `anvil import`: a transformers model directory (config.json with model.safetensors or a sharded
// model.safetensors.index.json, in fp32, bf16 or fp16) as an anvil checkpoint holding the weights
// only, which `anvil train ... load_path=` fine-tunes (a fresh optimizer, from step 0) and
// `anvil generate` and `anvil eval` read.
#pragma once
#include <string>
#include <vector>

#include "config/model_config.h"

namespace anvil {

// A transformers directory read into anvil's layout: its model and the flat parameters.
struct HfModel {
  ModelConfig config;
  std::vector<float> params;         // flat, in model_param_layout order
  size_t tensors = 0;                // transformers tensors read
  std::vector<std::string> skipped;  // buffers the files carry that are not weights (GPT-2's attn.bias)
};
// Errors as import_hf's. With a progress_label, a progress bar of the bytes read (on stderr).
HfModel read_hf_model(const std::string& hf_dir, const char* progress_label = nullptr);
// Whether path is a transformers directory (config.json, and no anvil manifest or checkpoints).
bool is_hf_model_dir(const std::string& path);

// A LoRA model's frozen base: the weights at path (a transformers directory, or an anvil
// checkpoint or run directory of a model without adapters) and their weights_sha256. want_sha256
// (when not empty): the digest an adapter checkpoint recorded, which the weights must have.
// `adapters` names what needs the base, for messages.
struct LoraBase {
  ModelConfig config;
  std::vector<float> params;
  std::string sha256;
};
LoraBase load_lora_base(const std::string& path, const std::string& want_sha256, const std::string& adapters,
                        bool show_progress);

// The model and weights at path, for inference (generate, eval): a transformers directory, or an
// anvil checkpoint or run directory (its latest). A LoRA checkpoint's params are its adapters, and
// base the weights of the base it names (checked against the digest it recorded).
struct ModelWeights {
  ModelConfig config;
  std::vector<float> params;
  std::string tokenizer;    // the tokenizer name that goes with them (data/tokenizer.h)
  std::vector<float> base;  // under LoRA
};
ModelWeights load_model_weights(const std::string& path);

struct HfImportResult {
  ModelConfig config;
  std::string checkpoint;            // the checkpoint directory written
  size_t tensors = 0;                // transformers tensors read
  std::vector<std::string> skipped;  // buffers the files carry that are not weights (GPT-2's attn.bias)
};

// out_dir: a new run directory; the weights become its step-0 checkpoint. A missing, truncated
// or inconsistent file, a tensor of the wrong shape or dtype, a tensor the architecture does not
// have, or a config field anvil cannot honour is an error naming it, and nothing is left behind.
// The weights' tokenizer becomes the run's tokenizer.name: the directory itself where it holds a
// tokenizer's files, else gpt2.
HfImportResult import_hf(const std::string& hf_dir, const std::string& out_dir);

// The tokenizer a checkpoint's training config names (tokenizer.name; gpt2 where it names none).
std::string checkpoint_tokenizer(const std::string& config_yaml);

}  // namespace anvil
