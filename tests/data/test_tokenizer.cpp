// GPT-2 tokenizer: known ids, the pre-tokenising pattern on whitespace and contractions, lossless
// round trips of arbitrary bytes (invalid UTF-8 included), and clear errors for missing files.
// (The id-for-id comparison with the JavaScript reference on the Brown corpus is
// test_tokenizer_reference.sh.)
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "data/gpt2_tokenizer.h"

namespace anvil {
namespace {

Gpt2Tokenizer& tokenizer() {
  static Gpt2Tokenizer tok(default_tokenizer_dir());
  return tok;
}

TEST(Gpt2Tokenizer, KnownIds) {
  EXPECT_EQ(tokenizer().vocab_size(), 50257);
  EXPECT_EQ(tokenizer().eot_id(), 50256);
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
    Gpt2Tokenizer tok("/nonexistent/vocab");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/vocab/encoder.json"), std::string::npos) << e.what();
  }
  EXPECT_THROW(tokenizer().decode({50257}), Error);
}

}  // namespace
}  // namespace anvil
