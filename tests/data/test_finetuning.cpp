// Fine-tuning records as LLM Foundry reads them: turns of prompt/response and chat records, the
// target policies, the shift and cut into a training example, finding a split's files, and the
// tokenized MDS written, counted and read back through the loader.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/targets.h"
#include "data/finetuning.h"
#include "data/loader.h"
#include "data/streaming.h"

namespace anvil {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
constexpr int32_t I = kIgnoreIndex;

const ChatFormatter& chatml() {
  static const ChatFormatter f(chat_template_named("chatml", "test"), TokenizerFiles{});
  return f;
}

TEST(Finetuning, PromptResponseRecordIsOneTurn) {
  const auto t = record_turns(ojson::parse(R"({"prompt": "Q?", "response": " A."})"), chatml());
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].prompt, "Q?");
  EXPECT_EQ(t[0].response, " A.");
  const auto c = record_turns(ojson::parse(R"({"prompt": "Q?", "completion": "B"})"), chatml());
  EXPECT_EQ(c[0].response, "B");
}

// Foundry cuts a chat at each assistant message: the prompt is everything since the previous
// turn plus the generation prompt, the response the rest of the assistant's message.
TEST(Finetuning, ChatRecordIsCutAtEachAssistantMessage) {
  const ojson chat = ojson::parse(R"({"messages": [
      {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"},
      {"role": "assistant", "content": "Later"}]})");
  const auto t = record_turns(chat, chatml());
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].prompt, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                         "<|im_start|>assistant\n");
  EXPECT_EQ(t[0].response, "Hello<|im_end|>\n");
  EXPECT_EQ(t[1].prompt, "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(t[1].response, "Later<|im_end|>\n");
  // Together the turns are the whole conversation as the template renders it.
  std::string whole;
  for (const auto& turn : t) whole += turn.prompt + turn.response;
  std::string rendered;
  for (const ojson& m : chat["messages"])
    rendered += render_chat_message(chat_template_named("chatml", "test"), m["role"], m["content"]);
  EXPECT_EQ(whole, rendered);
}

