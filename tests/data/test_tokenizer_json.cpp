// tokenizer.json's rules where the published files used by test_tokenizer_json.sh do not reach
// them, checked on small tokenizers written here, with the Rust library's behaviour as the
// expectation (tokenizers' normalizers, pre_tokenizers, decoders and added_vocabulary.rs).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fs.h"
#include "data/tokenizer.h"

namespace anvil {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

class TokenizerJson : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("anvil-tokenizer-json-test." + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // A BPE tokenizer over `tokens` (ids in order) with `merges`, the rest of tokenizer.json given.
  std::unique_ptr<Tokenizer> make(const std::vector<std::string>& tokens, const json& merges, json rest) {
    json vocab = json::object();
    for (size_t i = 0; i < tokens.size(); i++) vocab[tokens[i]] = i;
    rest["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}};
    if (!rest.contains("added_tokens")) rest["added_tokens"] = json::array();
    write_file_atomic((dir_ / "tokenizer.json").string(), rest.dump());
    write_file_atomic((dir_ / "tokenizer_config.json").string(), json{{"eos_token", tokens.back()}}.dump());
    return load_tokenizer(dir_.string());
  }
  fs::path dir_;
};

// A regex that matches the empty string splits there (the onig crate keeps empty matches).
TEST_F(TokenizerJson, EmptyRegexMatchesSplit) {
  const json split = {{"type", "Split"}, {"pattern", {{"Regex", "(?=[A-Z])"}}}, {"behavior", "Isolated"}, {"invert", false}};
  auto tok = make({"a", "B", "c", "D", "e", "aB", "</s>"}, json::array({"a B"}), {{"pre_tokenizer", split}});
  EXPECT_EQ(tok->encode("aBcDe"), (std::vector<int32_t>{0, 1, 2, 3, 4}));  // "a|Bc|De": "a B" never meets
  auto whole = make({"a", "B", "c", "D", "e", "aB", "</s>"}, json::array({"a B"}), json::object());
  EXPECT_EQ(whole->encode("aBcDe"), (std::vector<int32_t>{5, 2, 3, 4}));
}

// Without a pre-tokenizer the whole text is one BPE word; anvil cuts it before each "▁" that
// follows another character only where no merge can join across that point, so the ids are the
// whole word's either way.
TEST_F(TokenizerJson, WholeTextWordIsCutOnlyWhereNoMergeJoinsASpace) {
  // "a▁" is a token: the merges join across "a|▁b", and the text must stay one word.
  auto joining = make({"a", "▁", "b", "a▁", "a▁b", "▁b", "</s>"}, json::array({"a ▁", "a▁ b", "▁ b"}), json::object());
  EXPECT_EQ(joining->encode("a▁ba▁b"), (std::vector<int32_t>{4, 4}));
  // No token holds "▁" after another character: cut or not, the ids are BPE's on the whole text.
  auto cut = make({"a", "▁", "b", "▁b", "▁▁", "</s>"}, json::array({"▁ b", "▁ ▁"}), json::object());
  EXPECT_EQ(cut->encode("a▁b▁▁b"), (std::vector<int32_t>{0, 3, 1, 3}));
  EXPECT_EQ(cut->encode("▁▁▁a▁b"), (std::vector<int32_t>{4, 1, 0, 3}));
}

// Matches are found up to 64 at a time (the pattern repeated in one call); a pattern whose
// repetition would read differently (a back-reference to the previous repetition's group) is
// matched one call at a time, and gives what the library gives: "aa", "bb", then "c" between.
TEST_F(TokenizerJson, SplitMatchesRunsOfMatchesAndBackReferences) {
  const json pairs = {{"type", "Split"}, {"pattern", {{"Regex", "(.)\\1"}}}, {"behavior", "Isolated"}, {"invert", false}};
  auto tok = make({"a", "b", "c", "aa", "bb", "</s>"}, json::array({"a a", "b b"}), {{"pre_tokenizer", pairs}});
  EXPECT_EQ(tok->encode("aabbcaab"), (std::vector<int32_t>{3, 4, 2, 3, 1}));
  // 200 words in one piece: runs of 64 matches, and text no match covers ("-": a run ends, the
  // next match is searched for) every seventh word.
  const json words = {{"type", "Split"}, {"pattern", {{"Regex", "[a-z]+| "}}}, {"behavior", "Isolated"}, {"invert", false}};
  auto w = make({"a", "b", " ", "-", "ab", "</s>"}, json::array({"a b"}), {{"pre_tokenizer", words}});
  std::string text;
  std::vector<int32_t> expected;
  for (int i = 0; i < 200; i++) {
    text += i % 7 == 6 ? "ab -" : "ab ";
    expected.insert(expected.end(), {4, 2});
    if (i % 7 == 6) expected.push_back(3);
  }
  EXPECT_EQ(w->encode(text), expected);
}

// Lowercase maps each character on its own: a final capital sigma becomes σ, not ς.
TEST_F(TokenizerJson, LowercaseHasNoFinalSigma) {
  auto tok = make({"ο", "δ", "σ", "ς", "</s>"}, json::array(), {{"normalizer", {{"type", "Lowercase"}}}});
  EXPECT_EQ(tok->encode("ΟΔΟΣ"), (std::vector<int32_t>{0, 1, 0, 2}));
}

// Digits splits at every numeric character (Rust's is_numeric), not only 0-9.
TEST_F(TokenizerJson, DigitsAreUnicodeNumerics) {
  auto tok = make({"a", "٣", "½", "a٣", "٣½", "</s>"}, json::array({"a ٣", "٣ ½"}),
                  {{"pre_tokenizer", {{"type", "Digits"}, {"individual_digits", true}}}});
  EXPECT_EQ(tok->encode("a٣½"), (std::vector<int32_t>{0, 1, 2}));
}

// A token marked normalized is matched in the normalized text, as the normalizer writes it.
TEST_F(TokenizerJson, NormalizedAddedTokensAreNormalizedFirst) {
  json added = json::array({{{"id", 3}, {"content", "HI"}, {"single_word", false}, {"lstrip", false},
                             {"rstrip", false}, {"normalized", true}, {"special", false}}});
  auto tok = make({"h", "i", "x", "hi-token", "</s>"}, json::array(),
                  {{"normalizer", {{"type", "Lowercase"}}}, {"added_tokens", added}});
  EXPECT_EQ(tok->encode("xHIx"), (std::vector<int32_t>{2, 3, 2}));
}

// The Metaspace decoder drops the replacement character everywhere in the first token when a
// prefix was prepended, and makes it a space elsewhere.
TEST_F(TokenizerJson, MetaspaceDecoderDropsTheFirstTokensReplacements) {
  const json ms = {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "always"}, {"split", true}};
  auto tok = make({"▁▁", "a", "▁b", "</s>"}, json::array(), {{"decoder", ms}});
  EXPECT_EQ(tok->decode({0, 1, 2}), "a b");
  EXPECT_EQ(tok->decode({1, 0, 2}), "a   b");
}

// Text that is not UTF-8 is read with one U+FFFD per maximal ill-formed subpart, as Python's
// errors="replace" reads it; byte-level decoding of a cut sequence gives one U+FFFD too.
TEST_F(TokenizerJson, InvalidUtf8IsOneReplacementPerMaximalSubpart) {
  std::vector<std::string> tokens;
  std::vector<std::string> chars(256);
  // GPT-2's byte characters, for a byte-level vocabulary of the 256 bytes.
  for (int b = 0, next = 256; b < 256; b++) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const int cp = printable ? b : next++;
    std::string utf8;
    if (cp < 0x80) utf8 += static_cast<char>(cp);
    else utf8 += static_cast<char>(0xC0 | cp >> 6), utf8 += static_cast<char>(0x80 | (cp & 0x3F));
    tokens.push_back(utf8);
  }
  tokens.push_back("</s>");
  const json bl = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  auto tok = make(tokens, json::array(), {{"pre_tokenizer", bl}, {"decoder", bl}});
  // E2 82 is a cut three-byte sequence: one U+FFFD (EF BF BD), then 'A'.
  EXPECT_EQ(tok->encode("\xE2\x82" "A"), (std::vector<int32_t>{0xEF, 0xBF, 0xBD, 'A'}));
  // ED A0 80 (a surrogate) is three ill-formed subparts.
  EXPECT_EQ(tok->encode("\xED\xA0\x80").size(), 9u);
  EXPECT_EQ(tok->decode({0xF0, 0x9F, 0x98, 'A'}), "\xEF\xBF\xBD" "A");
}

TEST_F(TokenizerJson, BadFilesAreClearErrors) {
  auto message = [&](const json& rest, const std::vector<std::string>& tokens = {"a", "</s>"}) {
    try {
      make(tokens, json::array(), rest);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const json empty_replacement = {{"type", "Metaspace"}, {"replacement", ""}, {"prepend_scheme", "always"}};
  EXPECT_NE(message({{"pre_tokenizer", empty_replacement}}).find("replacement must be one character"),
            std::string::npos);
  EXPECT_NE(message({{"added_tokens", json::array({{{"id", -5}, {"content", "<x>"}}})}}).find("has id -5"),
            std::string::npos);
  EXPECT_NE(message({{"decoder", {{"type", "WordPiece"}}}}).find("decoder type 'WordPiece' is not supported"),
            std::string::npos);
  EXPECT_NE(message({{"normalizer", {{"type", "Replace"}, {"pattern", 5}}}}).find("pattern must be"),
            std::string::npos);
}

}  // namespace
}  // namespace anvil
