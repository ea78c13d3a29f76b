// Text generation from a checkpoint or a Hugging Face directory: temperature, top-k and top-p
// sampling, one token at a time.
#pragma once
#include <cstdint>
#include <string>

namespace anvil {

struct GenerateOptions {
  std::string checkpoint;  // a checkpoint, a run directory, or a transformers model directory
  std::string prompt;
  std::string tokenizer;   // a tokenizer name; "": the one that goes with the weights
  int max_new_tokens = 64;
  double temperature = 0.8;  // 0: greedy
  int top_k = 40;            // 0: the whole vocabulary
  double top_p = 1.0;        // nucleus sampling: the fewest top tokens holding this probability
  uint64_t seed = 0;
  // Chat: the prompt is a user's message (after `system`'s, if any), rendered with the chat
  // template (`chat_template` as data/chat_template.h's chat_template_for reads it) and its
  // generation prompt; generation stops at the tokenizer's EOS, and the reply alone is returned.
  bool chat = false;
  std::string system, chat_template;
};

// Returns the prompt followed by the generated continuation (chat: the reply).
std::string generate_text(const GenerateOptions& opt);

}  // namespace anvil