TEST(Finetuning, RecordsFoundryRefusesAreErrorsSayingWhy) {
  auto why = [](const char* text) {
    try {
      record_turns(ojson::parse(text), chatml());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(why(R"({"messages": [{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}]})")
                .find("unknown role 'bot'"), std::string::npos);
  EXPECT_NE(why(R"({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
                  {"role": "assistant", "content": "c"}]})").find("roles must alternate"), std::string::npos);
  EXPECT_NE(why(R"({"messages": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]})")
                .find("must end with the assistant"), std::string::npos);
  EXPECT_NE(why(R"({"messages": [{"role": "assistant", "content": "a"}]})").find("at least 2"), std::string::npos);
  EXPECT_NE(why(R"({"messages": [{"role": "user", "content": 1}, {"role": "assistant", "content": "b"}]})")
                .find("content must be a string"), std::string::npos);
  EXPECT_NE(why(R"({"prompt": "a", "answer": "b"})").find("keys: prompt, answer"), std::string::npos);
  EXPECT_NE(why(R"({"prompt": "a", "response": "b", "extra": 1})").find("this one has keys"), std::string::npos);
  EXPECT_NE(why(R"({"prompt": ["a"], "response": "b"})").find("prompt must be a string"), std::string::npos);
  EXPECT_NE(why(R"([1, 2])").find("JSON object"), std::string::npos);
}

TEST(Finetuning, TargetPoliciesParseAndPrint) {
  const TargetPolicy p = parse_target_policy("length>=12", "all", "here");
  EXPECT_EQ(p.prompts, TargetPolicy::Prompts::kLengthAtLeast);
  EXPECT_EQ(p.prompt_min_length, 12);
  EXPECT_EQ(target_prompts_name(p), "length>=12");
  EXPECT_EQ(target_responses_name(p), "all");
  EXPECT_THROW(parse_target_policy("some", "last", "here"), Error);
  EXPECT_THROW(parse_target_policy("length>=0", "last", "here"), Error);
  EXPECT_THROW(parse_target_policy("length>=x", "last", "here"), Error);
  EXPECT_THROW(parse_target_policy("none", "first", "here"), Error);
}

// Two turns: prompt tokens 1 2 / response 3, prompt 4 / response 5; EOS 9 closes the last.
TEST(Finetuning, StitchingFollowsTheTargetPolicy) {
  const std::vector<Turn> turns = {{{1, 2}, {3}}, {{4}, {5}}};
  const Stitched last = stitch_turns(turns, TargetPolicy{}, 9);
  EXPECT_EQ(last.tokens, (std::vector<int32_t>{1, 2, 3, 4, 5, 9}));
  EXPECT_EQ(last.labels, (std::vector<int32_t>{I, I, I, I, 5, 9}));
  const Stitched all = stitch_turns(turns, parse_target_policy("all", "all", ""), 9);
  EXPECT_EQ(all.labels, (std::vector<int32_t>{1, 2, 3, 4, 5, 9}));
  const Stitched longer = stitch_turns(turns, parse_target_policy("length>=2", "all", ""), 9);
  EXPECT_EQ(longer.labels, (std::vector<int32_t>{1, 2, 3, I, 5, 9}));
  // A response that already ends with EOS gets no second one.
  const Stitched ended = stitch_turns({{{1}, {2, 9}}}, TargetPolicy{}, 9);
  EXPECT_EQ(ended.tokens, (std::vector<int32_t>{1, 2, 9}));
}

// inputs are the tokens, targets the labels shifted by one (transformers' shift), cut at seq_len.
TEST(Finetuning, ExampleShiftsLabelsAndCutsAtSeqLen) {
  const Stitched s = stitch_turns({{{1, 2}, {3, 4}}}, TargetPolicy{}, 9);  // 1 2 3 4 9 / I I 3 4 9
  std::vector<int32_t> in(8), tg(8);
  EXPECT_EQ(finetuning_example(s, 8, in.data(), tg.data()), 3);
  EXPECT_EQ(in, (std::vector<int32_t>{1, 2, 3, 4, 9, 0, 0, 0}));
  EXPECT_EQ(tg, (std::vector<int32_t>{I, 3, 4, 9, I, I, I, I}));
  std::vector<int32_t> in3(3), tg3(3);
  EXPECT_EQ(finetuning_example(s, 3, in3.data(), tg3.data()), 1);
  EXPECT_EQ(in3, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(tg3, (std::vector<int32_t>{I, 3, I}));
}

class FinetuningFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / fmt::format("anvil-ft-{}-{}", ::getpid(),
                                                    ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string put(const std::string& rel, const std::string& text) {
    const fs::path p = root_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p.string();
  }
  fs::path root_;
};

TEST_F(FinetuningFiles, SplitsAreFoundAsHuggingFaceFindsThem) {
  const std::string train = put("d/train.jsonl", ""), val = put("d/validation.jsonl", "");
  const std::string test = put("d/data/test-00000.jsonl", ""), dev = put("d/dev_extra.json", "");
  put("d/README.md", "");
  FinetuningConfig c;
  c.hf_name = (root_ / "d").string();
  EXPECT_EQ(finetuning_files(c, "train", "t"), std::vector<std::string>{train});
  EXPECT_EQ(finetuning_files(c, "validation", "t"), (std::vector<std::string>{dev, val}));
  EXPECT_EQ(finetuning_files(c, "val", "t"), (std::vector<std::string>{dev, val}));
  EXPECT_EQ(finetuning_files(c, "test", "t"), std::vector<std::string>{test});
  EXPECT_EQ(finetuning_splits(c.hf_name), (std::vector<std::string>{"test", "train", "validation"}));
  // hf_name json with data_dir, or data_files.
  FinetuningConfig j;
  j.hf_name = "json";
  j.data_dir = c.hf_name;
  EXPECT_EQ(finetuning_files(j, "train", "t"), std::vector<std::string>{train});
  j.data_dir.clear();
  j.data_files = {val};
  EXPECT_EQ(finetuning_files(j, "anything", "t"), std::vector<std::string>{val});
  // Files naming no split are all train; a single file is the split asked for.
  const std::string a = put("plain/a.jsonl", ""), b = put("plain/b.jsonl", "");
  c.hf_name = (root_ / "plain").string();
  EXPECT_EQ(finetuning_files(c, "train", "t"), (std::vector<std::string>{a, b}));
  EXPECT_THROW(finetuning_files(c, "validation", "t"), Error);
  c.hf_name = a;
  EXPECT_EQ(finetuning_files(c, "validation", "t"), std::vector<std::string>{a});
  c.hf_name = "tatsu-lab/alpaca";
  try {
    finetuning_files(c, "train", "t");
    ADD_FAILURE() << "a hub name was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not download"), std::string::npos) << e.what();
  }
  put("csv/train.csv", "");
  c.hf_name = (root_ / "csv").string();
  EXPECT_THROW(finetuning_files(c, "train", "t"), Error);
}

