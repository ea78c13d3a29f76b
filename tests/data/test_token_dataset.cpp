// `anvil data prepare` output and its reader: documents and splits, identical bytes for identical
// input, and a clear error for an empty corpus, an existing output, a truncated or corrupt shard,
// a wrong magic and a missing shard.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/fs.h"
#include "data/gpt2_tokenizer.h"
#include "data/token_dataset.h"

namespace anvil {
namespace {
namespace fs = std::filesystem;

class TokenDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("anvil_ds_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_ / "text/sub");
    for (int d = 0; d < 20; d++)
      std::ofstream(root_ / (d % 2 ? "text/sub" : "text") / ("doc" + std::to_string(100 + d) + ".txt"))
          << "Document " << d << " says hello to the world, again and again. " << std::string(d, 'x');
  }
  void TearDown() override { fs::remove_all(root_); }
  PrepareSummary prepare(const std::string& out, double val = 0.1) {
    PrepareOptions o;
    o.inputs = {(root_ / "text").string()};
    o.out_dir = (root_ / out).string();
    o.tokenizer_dir = default_tokenizer_dir();
    o.val_fraction = val;
    return prepare_token_dataset(o);
  }
  std::string error_loading(const std::string& dir) {
    try {
      TokenDataset d((root_ / dir).string(), "train");
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  }
  fs::path root_;
};

TEST_F(TokenDatasetTest, PreparesSplitsDeterministically) {
  PrepareSummary s = prepare("a");
  EXPECT_EQ(s.documents, 20);
  EXPECT_GT(s.val_tokens, 0);
  TokenDataset train((root_ / "a").string(), "train"), val((root_ / "a").string(), "val");
  EXPECT_EQ(train.num_tokens(), s.train_tokens);
  EXPECT_EQ(val.num_tokens(), s.val_tokens);
  // Sample i of length T is tokens [i·T, (i+1)·T), its targets the same shifted by one.
  std::vector<int32_t> in(8), tgt(8), whole(17), whole_tgt(17);
  train.sample(1, 8, in.data(), tgt.data());
  train.sample(0, 17, whole.data(), whole_tgt.data());
  EXPECT_EQ(in, std::vector<int32_t>(whole.begin() + 8, whole.begin() + 16));
  EXPECT_EQ(tgt, std::vector<int32_t>(whole.begin() + 9, whole.begin() + 17));
  prepare("b");
  EXPECT_EQ(read_file((root_ / "a/train-00000.tok").string()), read_file((root_ / "b/train-00000.tok").string()));
  EXPECT_EQ(read_file((root_ / "a/index.json").string()), read_file((root_ / "b/index.json").string()));
}

TEST_F(TokenDatasetTest, BadInputsAreClearErrors) {
  prepare("a");
  EXPECT_THROW(prepare("a"), Error);  // exists
  fs::create_directories(root_ / "empty");
  std::ofstream(root_ / "empty/blank.txt");
  PrepareOptions o{{(root_ / "empty").string()}, (root_ / "e").string(), default_tokenizer_dir()};
  try {
    prepare_token_dataset(o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("corpus is empty"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(root_ / "e"));  // nothing half-written

  const auto shard = root_ / "a/train-00000.tok";
  const std::string good = read_file(shard.string());
  fs::resize_file(shard, good.size() - 3);
  EXPECT_NE(error_loading("a").find("truncated"), std::string::npos);
  std::string bad = good;
  bad[good.size() - 1] ^= 1;
  std::ofstream(shard, std::ios::binary) << bad;
  EXPECT_NE(error_loading("a").find("corrupt"), std::string::npos);
  bad = good;
  bad[0] = 'X';
  std::ofstream(shard, std::ios::binary) << bad;
  EXPECT_NE(error_loading("a").find("bad magic"), std::string::npos);
  fs::remove(shard);
  EXPECT_NE(error_loading("a").find("train-00000.tok"), std::string::npos);
  EXPECT_NE(error_loading("nothing").find("no index.json"), std::string::npos);
}

}  // namespace
}  // namespace anvil
