#include "data/icl.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/python_random.h"
#include "data/python_text.h"
#include "data/tokenizer.h"

namespace anvil {

using json = nlohmann::json;

IclTaskType icl_task_type_named(const std::string& name, const std::string& where) {
  if (name == "multiple_choice") return IclTaskType::kMultipleChoice;
  if (name == "schema") return IclTaskType::kSchema;
  if (name == "language_modeling") return IclTaskType::kLanguageModeling;
  if (name == "generation_task_with_answers") return IclTaskType::kGenerationWithAnswers;
  ANVIL_FAIL("{}: icl_task_type '{}' is not one of LLM Foundry's (multiple_choice, schema, language_modeling, "
             "generation_task_with_answers)", where, name);
}

namespace {

std::string string_field(const json& row, const char* key, const std::string& where) {
  ANVIL_CHECK(row.contains(key), "{}: no \"{}\" (expected LLM Foundry's fields for this task type)", where, key);
  ANVIL_CHECK(row[key].is_string(), "{}: \"{}\" must be a string", where, key);
  return row[key].get<std::string>();
}

std::vector<std::string> string_list(const json& row, const char* key, const std::string& where) {
  ANVIL_CHECK(row.contains(key) && row[key].is_array() && !row[key].empty(), "{}: \"{}\" must be a non-empty list "
              "of strings", where, key);
  std::vector<std::string> out;
  for (const json& v : row[key]) {
    ANVIL_CHECK(v.is_string(), "{}: \"{}\" must be a list of strings", where, key);
    out.push_back(v.get<std::string>());
  }
  return out;
}

bool starts_with_space(const std::string& s) { return !s.empty() && s[0] == ' '; }

}  // namespace

bool tokenizer_needs_prefix_space(Tokenizer& tok) { return tok.encode(" a").size() == 1; }

std::vector<IclExample> read_icl_examples(const std::string& path, IclTaskType type, bool strip, bool has_categories) {
  std::ifstream in(path, std::ios::binary);
  ANVIL_CHECK(in.good(), "cannot read the task file '{}'", path);
  std::vector<IclExample> out;
  std::string line;
  for (int64_t ln = 1; std::getline(in, line); ln++) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{}:{}", path, ln);
    json row;
    try {
      row = json::parse(line);
    } catch (const json::exception&) {
      ANVIL_FAIL("{}: not a JSON object (each line of a task file must be one)", where);
    }
    ANVIL_CHECK(row.is_object(), "{}: not a JSON object (each line of a task file must be one)", where);
    IclExample e;
    auto gold = [&](size_t choices) {
      ANVIL_CHECK(row.contains("gold") && row["gold"].is_number_integer(), "{}: \"gold\" must be an integer", where);
      e.gold = row["gold"].get<int64_t>();
      ANVIL_CHECK(e.gold >= 0 && static_cast<size_t>(e.gold) < choices, "{}: gold {} is not the index of one of its "
                  "{} choices", where, e.gold, choices);
    };
    switch (type) {
      case IclTaskType::kMultipleChoice:
        e.context = string_field(row, "query", where);
        e.choices = string_list(row, "choices", where);
        gold(e.choices.size());
        break;
      case IclTaskType::kSchema:
        e.choices = string_list(row, "context_options", where);
        e.continuation = string_field(row, "continuation", where);
        gold(e.choices.size());
        break;
      case IclTaskType::kLanguageModeling:
        e.context = string_field(row, "context", where);
        e.continuation = string_field(row, "continuation", where);
        break;
      case IclTaskType::kGenerationWithAnswers:
        ANVIL_FAIL("{}: generation_task_with_answers tasks are not evaluated by anvil yet", where);
    }
    if (has_categories) e.category = string_field(row, "category", where);
    if (strip) {
      e.context = python_strip(e.context);
      e.continuation = python_strip(e.continuation);
    }
    out.push_back(std::move(e));
  }
  ANVIL_CHECK(!out.empty(), "the task file '{}' holds no examples", path);
  return out;
}

