#include "data/icl.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/python_random.h"
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

const char* icl_task_type_name(IclTaskType type) {
  switch (type) {
    case IclTaskType::kMultipleChoice: return "multiple_choice";
    case IclTaskType::kSchema: return "schema";
    case IclTaskType::kLanguageModeling: return "language_modeling";
    case IclTaskType::kGenerationWithAnswers: return "generation_task_with_answers";
  }
  return "?";
}

namespace {

// Python's str.isspace.
bool python_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
         cp == 0x3000;
}

// The code point at s[i] and its byte length (a byte that starts no UTF-8 sequence: U+FFFD,
// length 1).
std::pair<uint32_t, size_t> code_point(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return {c, 1};
  const size_t n = c >> 5 == 6 ? 2 : c >> 4 == 14 ? 3 : c >> 3 == 30 ? 4 : 1;
  if (n == 1 || i + n > s.size()) return {0xfffd, 1};
  uint32_t cp = c & (0x7f >> n);
  for (size_t k = 1; k < n; k++) cp = cp << 6 | (static_cast<unsigned char>(s[i + k]) & 0x3f);
  return {cp, n};
}

size_t leading_space(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto [cp, n] = code_point(s, i);
    if (!python_space(cp)) break;
    i += n;
  }
  return i;
}

// Where the trailing whitespace starts.
size_t trailing_space(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xc0) == 0x80 && end - start < 4) start--;
    const auto [cp, n] = code_point(s, start);
    if (start + n != end || !python_space(cp)) break;
    end = start;
  }
  return end;
}

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

std::string python_strip(std::string_view s) {
  const size_t b = leading_space(s);
  return std::string(s.substr(b, trailing_space(s.substr(b))));
}

std::string python_rstrip(std::string_view s) { return std::string(s.substr(0, trailing_space(s))); }

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
        e.context = string_field(row, "context", where);
        e.answer = string_field(row, "answer", where);
        // The accepted answers are the answer and its aliases as written (Foundry makes the set
        // before stripping).
        e.aliases = {e.answer};
        if (row.contains("aliases"))
          for (const std::string& a : string_list(row, "aliases", where))
            if (std::find(e.aliases.begin(), e.aliases.end(), a) == e.aliases.end()) e.aliases.push_back(a);
        if (row.contains("chain_of_thought")) {
          e.chain_of_thought = string_field(row, "chain_of_thought", where);
          e.has_chain_of_thought = true;
        }
        break;
    }
    if (has_categories) e.category = string_field(row, "category", where);
    if (strip) {
      e.context = python_strip(e.context);
      e.continuation = python_strip(e.continuation);
      e.answer = python_strip(e.answer);
      e.chain_of_thought = python_strip(e.chain_of_thought);
    }
    out.push_back(std::move(e));
  }
  ANVIL_CHECK(!out.empty(), "the task file '{}' holds no examples", path);
  return out;
}

std::vector<IclQuestionText> icl_question_texts(const IclTaskSpec& spec, const std::vector<IclExample>& examples,
                                                bool prefix_space) {
  const int64_t n = static_cast<int64_t>(examples.size());
  ANVIL_CHECK(spec.num_fewshot >= 0, "num_fewshot {} must not be negative", spec.num_fewshot);
  const bool has_cot =
      std::any_of(examples.begin(), examples.end(), [](const IclExample& e) { return e.has_chain_of_thought; });
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
    switch (spec.type) {
      case IclTaskType::kMultipleChoice: return c + e.choices[e.gold];
      case IclTaskType::kLanguageModeling: return c + e.continuation;
      default: return c + (has_cot ? e.chain_of_thought + spec.cot_delimiter + e.answer : e.answer);
    }
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
      else if (spec.type == IclTaskType::kLanguageModeling)
        q.continuations.push_back(with_space(e.continuation));
      else
        q.answers = e.aliases;
    }
    out.push_back(std::move(q));
  }
  return out;
}

std::vector<IclQuestion> tokenize_icl_questions(const std::vector<IclQuestionText>& texts, IclTaskType type,
                                                Tokenizer& tok, int max_seq_len) {
  ANVIL_CHECK(type != IclTaskType::kGenerationWithAnswers, "generation_task_with_answers tasks are not evaluated by "
              "anvil yet (multiple_choice, schema and language_modeling are)");
  ANVIL_CHECK(max_seq_len > 1, "max_seq_len {} is too short for a question", max_seq_len);
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
      ANVIL_CHECK(!cont.empty(), "question {}: continuation {} ('{}') has no tokens", i, r, continuation);
      ANVIL_CHECK(cont.size() < static_cast<size_t>(max_seq_len), "question {}: its continuation alone is {} tokens, "
                  "and max_seq_len is {}", i, cont.size(), max_seq_len);
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
