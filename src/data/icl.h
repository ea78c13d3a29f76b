// LLM Foundry's in-context-learning tasks, built as Foundry builds them
// (llmfoundry/eval/datasets/in_context_learning_evaluation.py): each question's text as the
// three pieces Foundry tokenizes apart (the prompt and few-shot examples; the question's
// context; each continuation), then token rows left-truncated to the sequence length, with the
// span each score reads. docs/eval.md says where each rule comes from.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace anvil {

class Tokenizer;

enum class IclTaskType { kMultipleChoice, kSchema, kLanguageModeling, kGenerationWithAnswers };
// Foundry's icl_task_type names: multiple_choice, schema, language_modeling,
// generation_task_with_answers.
IclTaskType icl_task_type_named(const std::string& name, const std::string& where);

// One task at one shot count: Foundry's dataset object's settings, with its defaults.
struct IclTaskSpec {
  IclTaskType type = IclTaskType::kMultipleChoice;
  int num_fewshot = 0;
  std::string prompt_string;
  std::string example_delimiter = "\n";
  std::string continuation_delimiter = " ";
  std::string prelimiter;          // question_prelimiter
  uint64_t fewshot_random_seed = 1234;
  bool strip_dataset = true;
  // generation_task_with_answers: the text after the last cot_delimiter is the answer; the
  // generated text is cut before the first match of the stop strings (one regular expression of
  // them joined by |, as Python's re reads it); answers normalised or only stripped.
  std::string cot_delimiter;
  std::vector<std::string> early_stopping_criteria;
  bool do_normalization = true;
  // generation_kwargs, the arguments Foundry passes to transformers' generate() over its own:
  // max_new_tokens (0: Foundry's, the longest answer's tokens) and the tokens that end a
  // generation (eos_token_id; empty: the tokenizer's EOS).
  int max_new_tokens = 0;
  std::vector<int32_t> eos_ids;
};

// One line of a task's JSON-lines file, in Foundry's fields: multiple_choice query/choices/gold,
// schema context_options/continuation/gold, language_modeling context/continuation,
// generation_task_with_answers context/answer and optional aliases and chain_of_thought; category
// where the task has categories.
struct IclExample {
  std::string context;                 // query, or context
  std::vector<std::string> choices;    // choices, or context_options
  std::string continuation;            // language modeling and schema
  int64_t gold = 0;
  std::string category;
  // generation_task_with_answers: the answer and chain of thought a few-shot example shows
  // (stripped with the rest); the answer and its aliases as the file has them, each once (what a
  // generation is judged against); the chain of thought as the file has it; whether the file
  // gives chains of thought and aliases (each on all its lines, or on none).
  std::string answer, chain_of_thought;
  std::vector<std::string> answers;
  std::string chain_of_thought_as_read;
  bool has_chain_of_thought = false, has_aliases = false;
};

// A task file's examples; strip: every string field (not a list's strings) stripped of the
// whitespace Python's str.strip removes, as Foundry's strip_dataset does.
std::vector<IclExample> read_icl_examples(const std::string& path, IclTaskType type, bool strip,
                                          bool has_categories = false);

// A question's text in Foundry's three pieces. Rows: one per choice (multiple_choice: the
// context's continuation is each choice; schema: each option's context before the one
// continuation), one for language modeling.
struct IclQuestionText {
  std::string preamble;               // prompt_string and the few-shot examples
  std::vector<std::string> contexts;  // per row (one for all but schema)
  std::vector<std::string> continuations;  // per row (one for all but multiple_choice; none for generation)
  int64_t gold = 0;
  std::vector<std::string> answers;  // generation: IclExample::answers
};

// The questions' texts, each with its few-shot examples drawn as Foundry draws them (one
// generator seeded with fewshot_random_seed for the whole task, question by question).
// prefix_space: the tokenizer makes " a" one token (GPT-2's byte-level BPE), so a continuation
// gets a leading space where it has none.
std::vector<IclQuestionText> icl_question_texts(const IclTaskSpec& spec, const std::vector<IclExample>& examples,
                                                bool prefix_space);

// A row the model scores: the context's tokens, then the continuation's, whose log-probabilities
// (or greedy predictions) are read. Generation: the prompt alone.
struct IclRow {
  std::vector<int32_t> tokens;
  int64_t continuation_begin = 0;  // the continuation is tokens[continuation_begin, end)
};

struct IclQuestion {
  std::vector<IclRow> rows;  // one per choice (multiple_choice, schema), one (language_modeling, generation)
  int64_t gold = 0;
  std::vector<std::string> answers;  // generation
};

// The questions as Foundry tokenizes them: the preamble with the tokenizer's special tokens (its
// BOS, where it adds one: also before an empty preamble), the context and each continuation
// without any, each piece on its own; where a row is longer than max_seq_len its context loses
// tokens from the left (the BOS and the few-shot examples first). A row with no context token,
// a continuation of none or of max_seq_len tokens or more is an error naming `where` and the
// question. Generation: max_seq_len is what the prompt may take (the task's length less
// icl_answer_tokens).
std::vector<IclQuestion> tokenize_icl_questions(const std::vector<IclQuestionText>& texts, Tokenizer& tok,
                                                int max_seq_len, const std::string& where);

// Whether the tokenizer makes " a" one token (Foundry's tokenizer_needs_prefix_space).
bool tokenizer_needs_prefix_space(Tokenizer& tok);

// generation_task_with_answers: the most tokens an answer of the examples takes, as Foundry
// counts them (the tokenizer's special tokens included; with a chain of thought, it, the
// cot_delimiter and the answer, all as the file has them), 10 more where cot_delimiter is set:
// the greedy generation's length.
int icl_answer_tokens(const IclTaskSpec& spec, const std::vector<IclExample>& examples, Tokenizer& tok);

// Foundry's normalize_answer: "_" to a space, lower case, punctuation (ASCII's and ‘ ’ ´ `) to
// spaces, the words a, an and the removed, runs of whitespace one space, stripped.
std::string icl_normalize_answer(std::string_view text);

// The stop strings as one regular expression (joined by |, as Python's re reads it): one that
// does not compile is an error naming `where`.
void check_icl_stop_strings(const IclTaskSpec& spec, const std::string& where);

// Whether a generated text is right, as Foundry's InContextLearningGenerationExactMatchAccuracy
// judges it: cut before the first match of the stop strings, after the last cot_delimiter, then
// normalised (do_normalization) or stripped, it starts with one of the answers treated the same.
bool icl_generation_correct(const IclTaskSpec& spec, const std::string& generated,
                            const std::vector<std::string>& answers);

}  // namespace anvil