std::vector<IclQuestionText> icl_question_texts(const IclTaskSpec& spec, const std::vector<IclExample>& examples,
                                                bool prefix_space) {
  const int64_t n = static_cast<int64_t>(examples.size());
  auto with_space = [&](const std::string& s) { return prefix_space && !starts_with_space(s) ? " " + s : s; };
  // A few-shot example, answered, after the text before it.
  auto solved = [&](const IclExample& e, const std::string& before) {
    if (spec.type == IclTaskType::kSchema) {
      std::string c = e.choices[e.gold];
      if (!before.empty()) c = spec.example_delimiter + c;
      return spec.prelimiter + c + spec.continuation_delimiter + e.continuation;
    }
    std::string c = spec.prelimiter + e.context;
    if (!before.empty()) c = spec.example_delimiter + c;
    c += spec.continuation_delimiter;
    return c + (spec.type == IclTaskType::kMultipleChoice ? e.choices[e.gold] : e.continuation);
  };
  PythonRandom rng(spec.fewshot_random_seed);
  std::vector<IclQuestionText> out;
  out.reserve(examples.size());
  for (int64_t i = 0; i < n; i++) {
    const IclExample& e = examples[i];
    IclQuestionText q;
    q.preamble = spec.prompt_string;
    if (spec.num_fewshot > 0)
      for (const int64_t k : fewshot_indices(n, spec.num_fewshot, i, rng)) q.preamble += solved(examples[k], q.preamble);
    q.gold = e.gold;
    if (spec.type == IclTaskType::kSchema) {
      // The question's options: after a preamble, the example delimiter and the continuation
      // delimiter (its trailing whitespace stripped); alone, neither.
      const std::string delimiter = spec.strip_dataset ? python_rstrip(spec.continuation_delimiter) : spec.continuation_delimiter;
      for (const std::string& c : e.choices)
        q.contexts.push_back(q.preamble.empty() ? spec.prelimiter + c : spec.prelimiter + spec.example_delimiter + c + delimiter);
      q.continuations.push_back(with_space(e.continuation));
    } else {
      std::string c = spec.prelimiter + e.context;
      if (!q.preamble.empty()) c = spec.example_delimiter + c;
      c += spec.continuation_delimiter;
      q.contexts.push_back(spec.strip_dataset ? python_rstrip(c) : c);
      if (spec.type == IclTaskType::kMultipleChoice)
        for (const std::string& choice : e.choices) q.continuations.push_back(with_space(choice));
      else
        q.continuations.push_back(with_space(e.continuation));
    }
    out.push_back(std::move(q));
  }
  return out;
}

std::vector<IclQuestion> tokenize_icl_questions(const std::vector<IclQuestionText>& texts, Tokenizer& tok,
                                                int max_seq_len, const std::string& where) {
  ANVIL_CHECK(max_seq_len > 1, "{}: max_seq_len {} is too short for a question", where, max_seq_len);
  std::vector<IclQuestion> out;
  out.reserve(texts.size());
  for (size_t i = 0; i < texts.size(); i++) {
    const IclQuestionText& t = texts[i];
    std::vector<int32_t> preamble;
    if (tok.bos_id() >= 0) preamble.push_back(tok.bos_id());
    const std::vector<int32_t> p = tok.encode(t.preamble);
    preamble.insert(preamble.end(), p.begin(), p.end());
    IclQuestion q;
    q.gold = t.gold;
    const size_t rows = std::max(t.contexts.size(), t.continuations.size());
    for (size_t r = 0; r < rows; r++) {
      // Multiple choice shares the context; schema shares the continuation.
      const std::string& context = t.contexts[t.contexts.size() == 1 ? 0 : r];
      const std::string& continuation = t.continuations[t.continuations.size() == 1 ? 0 : r];
      std::vector<int32_t> ids = preamble;
      const std::vector<int32_t> c = tok.encode(context), cont = tok.encode(continuation);
      ids.insert(ids.end(), c.begin(), c.end());
      ANVIL_CHECK(!cont.empty(), "{}: question {}: continuation {} ('{}') has no tokens", where, i, r, continuation);
      ANVIL_CHECK(cont.size() < static_cast<size_t>(max_seq_len), "{}: question {}: its continuation alone is {} "
                  "tokens, and max_seq_len is {}", where, i, cont.size(), max_seq_len);
      // The first continuation token is scored by the logits of the token before it.
      ANVIL_CHECK(!ids.empty(), "{}: question {}: no context before the continuation (an empty query or option, "
                  "and no BOS or few-shot examples before it)", where, i);
      if (ids.size() + cont.size() > static_cast<size_t>(max_seq_len))
        ids.erase(ids.begin(), ids.end() - (max_seq_len - static_cast<int64_t>(cont.size())));
      IclRow row;
      row.continuation_begin = static_cast<int64_t>(ids.size());
      row.tokens = std::move(ids);
      row.tokens.insert(row.tokens.end(), cont.begin(), cont.end());
      q.rows.push_back(std::move(row));
    }
    out.push_back(std::move(q));
  }
  return out;
}

}  // namespace anvil
