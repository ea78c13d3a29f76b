// LLM Foundry's in-context-learning prompts, checked by hand against the rules of
// llmfoundry/eval/datasets/in_context_learning_evaluation.py (docs/eval.md lists them): where
// delimiters go, what is stripped, when a continuation gets a leading space, and the few-shot
// examples in the order Python's set gives them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fs.h"
#include "data/icl.h"
#include "data/python_random.h"
#include "data/python_text.h"
#include "data/tokenizer.h"

namespace anvil {
namespace {

namespace fs = std::filesystem;

IclExample mc(std::string query, std::vector<std::string> choices, int64_t gold) {
  IclExample e;
  e.context = std::move(query);
  e.choices = std::move(choices);
  e.gold = gold;
  return e;
}

TEST(IclPrompts, MultipleChoiceZeroShot) {
  IclTaskSpec spec;
  spec.continuation_delimiter = "\nAnswer: ";
  const auto q = icl_question_texts(spec, {mc("Which?", {"red", " blue"}, 1)}, true);
  ASSERT_EQ(q.size(), 1u);
  EXPECT_EQ(q[0].preamble, "");
  // The context loses the delimiter's trailing space; each choice gets one unless it has one.
  EXPECT_EQ(q[0].contexts, (std::vector<std::string>{"Which?\nAnswer:"}));
  EXPECT_EQ(q[0].continuations, (std::vector<std::string>{" red", " blue"}));
  EXPECT_EQ(q[0].gold, 1);
  // A tokenizer without prefix spaces (SentencePiece) gets the choices as they are.
  EXPECT_EQ(icl_question_texts(spec, {mc("Which?", {"red", " blue"}, 1)}, false)[0].continuations,
            (std::vector<std::string>{"red", " blue"}));
}

TEST(IclPrompts, FewShotExamplesInPythonsSetOrderWithDelimiters) {
  std::vector<IclExample> examples;
  for (int i = 0; i < 5; i++) examples.push_back(mc("Q" + std::to_string(i), {"a" + std::to_string(i), "b"}, 0));
  IclTaskSpec spec;
  spec.num_fewshot = 2;
  spec.prelimiter = "Question: ";
  const auto q = icl_question_texts(spec, examples, true);
  // The draws of one generator seeded 1234, question by question.
  PythonRandom rng(1234);
  for (int i = 0; i < 5; i++) {
    const std::vector<int64_t> shots = fewshot_indices(5, 2, i, rng);
    ASSERT_EQ(shots.size(), 2u);
    // No delimiter before the first example (nothing precedes it), one before each later piece.
    const std::string expected = "Question: Q" + std::to_string(shots[0]) + " a" + std::to_string(shots[0]) +
                                 "\nQuestion: Q" + std::to_string(shots[1]) + " a" + std::to_string(shots[1]);
    EXPECT_EQ(q[i].preamble, expected) << "question " << i;
    EXPECT_EQ(q[i].contexts[0], "\nQuestion: Q" + std::to_string(i)) << "question " << i;
  }
  // With a prompt string, the first example follows it after the delimiter.
  spec.prompt_string = "Quiz.";
  const auto p = icl_question_texts(spec, examples, true);
  EXPECT_EQ(p[0].preamble.rfind("Quiz.\nQuestion: Q", 0), 0u) << p[0].preamble;
}

TEST(IclPrompts, SchemaOptionsAreTheContexts) {
  IclExample e;
  e.choices = {"The cup fell because it", "The cup fell because the table"};
  e.continuation = "was pushed.";
  e.gold = 0;
  IclTaskSpec spec;
  spec.type = IclTaskType::kSchema;
  // Alone: the option, with no continuation delimiter at all.
  auto q = icl_question_texts(spec, {e, e}, true);
  EXPECT_EQ(q[0].contexts, e.choices);
  EXPECT_EQ(q[0].continuations, (std::vector<std::string>{" was pushed."}));
  // After few-shot examples: the example delimiter, the option, the delimiter right-stripped; the
  // few-shot example is its gold option and continuation (the prelimiter before its delimiter).
  spec.num_fewshot = 1;
  spec.continuation_delimiter = " => ";
  spec.prelimiter = "P:";
  q = icl_question_texts(spec, {e, e}, true);
  EXPECT_EQ(q[0].preamble, "P:The cup fell because it => was pushed.");
  EXPECT_EQ(q[0].contexts, (std::vector<std::string>{"P:\nThe cup fell because it =>", "P:\nThe cup fell because the table =>"}));
}

TEST(IclPrompts, LanguageModeling) {
  IclExample lm;
  lm.context = "The capital of France is";
  lm.continuation = "Paris";
  IclTaskSpec spec;
  spec.type = IclTaskType::kLanguageModeling;
  spec.num_fewshot = 1;
  auto q = icl_question_texts(spec, {lm, lm}, true);
  EXPECT_EQ(q[0].preamble, "The capital of France is Paris");  // the few-shot answer as written
  EXPECT_EQ(q[0].contexts[0], "\nThe capital of France is");
  EXPECT_EQ(q[0].continuations, (std::vector<std::string>{" Paris"}));
}

TEST(IclPrompts, PythonStripIsUnicodeWhitespace) {
  EXPECT_EQ(python_strip("\u3000\t a b\u00a0\n\u2029"), "a b");
  EXPECT_EQ(python_rstrip(" a\u200b "), " a\u200b");  // a zero-width space is not whitespace in Python
  EXPECT_EQ(python_strip(" \u0085x"), "x");
}

// Foundry tokenizes the preamble (with BOS), the context and each continuation apart, and cuts
// a long row's context from the left.
TEST(IclTokens, PiecesApartAndLongContextsCutFromTheLeft) {
  auto tok = load_tokenizer("gpt2");
  IclQuestionText t;
  t.preamble = "One two";
  t.contexts = {" three four five"};
  t.continuations = {" six", " seven eight"};
  auto ids = [&](const std::string& s) { return tok->encode(s); };
  const auto q = tokenize_icl_questions({t}, *tok, 64, "test");
  ASSERT_EQ(q[0].rows.size(), 2u);
  std::vector<int32_t> expected = ids("One two");
  for (int32_t id : ids(" three four five")) expected.push_back(id);
  const int64_t context = static_cast<int64_t>(expected.size());
  for (int32_t id : ids(" six")) expected.push_back(id);
  EXPECT_EQ(q[0].rows[0].tokens, expected);
  EXPECT_EQ(q[0].rows[0].continuation_begin, context);
  // Five tokens: the second row keeps its two continuation tokens and the context's last three.
  const auto cut = tokenize_icl_questions({t}, *tok, 5, "test");
  const std::vector<int32_t> c = ids(" three four five"), cont = ids(" seven eight");
  ASSERT_EQ(c.size(), 3u);
  ASSERT_EQ(cont.size(), 2u);
  EXPECT_EQ(cut[0].rows[1].tokens, (std::vector<int32_t>{c[0], c[1], c[2], cont[0], cont[1]}));
  EXPECT_EQ(cut[0].rows[1].continuation_begin, 3);
  // A continuation that fills the sequence cannot be scored.
  EXPECT_THROW(tokenize_icl_questions({t}, *tok, 2, "test"), Error);
  // Without BOS, preamble or context, the first continuation token has nothing to be scored by.
  IclQuestionText bare;
  bare.contexts = {""};
  bare.continuations = {" six"};
  EXPECT_THROW(tokenize_icl_questions({bare}, *tok, 64, "test"), Error);
}

// generation_task_with_answers, as svamp's task in Foundry's tasks_v0.3.yaml: the few-shot
// answer is the chain of thought, the delimiter and the answer, with no space between them.
TEST(IclPrompts, GenerationWithChainOfThought) {
  IclTaskSpec spec;
  spec.type = IclTaskType::kGenerationWithAnswers;
  spec.num_fewshot = 1;
  spec.prelimiter = "Question: ";
  spec.continuation_delimiter = "\n\nA:";
  spec.cot_delimiter = "The answer is ";
  IclExample e;
  e.context = "What is 52 + 535?";
  e.answer = "587";
  e.chain_of_thought = "( 52.0 + 535.0 )";
  e.answers = {"587", " 587.0"};
  e.has_chain_of_thought = true;
  const auto q = icl_question_texts(spec, {e, e}, true);
  EXPECT_EQ(q[0].preamble, "Question: What is 52 + 535?\n\nA:( 52.0 + 535.0 )The answer is 587");
  EXPECT_EQ(q[0].contexts, (std::vector<std::string>{"\nQuestion: What is 52 + 535?\n\nA:"}));
  EXPECT_TRUE(q[0].continuations.empty());
  EXPECT_EQ(q[0].answers, e.answers);
  // The prompt alone, its tokens cut from the left to the room left for the answer.
  auto tok = load_tokenizer("gpt2");
  const std::vector<int32_t> all = tok->encode(q[0].preamble + q[0].contexts[0]);
  const auto t = tokenize_icl_questions(q, *tok, 5, "test");
  ASSERT_EQ(t[0].rows.size(), 1u);
  EXPECT_EQ(t[0].rows[0].tokens, std::vector<int32_t>(all.end() - 5, all.end()));
  EXPECT_EQ(t[0].answers, e.answers);
  IclQuestionText bare;
  bare.contexts = {""};
  EXPECT_THROW(tokenize_icl_questions({bare}, *tok, 64, "test"), Error);
  // The generation's length: the longest answer after the chain of thought as read, and 10.
  IclExample raw = e;
  raw.chain_of_thought_as_read = " ( 52.0 + 535.0 ) ";
  size_t longest = 0;
  for (const std::string& a : raw.answers)
    longest = std::max(longest, tok->encode(raw.chain_of_thought_as_read + spec.cot_delimiter + a).size());
  EXPECT_EQ(icl_answer_tokens(spec, {raw}, *tok), static_cast<int>(longest) + 10);
  spec.cot_delimiter.clear();
  raw.has_chain_of_thought = false;
  EXPECT_EQ(icl_answer_tokens(spec, {raw}, *tok), static_cast<int>(tok->encode(" 587.0").size()));
}

// Foundry's normalize_answer and exact-match rule; each expectation is what Python gives for
// llmfoundry/eval/metrics/nlp.py's code on the same input.
TEST(IclGeneration, NormalizedAsPythonDoes) {
  EXPECT_EQ(icl_normalize_answer("The Quick_brown fox's tale!"), "quick brown fox s tale");
  EXPECT_EQ(icl_normalize_answer("  An apple, a day  "), "apple day");
  EXPECT_EQ(icl_normalize_answer("theater and the\u00a0end"), "theater and end");
  EXPECT_EQ(icl_normalize_answer("\u00c9COLE \u2014 the \u2018Best\u2019 `one`"), "\u00e9cole \u2014 best one");
  EXPECT_EQ(icl_normalize_answer("A"), "");
  EXPECT_EQ(icl_normalize_answer("an_a the.the"), "");
  EXPECT_EQ(icl_normalize_answer("Stra\u00dfe \u0130stanbul"), "stra\u00dfe i\u0307stanbul");
  // Letter numbers and other numbers are word characters for \b: no article there.
  EXPECT_EQ(icl_normalize_answer("x\u2160a y\u00b2an"), "x\u2170a y\u00b2an");
}

// Python's bytes.decode("utf-8", "replace"), as transformers decodes a generation cut inside a
// character: each expectation is Python's.
TEST(IclGeneration, BrokenUtf8AsPythonReplacesIt) {
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(python_utf8_replace("a\xE2\x82"), "a" + r);
  EXPECT_EQ(python_utf8_replace("\xE2\x82\xAC"), "\xE2\x82\xAC");
  EXPECT_EQ(python_utf8_replace("\xC0\xAF"), r + r);
  EXPECT_EQ(python_utf8_replace("\xED\xA0\x80"), r + r + r);
  EXPECT_EQ(python_utf8_replace("\xF0\x9F\x98" "a"), r + "a");
  EXPECT_EQ(python_utf8_replace("\xFF"), r);
  EXPECT_EQ(python_utf8_replace("\xF4\x90\x80\x80"), r + r + r + r);
  EXPECT_EQ(python_utf8_replace("\xE0\x80\xAF"), r + r + r);
  EXPECT_EQ(python_utf8_replace("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
}

TEST(IclGeneration, JudgedAsFoundryJudges) {
  auto judged = [](const std::string& out, const std::vector<std::string>& answers, std::vector<std::string> stops,
                   const std::string& cot, bool normalize) {
    IclTaskSpec spec;
    spec.type = IclTaskType::kGenerationWithAnswers;
    spec.early_stopping_criteria = std::move(stops);
    spec.cot_delimiter = cot;
    spec.do_normalization = normalize;
    return icl_generation_correct(spec, out, answers);
  };
  const std::vector<std::string> v03 = {"\n\n", "Question:"};
  EXPECT_TRUE(judged(" 18. Next question", {"18"}, v03, "The answer is ", false));
  EXPECT_TRUE(judged(" We add 5 and 13. The answer is 18.\n\nQuestion: what", {"18"}, v03, "The answer is ", false));
  EXPECT_TRUE(judged(" The answer is 1The answer is 9", {"9"}, {}, "The answer is ", false));
  EXPECT_FALSE(judged(" The answer is 1The answer is 9", {"1"}, {}, "The answer is ", false));
  EXPECT_TRUE(judged("aaa", {"a"}, {}, "aa", false));  // split from the left: "", "a"
  EXPECT_TRUE(judged(" The Eiffel tower, in Paris", {"eiffel tower"}, {}, "", true));
  EXPECT_TRUE(judged(" onions are", {"Onion"}, {}, "", true));  // a prefix
  EXPECT_TRUE(judged(" nothing", {"The"}, {}, "", true));       // normalised to "": matches anything
  EXPECT_FALSE(judged(" Paris\nFrance", {" paris "}, {"\n"}, "", false));
  EXPECT_FALSE(judged(" Paris", {"paris"}, {}, "", false));
  EXPECT_TRUE(judged("x1y", {"x"}, {"[0-9]"}, "", false));  // stop strings are a regular expression
  EXPECT_FALSE(judged("abc", {"zz"}, {""}, "", false));
  EXPECT_THROW(judged("abc", {"a"}, {"("}, "", false), Error);
}

class IclFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("anvil-icl-test." + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& text) {
    const std::string path = (dir_ / "task.jsonl").string();
    write_file_atomic(path, text);
    return path;
  }
  fs::path dir_;
};

TEST_F(IclFiles, ReadsFoundrysFieldsStrippingStringsNotLists) {
  const auto mcq = read_icl_examples(write("{\"query\": \" Which?\\n\", \"choices\": [\" a \", \"b\"], \"gold\": 1}\n\n"),
                                     IclTaskType::kMultipleChoice, true);
  ASSERT_EQ(mcq.size(), 1u);
  EXPECT_EQ(mcq[0].context, "Which?");
  EXPECT_EQ(mcq[0].choices, (std::vector<std::string>{" a ", "b"}));
  const auto lm = read_icl_examples(
      write("{\"context\": \"\u3000Q \", \"continuation\": \" Paris\\n\", \"category\": \"geo\"}\n"),
      IclTaskType::kLanguageModeling, true, true);
  EXPECT_EQ(lm[0].context, "Q");
  EXPECT_EQ(lm[0].continuation, "Paris");
  EXPECT_EQ(lm[0].category, "geo");
}

TEST_F(IclFiles, GenerationAnswersAsReadChainOfThoughtOnEveryLineOrNone) {
  const auto gen = read_icl_examples(
      write("{\"context\": \" Q \", \"answer\": \" A \", \"aliases\": [\" A \", \"a\", \"a\"], "
            "\"chain_of_thought\": \" because \"}\n"),
      IclTaskType::kGenerationWithAnswers, true);
  ASSERT_EQ(gen.size(), 1u);
  EXPECT_EQ(gen[0].context, "Q");
  EXPECT_EQ(gen[0].answer, "A");
  EXPECT_EQ(gen[0].answers, (std::vector<std::string>{" A ", "a"}));  // a set, as the file has them
  EXPECT_EQ(gen[0].chain_of_thought, "because");
  EXPECT_EQ(gen[0].chain_of_thought_as_read, " because ");
  EXPECT_TRUE(gen[0].has_chain_of_thought);
  // A column on some lines only: Foundry's reader gives the others a null, and fails on it.
  for (const char* column : {"\"chain_of_thought\": \"c\"", "\"aliases\": []"}) {
    try {
      read_icl_examples(write(std::string("{\"context\": \"Q\", \"answer\": \"A\", ") + column +
                              "}\n{\"context\": \"Q\", \"answer\": \"A\"}\n"),
                        IclTaskType::kGenerationWithAnswers, true);
      ADD_FAILURE() << "no error for " << column;
    } catch (const Error& e) {
      const std::string name = std::string(column).substr(0, std::string(column).find(':'));
      EXPECT_NE(std::string(e.what()).find("task.jsonl:2: has no " + name), std::string::npos) << e.what();
    }
  }
}

TEST_F(IclFiles, BadLinesAreClearErrors) {
  auto error_of = [&](const std::string& text, IclTaskType type) {
    try {
      read_icl_examples(write(text), type, true);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of("{\"query\": \"q\", \"choices\": [\"a\"], \"gold\": 3}\n", IclTaskType::kMultipleChoice)
                .find("task.jsonl:1: gold 3 is not the index of one of its 1 choices"),
            std::string::npos);
  EXPECT_NE(error_of("{\"context\": \"c\"}\n", IclTaskType::kLanguageModeling).find("task.jsonl:1: no \"continuation\""),
            std::string::npos);
  EXPECT_NE(error_of("{\"query\": 1\n", IclTaskType::kMultipleChoice).find("task.jsonl:1: not a JSON object"),
            std::string::npos);
  EXPECT_NE(error_of("\n", IclTaskType::kSchema).find("holds no examples"), std::string::npos);
}

}  // namespace
}  // namespace anvil
