// Chat records as text: a model's own chat template (the Jinja template its tokenizer directory
// carries) rendered as transformers' apply_chat_template renders it, or one of anvil's message
// templates; and a chat cut into prompt/response turns as LLM Foundry cuts it (each assistant
// message ends a turn; the prompt is what the template renders since the previous turn up to
// the generation prompt, the response the rest of the assistant's rendering).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/finetuning_config.h"
#include "data/tokenizer.h"

namespace anvil {

namespace jinja {
class Template;
}

// `configured` with "auto" and "tokenizer" settled against the tokenizer's directory: "tokenizer"
// with the template's source and origin filled, or chatml (auto, where the directory has none).
// "tokenizer" without a template there is an error naming the files looked for.
ChatTemplate resolve_chat_template(const ChatTemplate& configured, const TokenizerFiles& files);

// A chat template from a file of its own (a .jinja file, or a JSON file holding chat_template
// as tokenizer_config.json does).
ChatTemplate chat_template_from_file(const std::string& path);

// The template a command's --chat-template names: "" the tokenizer's own (required), "chatml",
// or a file as above.
ChatTemplate chat_template_for(const std::string& given, const TokenizerFiles& files);

struct TextTurn {
  std::string prompt, response;
};

class ChatFormatter {
 public:
  // `resolved` as resolve_chat_template returns it; the tokenizer's special tokens (bos_token,
  // eos_token, ... from its tokenizer_config.json) are the template's variables.
  ChatFormatter(const ChatTemplate& resolved, const TokenizerFiles& files);
  ~ChatFormatter();

  // transformers' apply_chat_template(messages, tokenize=False, add_generation_prompt, **extra):
  // `extra` holds further template variables (tools, enable_thinking, ...).
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;

  // Foundry's turns of a chat that ends with the assistant; a template whose renderings do not
  // extend one another (so that no prompt/response cut exists) is an error saying where.
  std::vector<TextTurn> turns(const nlohmann::ordered_json& messages) const;

  // Whether its text carries the special tokens itself (a Jinja template), so that tokenizing it
  // adds none (apply_chat_template tokenizes with add_special_tokens=False; so does Foundry).
  bool writes_special_tokens() const { return bool(jinja_); }

  const ChatTemplate& chat_template() const { return template_; }

 private:
  ChatTemplate template_;
  std::unique_ptr<jinja::Template> jinja_;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
};

}  // namespace anvil
