#include "data/icl.h"

// Oniguruma names its byte type UChar unless told not to: ICU's UChar is another.
#define ONIG_ESCAPE_UCHAR_COLLISION
#include <oniguruma.h>
#include <unicode/uchar.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <mutex>
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
        e.context = string_field(row, "context", where);
        e.answer = string_field(row, "answer", where);
        e.answers.push_back(e.answer);
        // Foundry's reader (a table of the file's columns) gives a line without a column the
        // others have a null, on which its generation task fails: aliases and chain_of_thought
        // are on every line or on none.
        e.has_aliases = row.contains("aliases");
        ANVIL_CHECK(out.empty() || e.has_aliases == out.front().has_aliases, "{}: {} \"aliases\" where the file's first "
                    "example {} (give them on every line, or on none)", where, e.has_aliases ? "has" : "has no",
                    e.has_aliases ? "has none" : "has them");
        if (e.has_aliases) {
          ANVIL_CHECK(row["aliases"].is_array(), "{}: \"aliases\" must be a list of strings", where);
          for (const json& a : row["aliases"]) {
            ANVIL_CHECK(a.is_string(), "{}: \"aliases\" must be a list of strings", where);
            const std::string alias = a.get<std::string>();
            if (std::find(e.answers.begin(), e.answers.end(), alias) == e.answers.end()) e.answers.push_back(alias);
          }
        }
        e.has_chain_of_thought = row.contains("chain_of_thought");
        if (e.has_chain_of_thought) e.chain_of_thought = e.chain_of_thought_as_read = string_field(row, "chain_of_thought", where);
        ANVIL_CHECK(out.empty() || e.has_chain_of_thought == out.front().has_chain_of_thought, "{}: {} \"chain_of_thought\" "
                    "where the file's first example {} (give one on every line, or on none)", where,
                    e.has_chain_of_thought ? "has a" : "has no", e.has_chain_of_thought ? "has none" : "has one");
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
  auto with_space = [&](const std::string& s) { return prefix_space && !starts_with_space(s) ? " " + s : s; };
  // A generation example's answer: after its chain of thought and the delimiter, where the file
  // has them.
  auto generation_answer = [&](const IclExample& e) {
    return e.has_chain_of_thought ? e.chain_of_thought + spec.cot_delimiter + e.answer : e.answer;
  };
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
    if (spec.type == IclTaskType::kMultipleChoice) return c + e.choices[e.gold];
    return c + (spec.type == IclTaskType::kGenerationWithAnswers ? generation_answer(e) : e.continuation);
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
      else if (spec.type == IclTaskType::kGenerationWithAnswers)
        q.answers = e.answers;
      else
        q.continuations.push_back(with_space(e.continuation));
    }
    out.push_back(std::move(q));
  }
  return out;
}

