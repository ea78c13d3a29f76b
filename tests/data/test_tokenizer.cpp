// GPT-2 tokenizer: known ids, the pre-tokenising pattern on whitespace and contractions, lossless
// round trips of arbitrary bytes (invalid UTF-8 included), and clear errors for missing files;
// tokenizer names: the file layouts a name resolves to, documents and prompts, dataset records.
// (The id-for-id comparisons with the references on the Brown corpus are
// test_tokenizer_reference.sh for GPT-2 and test_sentencepiece.sh for SentencePiece.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "core/rng.h"
#include "data/gpt2_tokenizer.h"
#include "data/tokenizer.h"

namespace anvil {
namespace {

namespace fs = std::filesystem;

Tokenizer& tokenizer() {
  static const std::unique_ptr<Tokenizer> tok = load_tokenizer("gpt2");
  return *tok;
}

TEST(Gpt2Tokenizer, KnownIds) {
  EXPECT_EQ(tokenizer().vocab_size(), 50257);
  EXPECT_EQ(tokenizer().eos_id(), 50256);
  EXPECT_EQ(tokenizer().bos_id(), -1);
  EXPECT_EQ(tokenizer().encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(tokenizer().encode(" the"), (std::vector<int32_t>{262}));
  EXPECT_EQ(tokenizer().encode("\n\n"), (std::vector<int32_t>{628}));
  EXPECT_TRUE(tokenizer().encode("").empty());
}

std::vector<std::string> pieces(const std::string& s) {
  std::vector<std::string> out;
  for (auto p : gpt2_pretokenize(s)) out.emplace_back(p);
  return out;
}

TEST(Gpt2Tokenizer, PretokenizerFollowsThePattern) {
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(pieces("it's they'll"), (V{"it", "'s", " they", "'ll"}));
  EXPECT_EQ(pieces("a  b"), (V{"a", " ", " b"}));            // the last space joins the word
  EXPECT_EQ(pieces("./.\n\n\n\nX"), (V{"./.", "\n\n\n", "\n", "X"}));
  EXPECT_EQ(pieces("end   "), (V{"end", "   "}));            // trailing run stays whole
  EXPECT_EQ(pieces("x 123 ?!"), (V{"x", " 123", " ?!"}));
  EXPECT_EQ(pieces("caf\xc3\xa9 \xe4\xb8\xad"), (V{"caf\xc3\xa9", " \xe4\xb8\xad"}));  // Unicode letters
  EXPECT_EQ(pieces("a\xff\xfe b"), (V{"a", "\xff\xfe", " b"}));  // invalid bytes: symbols
}

TEST(Gpt2Tokenizer, RoundTripsArbitraryBytes) {
  Rng rng(7, 0);
  for (int trial = 0; trial < 200; trial++) {
    std::string s(rng.below(200), '\0');
    for (char& c : s) {
      // Mix ASCII, whitespace and raw high bytes so that invalid UTF-8 is common.
      uint64_t kind = rng.below(4);
      c = static_cast<char>(kind == 0 ? rng.below(256) : kind == 1 ? " \n\t'"[rng.below(4)] : 'a' + rng.below(26));
    }
    ASSERT_EQ(tokenizer().decode(tokenizer().encode(s)), s) << "trial " << trial;
  }
  const std::string all_bytes = [] {
    std::string s;
    for (int b = 0; b < 256; b++) s += static_cast<char>(b);
    return s;
  }();
  EXPECT_EQ(tokenizer().decode(tokenizer().encode(all_bytes)), all_bytes);
}

TEST(Gpt2Tokenizer, MissingVocabularyIsAClearError) {
  try {
    load_tokenizer("/nonexistent/vocab");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'/nonexistent/vocab' is neither gpt2 nor a local tokenizer directory"),
              std::string::npos) << e.what();
  }
  EXPECT_THROW(tokenizer().decode({50257}), Error);
}

class TokenizerNames : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("anvil-tokenizer-test." + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

// transformers' file names for the same vocabulary give the same tokenizer, with the same identity.
TEST_F(TokenizerNames, TransformersFileNamesAreTheSameTokenizer) {
  const TokenizerFiles gpt2 = resolve_tokenizer("gpt2");
  fs::create_directories(path("hf"));
  fs::copy_file(gpt2.model, path("hf/vocab.json"));
  fs::copy_file(gpt2.merges, path("hf/merges.txt"));
  const std::unique_ptr<Tokenizer> hf = load_tokenizer(path("hf"));
  EXPECT_EQ(hf->files().kind, TokenizerKind::kGpt2Bpe);
  EXPECT_EQ(hf->files().sha256, gpt2.sha256);
  EXPECT_EQ(hf->files().name, path("hf"));
  const std::string text = "The jury said, in effect: \xc3\xa9t\xc3\xa9 \xff it's 1961.";
  EXPECT_EQ(hf->encode(text), tokenizer().encode(text));
  EXPECT_EQ(hf->record().vocab_size, 50257);
  // The identity is the vocabulary, not the file's layout: transformers writes the JSON its own way.
  write_file_atomic(path("hf/vocab.json"), nlohmann::json::parse(read_file(gpt2.model, "vocabulary")).dump(2));
  EXPECT_EQ(resolve_tokenizer(path("hf")).sha256, gpt2.sha256);

  // An end-of-text token named by tokenizer_config.json (here as transformers' AddedToken) is
  // the one documents end with, and it is part of the identity.
  write_file_atomic(path("hf/tokenizer_config.json"), R"({"eos_token": {"content": "!", "lstrip": false}})");
  const std::unique_ptr<Tokenizer> bang = load_tokenizer(path("hf"));
  EXPECT_EQ(bang->eos_id(), 0);  // "!" is GPT-2's token 0
  EXPECT_NE(bang->files().sha256, gpt2.sha256);
  EXPECT_EQ(bang->encode_document("Hi"), (std::vector<int32_t>{17250, 0}));
}

TEST_F(TokenizerNames, DocumentsAndPromptsAsGpt2Has) {
  EXPECT_EQ(tokenizer().encode_document("Hello world"), (std::vector<int32_t>{15496, 995, 50256}));
  EXPECT_TRUE(tokenizer().encode_document("").empty());  // no tokens: no document
  EXPECT_EQ(tokenizer().encode_prompt("Hello"), (std::vector<int32_t>{15496}));
  EXPECT_EQ(tokenizer().encode_prompt(""), (std::vector<int32_t>{50256}));  // a new document
}

TEST_F(TokenizerNames, RecordsRoundTripAndRejectMalformedFiles) {
  const TokenizerRecord r = tokenizer().record();
  EXPECT_EQ(r.name, "gpt2");
  EXPECT_EQ(r.kind, "gpt2_bpe");
  EXPECT_EQ(r.sha256.size(), 64u);
  const TokenizerRecord back = parse_tokenizer_record(tokenizer_record_json(r), "x");
  EXPECT_EQ(back.name, r.name);
  EXPECT_EQ(back.sha256, r.sha256);
  EXPECT_EQ(back.vocab_size, 50257);
  EXPECT_EQ(back.bos_id, -1);
  EXPECT_EQ(back.eos_id, 50256);
  EXPECT_FALSE(read_tokenizer_record(path("")).has_value());
  write_file_atomic(path(kTokenizerRecordFile), R"({"name": "gpt2"})");
  try {
    read_tokenizer_record(path(""));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a tokenizer record"), std::string::npos) << e.what();
  }
}

TEST_F(TokenizerNames, UnreadableNamesAreClearErrors) {
  auto message = [](const std::string& name) {
    try {
      load_tokenizer(name);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("meta-llama/Llama-2-7b-hf").find("does not download from the Hugging Face hub"), std::string::npos);
  // OpenAI's other GPT-2 sizes publish the same vocabulary.
  EXPECT_EQ(resolve_tokenizer("gpt2-xl").sha256, resolve_tokenizer("gpt2").sha256);
  EXPECT_EQ(resolve_tokenizer("openai-community/gpt2-medium").name, "gpt2");
  fs::create_directories(path("fast"));
  write_file_atomic(path("fast/tokenizer.json"), "{}");
  EXPECT_NE(message(path("fast")).find("is not a tokenizer.json (no \"model\")"), std::string::npos)
      << message(path("fast"));
  fs::create_directories(path("empty"));
  EXPECT_NE(message(path("empty")).find("or tokenizer.json (transformers' fast format)"), std::string::npos)
      << message(path("empty"));
  write_file_atomic(path("junk.model"), "not a protobuf");
  const std::string junk = message(path("junk.model"));
  EXPECT_TRUE(junk.find("is not a SentencePiece model") != std::string::npos ||
              (!sentencepiece_available() && junk.find("built without libsentencepiece") != std::string::npos))
      << junk;
}

}  // namespace
}  // namespace anvil