// Prepared turns read back through the loader as the stitched, shifted examples; every record
// that is not written is counted under its reason.
TEST_F(FinetuningFiles, PreparedRecordsAreCountedAndLoadAsExamples) {
  const std::unique_ptr<Tokenizer> tok = load_tokenizer("gpt2");
  const std::string long_prompt(400, 'x');
  const std::string records = put("r.jsonl", std::string(R"({"prompt": "Name a color.", "response": " Blue"})") + "\n" +
                                                 "\n" +  // blank lines are not records
                                                 R"({"prompt": "", "response": " empty prompt"})" + "\n" +
                                                 R"({"prompt": ")" + long_prompt + R"(", "response": " cut off"})" + "\n" +
                                                 R"({"messages": [{"role": "user", "content": "Hi"}, )"
                                                 R"({"role": "assistant", "content": "Hello"}]})" "\n");
  FinetuningPrepareOptions opt;
  opt.max_seq_len = 32;
  const FinetuningReport r = prepare_finetuning({records}, (root_ / "mds").string(), *tok, opt);
  EXPECT_EQ(r.records, 4);
  EXPECT_EQ(r.written, 2);
  EXPECT_EQ(r.empty, 1);
  EXPECT_EQ(r.no_target, 1);  // the long prompt leaves no response within 32 tokens
  EXPECT_EQ(r.malformed, 0);

  StreamingDataset data({{"ft", "", (root_ / "mds").string(), "", 1.0}}, StreamingOptions{});
  ASSERT_EQ(data.kind(), MdsSampleKind::kTurns);
  ASSERT_EQ(data.num_samples(), 2);
  const FinetuningExamples ex{TargetPolicy{}, tok->eos_id()};
  std::vector<int32_t> in(32), tg(32);
  load_example(data, 0, 32, 50257, ex, in.data(), tg.data());
  const std::vector<int32_t> prompt = tok->encode("Name a color."), response = tok->encode(" Blue");
  const size_t p = prompt.size(), n = p + response.size() + 1;
  for (size_t i = 0; i < 32; i++) {
    const int32_t want_in = i < p ? prompt[i] : i < n - 1 ? response[i - p] : i == n - 1 ? tok->eos_id() : 0;
    EXPECT_EQ(in[i], want_in) << i;
    const int32_t want_tg = i + 1 < p || i + 1 >= n ? I : i + 1 < n - 1 ? response[i + 1 - p] : tok->eos_id();
    EXPECT_EQ(tg[i], want_tg) << i;
  }
  // A token loader refuses turns, and a finetuning loader refuses token arrays.
  EXPECT_THROW(load_example(data, 0, 32, 50257, std::nullopt, in.data(), tg.data()), Error);

  // too_long: drop drops what truncate kept (none here: the long record has no target either
  // way), and a malformed record stops the preparation naming file and line unless skipped.
  const std::string bad = put("bad.jsonl", std::string(R"({"prompt": "a", "response": "b"})") + "\n" +
                                               R"({"messages": [{"role": "user", "content": "a"}, )"
                                               R"({"role": "robot", "content": "b"}]})" "\n" "{not json\n");
  try {
    prepare_finetuning({bad}, (root_ / "bad").string(), *tok, opt);
    ADD_FAILURE() << "a malformed record was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.jsonl:2: message 1: unknown role 'robot'"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(root_ / "bad"));
  opt.finetuning.skip_malformed = true;
  const FinetuningReport skipped = prepare_finetuning({bad}, (root_ / "bad").string(), *tok, opt);
  EXPECT_EQ(skipped.malformed, 2);
  EXPECT_EQ(skipped.written, 1);
  ASSERT_EQ(skipped.problems.size(), 2u);
  EXPECT_NE(skipped.problems[1].find("bad.jsonl:3: not valid JSON"), std::string::npos) << skipped.problems[1];

  const std::string longer = put("long.jsonl", R"({"prompt": "one two three four five six seven eight nine ten eleven twelve thirteen fourteen", "response": " fifteen sixteen seventeen eighteen nineteen twenty twenty-one twenty-two twenty-three"})" "\n");
  opt.max_seq_len = 24;
  EXPECT_EQ(prepare_finetuning({longer}, (root_ / "cut").string(), *tok, opt).truncated, 1);
  opt.finetuning.too_long = TooLong::kDrop;
  EXPECT_THROW(prepare_finetuning({longer}, (root_ / "dropped").string(), *tok, opt), Error);  // nothing left
}

}  // namespace
}  // namespace anvil
