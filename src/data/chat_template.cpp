#include "data/chat_template.h"

#include <ctime>
#include <filesystem>
#include <fmt/ranges.h>

#include "core/error.h"
#include "core/fs.h"
#include "data/jinja.h"

namespace anvil {
namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

ojson read_json(const std::string& path, const char* what) {
  try {
    return ojson::parse(read_file(path, what));
  } catch (const nlohmann::json::exception& e) {
    ANVIL_FAIL("'{}' is not valid JSON: {}", path, e.what());
  }
}

// tokenizer_config.json's chat_template: a string, or a list of {name, template} whose "default"
// transformers uses.
std::string template_of(const ojson& t, const std::string& where) {
  if (t.is_string()) return t.get<std::string>();
  ANVIL_CHECK(t.is_array(), "{}: chat_template must be a string or a list of {{name, template}}, got {}", where,
              t.type_name());
  std::vector<std::string> names;
  for (const ojson& e : t) {
    ANVIL_CHECK(e.is_object() && e.contains("name") && e.contains("template") && e["name"].is_string() &&
                e["template"].is_string(), "{}: each chat_template of the list must be {{name, template}}", where);
    if (e["name"] == "default") return e["template"].get<std::string>();
    names.push_back(e["name"].get<std::string>());
  }
  ANVIL_FAIL("{}: chat_template lists no template named 'default' (it has: {})", where, fmt::join(names, ", "));
}

// The tokenizer's directory, where its chat template would be.
std::string tokenizer_dir(const TokenizerFiles& files) {
  std::error_code ec;
  return files.name != "gpt2" && fs::is_directory(files.name, ec) ? files.name : "";
}

// transformers' special_tokens_map: the special tokens the tokenizer has, as strings.
ojson special_tokens(const std::string& dir) {
  ojson out = ojson::object();
  if (dir.empty()) return out;
  const std::string config = dir + "/tokenizer_config.json", map = dir + "/special_tokens_map.json";
  std::error_code ec;
  for (const std::string& path : {config, map}) {
    if (!fs::is_regular_file(path, ec)) continue;
    const ojson j = read_json(path, "tokenizer config");
    if (!j.is_object()) continue;
    auto content = [&](const ojson& t) -> ojson {
      if (t.is_string()) return t;
      if (t.is_object() && t.contains("content") && t["content"].is_string()) return t["content"];
      return nullptr;
    };
    for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
      if (out.contains(key) || !j.contains(key)) continue;
      const ojson c = content(j[key]);
      if (!c.is_null()) out[key] = c;
    }
    if (!out.contains("additional_special_tokens") && j.contains("additional_special_tokens") &&
        j["additional_special_tokens"].is_array()) {
      ojson list = ojson::array();
      for (const ojson& t : j["additional_special_tokens"]) {
        const ojson c = content(t);
        if (!c.is_null()) list.push_back(c);
      }
      out["additional_special_tokens"] = list;
    }
  }
  return out;
}

std::string local_time(const std::string& format) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[512];
  const size_t n = std::strftime(buf, sizeof buf, format.c_str(), &tm);
  return std::string(buf, n);
}

}  // namespace

ChatTemplate resolve_chat_template(const ChatTemplate& configured, const TokenizerFiles& files) {
  if (configured.name != "auto" && configured.name != "tokenizer") return configured;
  const std::string dir = tokenizer_dir(files);
  ChatTemplate t = configured;
  std::error_code ec;
  if (!dir.empty() && fs::is_regular_file(dir + "/chat_template.jinja", ec)) {
    t.name = "tokenizer";
    t.origin = dir + "/chat_template.jinja";
    t.jinja = read_file(t.origin, "chat template");
    return t;
  }
  const std::string config = dir + "/tokenizer_config.json";
  if (!dir.empty() && fs::is_regular_file(config, ec)) {
    const ojson j = read_json(config, "tokenizer config");
    if (j.is_object() && j.contains("chat_template") && !j["chat_template"].is_null()) {
      t.name = "tokenizer";
      t.origin = config;
      t.jinja = template_of(j["chat_template"], config);
      return t;
    }
  }
  ANVIL_CHECK(configured.name == "auto", "chat_template 'tokenizer': the tokenizer '{}' has no chat template (looked "
              "for chat_template.jinja, and chat_template in tokenizer_config.json, in its directory); choose chatml "
              "or a message template", files.name);
  t = ChatTemplate{};
  t.name = "chatml";
  return t;
}

