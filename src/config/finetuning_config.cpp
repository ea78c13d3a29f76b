#include "config/finetuning_config.h"

#include "core/error.h"

namespace anvil {

TargetPolicy parse_target_policy(const std::string& prompts, const std::string& responses, const std::string& where) {
  TargetPolicy p;
  const std::string length = "length>=";
  if (prompts == "none") {
    p.prompts = TargetPolicy::Prompts::kNone;
  } else if (prompts == "all") {
    p.prompts = TargetPolicy::Prompts::kAll;
  } else if (prompts.rfind(length, 0) == 0) {
    const std::string n = prompts.substr(length.size());
    ANVIL_CHECK(!n.empty() && n.size() < 10 && n.find_first_not_of("0123456789") == std::string::npos &&
                std::stoll(n) > 0, "{}: target_prompts '{}': after 'length>=' comes a positive number of tokens",
                where, prompts);
    p.prompts = TargetPolicy::Prompts::kLengthAtLeast;
    p.prompt_min_length = std::stoll(n);
  } else {
    ANVIL_FAIL("{}: target_prompts '{}' is not known (expected none, all or length>=N)", where, prompts);
  }
  if (responses == "last") {
    p.responses = TargetPolicy::Responses::kLast;
  } else if (responses == "all") {
    p.responses = TargetPolicy::Responses::kAll;
  } else {
    ANVIL_FAIL("{}: target_responses '{}' is not known (expected last or all)", where, responses);
  }
  return p;
}

std::string target_prompts_name(const TargetPolicy& p) {
  switch (p.prompts) {
    case TargetPolicy::Prompts::kNone: return "none";
    case TargetPolicy::Prompts::kAll: return "all";
    case TargetPolicy::Prompts::kLengthAtLeast: return fmt::format("length>={}", p.prompt_min_length);
  }
  return "none";
}

std::string target_responses_name(const TargetPolicy& p) {
  return p.responses == TargetPolicy::Responses::kLast ? "last" : "all";
}

std::string render_chat_message(const ChatTemplate& t, const std::string& role, const std::string& content) {
  std::string out;
  for (size_t i = 0; i < t.message.size();) {
    if (t.message.compare(i, 6, "{role}") == 0) {
      out += role;
      i += 6;
    } else if (t.message.compare(i, 9, "{content}") == 0) {
      out += content;
      i += 9;
    } else {
      out += t.message[i++];
    }
  }
  return out;
}

ChatTemplate chat_template_named(const std::string& name, const std::string& where) {
  ANVIL_CHECK(name == "auto" || name == "tokenizer" || name == "chatml", "{}: chat template '{}' is not known "
              "(expected auto, tokenizer, chatml, or a map with message and generation_prompt)", where, name);
  ChatTemplate t;
  t.name = name;
  return t;
}

void validate_chat_template(const ChatTemplate& t, const std::string& where) {
  if (t.name == "auto" || t.is_jinja()) return;
  ANVIL_CHECK(t.message.find("{content}") != std::string::npos, "{}: the chat template's message has no {{content}}",
              where);
  ANVIL_CHECK(!t.generation_prompt.empty(), "{}: the chat template's generation_prompt is empty", where);
  const std::string assistant = render_chat_message(t, "assistant", "");
  ANVIL_CHECK(assistant.rfind(t.generation_prompt, 0) == 0, "{}: an assistant message rendered by the chat template "
              "('{}') must begin with its generation_prompt ('{}'), so that a turn's response is the rest of it",
              where, assistant, t.generation_prompt);
}

}  // namespace anvil