std::vector<IclQuestion> tokenize_icl_questions(const std::vector<IclQuestionText>& texts, Tokenizer& tok,
                                                int max_seq_len, const std::string& where) {
  ANVIL_CHECK(max_seq_len > 0, "{}: max_seq_len {} is too short for a question", where, max_seq_len);
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
    q.answers = t.answers;
    if (t.continuations.empty()) {
      // A generation's prompt: its last max_seq_len tokens.
      std::vector<int32_t> ids = preamble;
      const std::vector<int32_t> c = tok.encode(t.contexts[0]);
      ids.insert(ids.end(), c.begin(), c.end());
      ANVIL_CHECK(!ids.empty(), "{}: question {}: an empty prompt (an empty context, and no BOS or few-shot examples "
                  "before it)", where, i);
      if (ids.size() > static_cast<size_t>(max_seq_len)) ids.erase(ids.begin(), ids.end() - max_seq_len);
      q.rows.push_back({ids, static_cast<int64_t>(ids.size())});
      out.push_back(std::move(q));
      continue;
    }
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

int icl_answer_tokens(const IclTaskSpec& spec, const std::vector<IclExample>& examples, Tokenizer& tok) {
  size_t longest = 0;
  for (const IclExample& e : examples)
    for (const std::string& a : e.answers) {
      const std::string response = e.has_chain_of_thought ? e.chain_of_thought_as_read + spec.cot_delimiter + a : a;
      longest = std::max(longest, tok.encode(response).size() + (tok.bos_id() >= 0 ? 1 : 0));
    }
  // Foundry's _MAX_ANSWER_BUFFER_LENGTH: room for the reasoning a chain-of-thought answer adds.
  return static_cast<int>(longest) + (spec.cot_delimiter.empty() ? 0 : 10);
}

namespace {

// Python's character classes as Foundry's normalize_answer uses them.
bool normalize_to_space(char32_t c) {
  static const std::u32string marks = U"!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~\u2018\u2019\u00b4";
  return marks.find(c) != std::u32string::npos;
}

// The stop strings joined by |, compiled as Python's re reads a pattern.
using Compiled = std::unique_ptr<regex_t, void (*)(regex_t*)>;
Compiled stop_pattern(const IclTaskSpec& spec, const std::string& where) {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
  std::string pattern;
  for (const std::string& stop : spec.early_stopping_criteria) pattern += (pattern.empty() ? "" : "|") + stop;
  regex_t* re = nullptr;
  OnigErrorInfo info;
  const auto* p = reinterpret_cast<const OnigUChar*>(pattern.data());
  const int rc = onig_new(&re, p, p + pattern.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8, ONIG_SYNTAX_PYTHON, &info);
  if (rc != ONIG_NORMAL) {
    OnigUChar message[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(message, rc, &info);
    ANVIL_FAIL("{}early_stopping_criteria: '{}' is not a regular expression: {}", where, pattern,
               reinterpret_cast<const char*>(message));
  }
  return Compiled(re, onig_free);
}

// Python's re.split(pattern, text)[0]: the text before the pattern's first match.
std::string before_first_match(const Compiled& re, const std::string& text) {
  const auto* t = reinterpret_cast<const OnigUChar*>(text.data());
  const OnigUChar* end = t + text.size();
  const int at = onig_search(re.get(), t, end, t, end, nullptr, ONIG_OPTION_NONE);
  ANVIL_CHECK(at >= 0 || at == ONIG_MISMATCH, "early_stopping_criteria: matching failed (Oniguruma error {})", at);
  return at == ONIG_MISMATCH ? text : text.substr(0, static_cast<size_t>(at));
}

// Python's text.split(delimiter)[-1]: after the last of the non-overlapping occurrences found
// from the left.
std::string after_last_split(const std::string& text, const std::string& delimiter) {
  size_t piece = 0;
  for (size_t at = text.find(delimiter); at != std::string::npos; at = text.find(delimiter, piece))
    piece = at + delimiter.size();
  return text.substr(piece);
}

}  // namespace

std::string icl_normalize_answer(std::string_view text) {
  std::string s(text);
  std::replace(s.begin(), s.end(), '_', ' ');
  std::u32string cp = code_points(python_lower(s));
  for (char32_t& c : cp)
    if (normalize_to_space(c)) c = U' ';
  // re.sub(r'\b(a|an|the)\b', ' ', text): a word of its own (Unicode word characters and _).
  const auto word = [](char32_t c) {
    // Python's str.isalnum() (letters, and digits and numbers of every kind), or _.
    const int8_t t = u_charType(static_cast<UChar32>(c));
    return c == U'_' || (t >= U_UPPERCASE_LETTER && t <= U_OTHER_LETTER) ||
           (t >= U_DECIMAL_DIGIT_NUMBER && t <= U_OTHER_NUMBER);
  };
  std::u32string out;
  for (size_t i = 0; i < cp.size();) {
    bool article = false;
    if (i == 0 || !word(cp[i - 1]))
      for (const std::u32string a : {U"an", U"a", U"the"})
        if (cp.compare(i, a.size(), a) == 0 && (i + a.size() == cp.size() || !word(cp[i + a.size()]))) {
          out += U' ';
          i += a.size();
          article = true;
          break;
        }
    if (!article) out += cp[i++];
  }
  // ' '.join(text.split()), then strip.
  std::u32string joined;
  for (size_t i = 0; i < out.size();) {
    while (i < out.size() && python_isspace(out[i])) i++;
    size_t j = i;
    while (j < out.size() && !python_isspace(out[j])) j++;
    if (j > i) {
      if (!joined.empty()) joined += U' ';
      joined += out.substr(i, j - i);
    }
    i = j;
  }
  return utf8(joined);
}

void check_icl_stop_strings(const IclTaskSpec& spec, const std::string& where) {
  if (!spec.early_stopping_criteria.empty()) stop_pattern(spec, where + ": ");
}

bool icl_generation_correct(const IclTaskSpec& spec, const std::string& generated,
                            const std::vector<std::string>& answers) {
  std::string a = generated;
  if (!spec.early_stopping_criteria.empty()) a = before_first_match(stop_pattern(spec, ""), a);
  if (!spec.cot_delimiter.empty()) a = after_last_split(a, spec.cot_delimiter);
  const auto clean = [&](const std::string& s) { return spec.do_normalization ? icl_normalize_answer(s) : python_strip(s); };
  a = clean(a);
  return std::any_of(answers.begin(), answers.end(), [&](const std::string& l) { return a.rfind(clean(l), 0) == 0; });
}

}  // namespace anvil