ChatTemplate chat_template_from_file(const std::string& path) {
  ChatTemplate t;
  t.name = "tokenizer";
  t.origin = path;
  const std::string text = read_file(path, "chat template");
  if (fs::path(path).extension() == ".json") {
    const ojson j = read_json(path, "chat template");
    ANVIL_CHECK(j.is_object() && j.contains("chat_template"), "'{}' holds no chat_template", path);
    t.jinja = template_of(j["chat_template"], path);
  } else {
    t.jinja = text;
  }
  return t;
}

ChatTemplate chat_template_for(const std::string& given, const TokenizerFiles& files) {
  if (given.empty()) return resolve_chat_template(chat_template_named("tokenizer", "--chat"), files);
  if (given == "chatml") return chat_template_named("chatml", "--chat-template");
  return chat_template_from_file(given);
}

ChatFormatter::ChatFormatter(const ChatTemplate& resolved, const TokenizerFiles& files) : template_(resolved) {
  ANVIL_CHECK(resolved.name != "auto", "the chat template is not resolved against the tokenizer yet");
  if (!resolved.is_jinja()) {
    validate_chat_template(resolved, "chat_template");
    return;
  }
  jinja_ = std::make_unique<jinja::Template>(resolved.jinja, resolved.origin + "'s chat template");
  special_tokens_ = special_tokens(tokenizer_dir(files));
}

ChatFormatter::~ChatFormatter() = default;

std::string ChatFormatter::render(const ojson& messages, bool add_generation_prompt, const ojson& extra) const {
  ANVIL_CHECK(messages.is_array(), "the messages of a chat must be a list, got {}", messages.type_name());
  if (!jinja_) {
    std::string out;
    for (size_t i = 0; i < messages.size(); i++) {
      const ojson& m = messages[i];
      ANVIL_CHECK(m.is_object() && m.contains("role") && m["role"].is_string() && m.contains("content") &&
                  m["content"].is_string(), "message {}: {} renders {{\"role\": string, \"content\": string}} only",
                  i, template_.name);
      out += render_chat_message(template_, m["role"].get<std::string>(), m["content"].get<std::string>());
    }
    return add_generation_prompt ? out + template_.generation_prompt : out;
  }
  ojson variables = ojson::object();
  variables["messages"] = messages;
  variables["tools"] = nullptr;
  variables["documents"] = nullptr;
  variables["add_generation_prompt"] = add_generation_prompt;
  for (auto it = special_tokens_.begin(); it != special_tokens_.end(); ++it) variables[it.key()] = it.value();
  for (auto it = extra.begin(); it != extra.end(); ++it) variables[it.key()] = it.value();
  const std::string origin = template_.origin;
  const jinja::Dict globals = {
      {"raise_exception", jinja::Value::function("raise_exception", [origin](jinja::Args& a) -> jinja::Value {
         a.callee = "raise_exception";
         const jinja::Value message = a.take(0, "message", jinja::Value(""));
         a.done();
         ANVIL_FAIL("{}'s chat template refused the chat: {}", origin, message.to_string());
       })},
      {"strftime_now", jinja::Value::function("strftime_now", [](jinja::Args& a) {
         a.callee = "strftime_now";
         const jinja::Value format = a.take(0, "format", jinja::Value::none(), true);
         a.done();
         return jinja::Value(local_time(format.to_string()));
       })},
  };
  return jinja_->render(variables, globals);
}

std::vector<TextTurn> ChatFormatter::turns(const ojson& messages) const {
  std::vector<TextTurn> out;
  std::string previous;  // the chat through the previous turn, as rendered
  for (size_t i = 0; i < messages.size(); i++) {
    if (messages[i]["role"] != "assistant") continue;
    const ojson through(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(i) + 1);
    const ojson before(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(i));
    const std::string full = render(through, false);
    const std::string prompt = render(before, true);
    auto starts = [](const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; };
    const char* cut = "so the chat cannot be cut into prompt and response turns";
    ANVIL_CHECK(starts(full, previous), "the chat template's rendering through message {} does not begin with its "
                "rendering through the previous assistant message, {}", i, cut);
    ANVIL_CHECK(starts(prompt, previous), "the chat template's generation prompt before message {} does not begin "
                "with its rendering through the previous assistant message, {}", i, cut);
    ANVIL_CHECK(starts(full, prompt), "the chat template's rendering through message {} does not begin with its "
                "generation prompt before it, {}", i, cut);
    out.push_back({prompt.substr(previous.size()), full.substr(prompt.size())});
    previous += out.back().prompt + out.back().response;
  }
  return out;
}

}  // namespace anvil
