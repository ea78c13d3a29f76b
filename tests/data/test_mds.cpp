// MDS writing and reading through the streaming dataset: round trips (plain and zstd, several
// shards, variable sample lengths), and every kind of damaged dataset giving an error that names
// the file. (Byte compatibility with an independent writer is test_mds_reference.sh.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fs.h"
#include "core/rng.h"
#include "data/mds.h"
#include "data/prepare.h"
#include "data/streaming.h"

namespace anvil {
namespace {
namespace fs = std::filesystem;

class MdsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / fmt::format("anvil-mds-{}-{}", ::getpid(),
                                                    ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // Samples of 1..300 tokens with values that exercise the whole int32 range.
  std::vector<std::vector<int32_t>> write(const std::string& name, const MdsWriterOptions& opt, int n) {
    std::vector<std::vector<int32_t>> samples;
    Rng rng(5, 1);
    const std::string dir = (root_ / name).string();
    fs::create_directories(dir);
    MdsWriter w(dir, opt);
    for (int i = 0; i < n; i++) {
      std::vector<int32_t> s(1 + rng.below(300));
      for (auto& t : s) t = static_cast<int32_t>(rng.next_u64());
      w.write_tokens(s.data(), static_cast<int64_t>(s.size()));
      samples.push_back(s);
    }
    w.finish();
    return samples;
  }

  std::string error_of(const std::string& dir, bool validate = true) {
    try {
      StreamingOptions o;
      o.validate_hash = validate;
      StreamingDataset d({{"t", "", dir, "", 1.0}}, o);
      std::vector<int32_t> buf(400);
      for (int64_t i = 0; i < d.num_samples(); i++) d.tokens(i, buf.data(), 400);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  fs::path root_;
};

TEST_F(MdsTest, RoundTripsPlainAndCompressedAcrossShards) {
  for (const auto& [compression, name] : {std::pair{"", "plain"}, std::pair{"zstd", "zstd"}, std::pair{"zstd:7", "zstd7"}}) {
    MdsWriterOptions opt;
    opt.compression = compression;
    opt.hashes = {"sha1", "xxh64"};
    opt.size_limit = 4000;
    const auto samples = write(name, opt, 200);
    StreamingDataset d({{"t", "", (root_ / name).string(), "", 1.0}}, StreamingOptions{});
    EXPECT_GT(d.index(0).shards.size(), 5u) << "the size limit should give several shards";
    ASSERT_EQ(d.num_samples(), 200);
    std::vector<int32_t> buf(400);
    for (int64_t i = 0; i < 200; i++) {
      const int64_t n = d.tokens(i, buf.data(), 400);
      ASSERT_EQ(n, static_cast<int64_t>(samples[i].size())) << compression << " sample " << i;
      EXPECT_TRUE(std::equal(samples[i].begin(), samples[i].end(), buf.begin())) << compression << " sample " << i;
    }
  }
}

TEST_F(MdsTest, ShardSizeLimitIsRespected) {
  MdsWriterOptions opt;
  opt.size_limit = 3000;
  write("ds", opt, 100);
  for (auto& e : fs::directory_iterator(root_ / "ds"))
    if (e.path().extension() == ".mds") {
      // A shard may exceed the limit only when it holds a single sample larger than the limit.
      EXPECT_LE(fs::file_size(e.path()), 3000u) << e.path();
    }
}

TEST_F(MdsTest, DamagedDatasetsAreClearErrors) {
  MdsWriterOptions opt;
  opt.hashes = {"xxh64"};
  opt.size_limit = 4000;
  write("ds", opt, 60);
  const std::string dir = (root_ / "ds").string();
  const std::string shard1 = dir + "/shard.00001.mds";
  const std::string original = read_file(shard1);

  // A truncated shard.
  fs::resize_file(shard1, original.size() - 10);
  std::string err = error_of(dir);
  EXPECT_NE(err.find(shard1), std::string::npos) << err;
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;

  // A wrong header ("magic"): caught by the hash, and without hash validation by the structure.
  std::string bad = original;
  bad[0] ^= 0x5a;
  write_file_atomic(shard1, bad);
  err = error_of(dir);
  EXPECT_NE(err.find(shard1), std::string::npos) << err;
  EXPECT_NE(err.find("corrupt"), std::string::npos) << err;
  err = error_of(dir, false);
  EXPECT_NE(err.find(shard1), std::string::npos) << err;
  EXPECT_NE(err.find("samples, the index says"), std::string::npos) << err;

  // Bytes of the embedded config replaced: not an MDS shard.
  bad = original;
  uint32_t first;
  std::memcpy(&first, bad.data() + 4, 4);  // sample 0 starts where the config ends
  bad[first - 5] = '#';
  write_file_atomic(shard1, bad);
  err = error_of(dir, false);
  EXPECT_NE(err.find(shard1), std::string::npos) << err;
  EXPECT_NE(err.find("not an MDS shard"), std::string::npos) << err;

  // An index that disagrees with its shard.
  write_file_atomic(shard1, original);
  const std::string index = read_file(dir + "/index.json");
  std::string edited = index;
  const size_t at = edited.find("\"samples\": ", edited.find("shard.00001.mds"));
  ASSERT_NE(at, std::string::npos);
  edited.insert(at + 11, "1");
  write_file_atomic(dir + "/index.json", edited);
  err = error_of(dir, false);
  EXPECT_NE(err.find(shard1), std::string::npos) << err;
  EXPECT_NE(err.find("the index says"), std::string::npos) << err;
  write_file_atomic(dir + "/index.json", index);

  // A missing shard.
  fs::remove(shard1);
  err = error_of(dir);
  EXPECT_NE(err.find(shard1), std::string::npos) << err;
  EXPECT_NE(err.find("missing"), std::string::npos) << err;

  // Not an MDS dataset at all, and an index that is not MDS.
  err = error_of((root_ / "nope").string());
  EXPECT_NE(err.find("does not exist"), std::string::npos) << err;
  write_file_atomic(dir + "/index.json", "{\"version\": 1, \"shards\": []}");
  err = error_of(dir);
  EXPECT_NE(err.find(dir + "/index.json"), std::string::npos) << err;
  EXPECT_NE(err.find("MDS v2"), std::string::npos) << err;
  write_file_atomic(dir + "/index.json", "{\"version\": 2, \"shards\": []}");
  err = error_of(dir);
  EXPECT_NE(err.find("no samples"), std::string::npos) << err;
}

TEST_F(MdsTest, PrepareIsDeterministicAndRejectsEmptyInput) {
  fs::create_directories(root_ / "text");
  std::string doc;
  for (int i = 0; i < 400; i++) doc += fmt::format("Sentence number {} of a small corpus. ", i);
  write_file_atomic((root_ / "text/a.txt").string(), doc);
  write_file_atomic((root_ / "text/b.jsonl").string(),
                    "{\"text\": \"" + doc + "\"}\n{\"text\": \"second " + doc + "\", \"id\": 2}\n\n");
  PrepareOptions o;
  o.inputs = {(root_ / "text").string()};
  o.max_seq_len = 64;
  o.val_fraction = 0.34;
  o.out_dir = (root_ / "p1").string();
  const PrepareSummary s1 = prepare_dataset(o);
  EXPECT_EQ(s1.documents, 3);
  EXPECT_GT(s1.train_samples, 0);
  EXPECT_GT(s1.val_samples, 0);
  o.out_dir = (root_ / "p2").string();
  prepare_dataset(o);
  for (const char* f : {"train/index.json", "train/shard.00000.mds", "val/index.json", "val/shard.00000.mds"})
    EXPECT_EQ(read_file((root_ / "p1" / f).string()), read_file((root_ / "p2" / f).string())) << f;

  auto fails_with = [&](PrepareOptions p, const std::string& what) {
    try {
      prepare_dataset(p);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      EXPECT_FALSE(fs::exists(p.out_dir)) << "a failed prepare must leave nothing behind";
      return;
    }
    ADD_FAILURE() << "expected an error containing '" << what << "'";
  };
  write_file_atomic((root_ / "empty.txt").string(), "");
  PrepareOptions e = o;
  e.out_dir = (root_ / "p3").string();
  e.inputs = {(root_ / "empty.txt").string()};
  fails_with(e, "empty");
  write_file_atomic((root_ / "bad.jsonl").string(), "{\"text\": \"ok\"}\n{\"body\": \"x\"}\n");
  e.inputs = {(root_ / "bad.jsonl").string()};
  fails_with(e, "bad.jsonl:2");
  e.inputs = {(root_ / "missing").string()};
  fails_with(e, "does not exist");
  e.inputs = {(root_ / "text").string()};
  e.out_dir = (root_ / "p1").string();
  try {
    prepare_dataset(e);
    ADD_FAILURE() << "an existing output must be refused";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("already exists"), std::string::npos);
  }
}

}  // namespace
}  // namespace anvil
