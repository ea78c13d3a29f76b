// Streaming from real remotes on loopback (started by run.sh): S3 (s3rver) and HTTP (nginx) with
// cold and warm caches, eviction under a small cache limit, a corrupted cached shard, a corrupt
// remote copy, dropped connections, SigV4 signatures checked by a verifier, an unreachable and a
// silent remote, and several processes sharing one cache.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "core/fs.h"
#include "data/remote.h"
#include "data/streaming.h"

namespace anvil {
namespace {
namespace fs = std::filesystem;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  if (!v) throw std::runtime_error(std::string(name) + " is not set: run this test through tests/remote/run.sh");
  return v;
}

std::vector<std::vector<int32_t>> all_samples(StreamingDataset& d) {
  std::vector<std::vector<int32_t>> out;
  std::vector<int32_t> buf(128);
  for (int64_t i = 0; i < d.num_samples(); i++) {
    const int64_t n = d.tokens(i, buf.data(), 128);
    out.emplace_back(buf.begin(), buf.begin() + n);
  }
  return out;
}

class RemoteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cache_ = fmt::format("{}/cache-{}", env("ANVIL_TEST_TMP"),
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(cache_);
    setenv("S3_ENDPOINT_URL", env("ANVIL_TEST_S3_ENDPOINT").c_str(), 1);
    setenv("AWS_ACCESS_KEY_ID", "S3RVER", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "S3RVER", 1);
    setenv("AWS_REGION", "us-east-1", 1);
    StreamingDataset local({{"local", "", env("ANVIL_TEST_LOCAL"), "train", 1.0}}, StreamingOptions{});
    expected_ = all_samples(local);
  }
  StreamingOptions fast() const {
    StreamingOptions o;
    o.remote.retries = 3;
    o.remote.backoff_s = 0.05;
    o.remote.timeout_s = 10;
    return o;
  }
  std::string cache_;
  std::vector<std::vector<int32_t>> expected_;
};

TEST_F(RemoteTest, S3ColdThenWarmCache) {
  {
    StreamingDataset d({{"s3", "s3://anvil-test/data/ds", cache_, "train", 1.0}}, fast());
    EXPECT_EQ(all_samples(d), expected_);
    EXPECT_GT(d.bytes_downloaded(), 0);
    EXPECT_GT(d.index(0).shards.size(), 2u);
    ASSERT_TRUE(d.tokenizer_record(0).has_value()) << "the tokenizer record comes with the index";
    EXPECT_EQ(d.tokenizer_record(0)->name, "gpt2");
  }
  StreamingDataset warm({{"s3", "s3://anvil-test/data/ds", cache_, "train", 1.0}}, fast());
  EXPECT_EQ(all_samples(warm), expected_);
  EXPECT_EQ(warm.bytes_downloaded(), 0) << "a warm cache downloads no shard";
}

// Storing (checkpoints to save_folder): a file as one PUT, and one larger than a part as S3's
// multipart upload (three parts of 5 MiB, S3's smallest), each read back byte for byte; the same
// into a local directory; an http remote refuses to store.
TEST_F(RemoteTest, FilesAreStoredAndReadBack) {
  const std::string tmp = env("ANVIL_TEST_TMP");
  std::string big(12 << 20, '\0');
  for (size_t i = 0; i < big.size(); i++) big[i] = static_cast<char>((i * 2654435761u) >> 13);
  write_file_atomic(tmp + "/big.bin", big);
  write_file_atomic(tmp + "/small.txt", "step-00000003\n");
  RemoteOptions opt;
  opt.part_bytes = 5 << 20;
  for (const std::string& location : {std::string("s3://anvil-test/stored/run"), "file://" + tmp + "/stored-local"}) {
    std::unique_ptr<Remote> r = open_remote(location, opt);
    r->store(tmp + "/small.txt", "latest");
    r->store(tmp + "/big.bin", "step-00000003/shard.bin");
    r->fetch("latest", tmp + "/small.back");
    r->fetch("step-00000003/shard.bin", tmp + "/big.back");
    EXPECT_EQ(read_file(tmp + "/small.back", "test"), "step-00000003\n") << location;
    EXPECT_TRUE(read_file(tmp + "/big.back", "test") == big) << location;
  }
  try {
    open_remote(env("ANVIL_TEST_HTTP") + "/ds", opt)->store(tmp + "/small.txt", "latest");
    ADD_FAILURE() << "an http remote stored a file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("an http(s) remote is read-only"), std::string::npos) << e.what();
  }
}

// A reader that waits on a shard's download (training blocked on data) sees a progress bar of it
// once the wait passes a second; background downloads show none.
TEST_F(RemoteTest, ABlockingDownloadShowsItsProgress) {
  StreamingDataset d({{"slow", env("ANVIL_TEST_AUX") + "/slow/ds", cache_, "train", 1.0}}, fast());
  std::vector<int32_t> buf(128);
  ::testing::internal::CaptureStderr();
  d.tokens(0, buf.data(), 128);  // the first shard, 2.4 s away
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("download "), std::string::npos) << err;
  EXPECT_NE(err.find("shard.00000"), std::string::npos) << err;
}

