// A fine-tuning loader's settings (`train_loader.name: finetuning`, LLM Foundry's keys and
// meanings): which records, how they become token sequences, and which tokens carry loss.
// data/finetuning.h does the work.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config/choices.h"

namespace anvil {

// Which tokens are trained on, as Foundry's collator chooses them.
struct TargetPolicy {
  enum class Prompts {
    kNone,           // "none": prompts carry no loss
    kAll,            // "all"
    kLengthAtLeast,  // "length>=N": a prompt of at least N tokens does
  };
  enum class Responses {
    kLast,  // "last": only the final response of a conversation carries loss
    kAll,   // "all": every response does
  };
  Prompts prompts = Prompts::kNone;
  int64_t prompt_min_length = 0;  // kLengthAtLeast's N
  Responses responses = Responses::kLast;
};

// How a chat record's messages become text.
// - "tokenizer": the tokenizer's own chat template (the Jinja template in its directory's
//   tokenizer_config.json, chat_template.jinja or chat_template.json), rendered as transformers'
//   apply_chat_template renders it (data/chat_template.h); `jinja` and `origin` hold it once the
//   tokenizer is known.
// - "chatml", or a custom map: each message rendered alone, `message` with {role} and {content}
//   replaced; the assistant's rendered message begins with `generation_prompt`.
// - "auto" (the default): the tokenizer's where it has one, else chatml (transformers' default
//   before templates were required).
struct ChatTemplate {
  std::string name = "auto";  // auto, tokenizer, chatml, or a custom template's name
  std::string message = "<|im_start|>{role}\n{content}<|im_end|>\n";
  std::string generation_prompt = "<|im_start|>assistant\n";
  std::string jinja, origin;
  bool is_jinja() const { return name == "tokenizer"; }
};

// Foundry's target_prompts ("none", "all", "length>=N") and target_responses ("last", "all");
// `where` names the keys in errors.
TargetPolicy parse_target_policy(const std::string& prompts, const std::string& responses, const std::string& where);
std::string target_prompts_name(const TargetPolicy& p);
std::string target_responses_name(const TargetPolicy& p);

// A chat template by name (auto, tokenizer, chatml), a check that a message template can cut a
// chat into turns (`where` names it in errors), and one message as a message template renders it.
ChatTemplate chat_template_named(const std::string& name, const std::string& where);
void validate_chat_template(const ChatTemplate& t, const std::string& where);
std::string render_chat_message(const ChatTemplate& t, const std::string& role, const std::string& content);

struct FinetuningConfig {
  // JSON records read directly: Foundry's `hf_name`, a local .jsonl/.json file or a directory of
  // them, or "json" with the files under `hf_kwargs.data_dir` or named by `hf_kwargs.data_files`.
  // Empty: the loader reads an MDS dataset (remote/local/streams) that holds tokenized turns.
  std::string hf_name;
  std::string data_dir;
  std::vector<std::string> data_files;
  TargetPolicy targets;
  ChatTemplate chat_template;
  TooLong too_long = TooLong::kTruncate;
  bool skip_malformed = false;  // false: a malformed record stops the run, naming its file and line
  double packing_ratio = 1;     // > 1: examples packed per sequence, on average at most (data/loader.h)
  bool allow_pad_trimming = false;  // cut each step's sequences after the last position trained on
};

}  // namespace anvil