TEST_F(RemoteTest, HttpEvictsUnderASmallCacheLimit) {
  StreamingOptions o = fast();
  int64_t largest = 0;
  {
    StreamingDataset probe({{"local", "", env("ANVIL_TEST_LOCAL"), "train", 1.0}}, StreamingOptions{});
    for (const auto& sh : probe.index(0).shards) largest = std::max(largest, sh.raw.bytes + sh.stored().bytes);
  }
  o.cache_limit = 2 * largest + 4096;
  StreamingDataset d({{"http", env("ANVIL_TEST_HTTP") + "/ds", cache_, "train", 1.0}}, o);
  EXPECT_EQ(all_samples(d), expected_);
  EXPECT_GT(d.shards_evicted(), 0);
  int64_t usage = 0;
  for (auto& e : fs::directory_iterator(cache_ + "/train"))
    if (e.is_regular_file()) usage += static_cast<int64_t>(e.file_size());
  EXPECT_LE(usage, o.cache_limit) << "the cache stays under its limit";
  // Reading again re-downloads evicted shards and still gives the same samples.
  EXPECT_EQ(all_samples(d), expected_);

  o.cache_limit = largest;  // cannot hold two shards
  EXPECT_THROW(StreamingDataset({{"http", env("ANVIL_TEST_HTTP") + "/ds", cache_ + "x", "train", 1.0}}, o), Error);
}

TEST_F(RemoteTest, CorruptCachedShardIsDownloadedAgain) {
  {
    StreamingDataset d({{"http", env("ANVIL_TEST_HTTP") + "/plain", cache_, "train", 1.0}}, fast());
    all_samples(d);
  }
  const std::string shard = cache_ + "/train/shard.00001.mds";
  std::string bytes = read_file(shard);
  bytes[bytes.size() / 2] ^= 0x01;
  write_file_atomic(shard, bytes);
  StreamingDataset d({{"http", env("ANVIL_TEST_HTTP") + "/plain", cache_, "train", 1.0}}, fast());
  StreamingDataset local({{"local", "", env("ANVIL_TEST_LOCAL_PLAIN"), "train", 1.0}}, StreamingOptions{});
  EXPECT_EQ(all_samples(d), all_samples(local));
  EXPECT_GT(d.bytes_downloaded(), 0) << "the corrupt shard must be fetched again";
}

TEST_F(RemoteTest, CorruptRemoteCopyIsAClearError) {
  StreamingDataset d({{"bad", env("ANVIL_TEST_AUX") + "/corrupt/ds", cache_, "train", 1.0}}, fast());
  try {
    all_samples(d);
    FAIL() << "a corrupt remote shard must be an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the remote copy of"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("is corrupt"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("/corrupt/ds/train/shard.0000"), std::string::npos) << e.what();
  }
  // The dataset's metadata (its index and tokenizer record) stays; no shard does.
  for (auto& e : fs::directory_iterator(cache_ + "/train"))
    EXPECT_TRUE(e.path().filename() == "index.json" || e.path().filename() == kTokenizerRecordFile ||
                e.path().filename() == ".anvil-locks")
        << "nothing corrupt may be left in the cache: " << e.path();
}

TEST_F(RemoteTest, DroppedConnectionsAreRetried) {
  StreamingDataset d({{"flaky", env("ANVIL_TEST_AUX") + "/flaky/ds", cache_, "train", 1.0}}, fast());
  EXPECT_EQ(all_samples(d), expected_);
  StreamingOptions no_retry = fast();
  no_retry.remote.retries = 0;
  EXPECT_THROW(StreamingDataset({{"flaky", env("ANVIL_TEST_AUX") + "/flaky/plain", cache_ + "2", "train", 1.0}},
                                no_retry), Error);
}

TEST_F(RemoteTest, SigV4SignaturesAreAccepted) {
  setenv("S3_ENDPOINT_URL", (env("ANVIL_TEST_AUX") + "/signed").c_str(), 1);
  setenv("AWS_ACCESS_KEY_ID", "ANVILTESTKEY", 1);
  setenv("AWS_SECRET_ACCESS_KEY", "anvil/test+secret", 1);
  {
    StreamingDataset d({{"signed", "s3://bucket/ds", cache_, "train", 1.0}}, fast());
    EXPECT_EQ(all_samples(d), expected_);
  }
  setenv("AWS_SECRET_ACCESS_KEY", "wrong", 1);
  try {
    StreamingDataset d({{"signed", "s3://bucket/ds", cache_ + "2", "train", 1.0}}, fast());
    FAIL() << "a wrong secret must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("HTTP 403 SignatureDoesNotMatch"), std::string::npos) << e.what();
  }
}

TEST_F(RemoteTest, UnreachableAndSilentRemotesFailInBoundedTime) {
  StreamingOptions o = fast();
  o.remote.retries = 2;
  o.remote.timeout_s = 1;
  for (const std::string& url : {std::string("http://127.0.0.1:1/ds"), env("ANVIL_TEST_HANG") + "/ds"}) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      StreamingDataset d({{"gone", url, cache_, "train", 1.0}}, o);
      ADD_FAILURE() << url << " should be an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(url + "/train/index.json"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("after 3 attempts"), std::string::npos) << e.what();
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, 8.0) << url << ": 3 attempts of at most 1 s plus backoff";
  }
  try {
    StreamingDataset d({{"missing", env("ANVIL_TEST_HTTP") + "/nothing-here", cache_, "train", 1.0}}, o);
    ADD_FAILURE() << "a missing remote dataset should be an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("HTTP 404"), std::string::npos) << e.what();
  }
}

TEST_F(RemoteTest, ProcessesShareOneCache) {
  std::vector<pid_t> kids;
  for (int k = 0; k < 4; k++) {
    const pid_t pid = fork();
    if (pid == 0) {
      int rc = 1;
      try {
        StreamingDataset d({{"s3", "s3://anvil-test/data/ds", cache_, "train", 1.0}}, fast());
        rc = all_samples(d) == expected_ ? 0 : 2;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "child: %s\n", e.what());
      }
      _exit(rc);
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "a process sharing the cache failed";
  }
  for (auto& e : fs::directory_iterator(cache_ + "/train"))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << "a temporary file was left: " << e.path();
}

}  // namespace
}  // namespace anvil
