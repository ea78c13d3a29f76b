// Streaming MDS datasets: one or more streams, each an MDS dataset that lives locally or on a
// remote (s3://, http(s)://, a path), read through a local cache directory. Shards are downloaded
// ahead of use by a background pool, verified against the index's hashes (re-downloaded once on a
// mismatch), decompressed, and placed atomically (temporary file, then rename). With a cache
// limit, the least recently used shards are evicted. Several processes on one node may share a
// cache directory: a shard is prepared under a file lock, and eviction of a shard another process
// has mapped is safe (its mapping stays valid).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "data/mds.h"
#include "data/remote.h"
#include "data/tokenizer.h"

namespace anvil {

struct StreamSource {
  std::string name;    // for messages and the resume state
  std::string remote;  // "" (local only), s3://..., http(s)://..., or a path to copy from
  std::string local;   // the dataset (local only) or the cache directory (with a remote)
  std::string split;   // a subdirectory of both, or ""
  double proportion = 1.0;
};

struct StreamingOptions {
  int64_t cache_limit = -1;  // bytes per stream cache; -1: unlimited
  RemoteOptions remote;
  int download_threads = 4;
  bool validate_hash = true;  // check shards against the index's hashes when first used
};

class Stream;

class StreamingDataset {
 public:
  StreamingDataset(std::vector<StreamSource> sources, StreamingOptions opt);
  ~StreamingDataset();
  StreamingDataset(const StreamingDataset&) = delete;
  StreamingDataset& operator=(const StreamingDataset&) = delete;

  int64_t num_samples() const { return total_; }
  int num_streams() const { return static_cast<int>(streams_.size()); }
  const StreamSource& source(int s) const;
  const MdsIndex& index(int s) const;
  // Which tokenizer made stream s, where its dataset records it (anvil data prepare does).
  const std::optional<TokenizerRecord>& tokenizer_record(int s) const;
  // Samples per shard for each stream, and proportions: the inputs of the order.
  std::vector<int64_t> shard_samples(int s) const;

  // What the samples hold (every stream holds the same kind).
  MdsSampleKind kind() const { return kind_; }
  // Decodes global sample `id`'s tokens into out (at most max_tokens); returns its length. kTokens.
  int64_t tokens(int64_t id, int32_t* out, int64_t max_tokens);
  // Global sample `id`'s json text. kTurns.
  std::string sample_json(int64_t id);
  // Queues the download of the shard holding `id` (returns at once).
  void prefetch(int64_t id);
  // Bytes downloaded so far, and the number of shards evicted (for reports and tests).
  int64_t bytes_downloaded() const;
  int64_t shards_evicted() const;

 private:
  std::pair<int, int64_t> locate(int64_t id, int64_t* shard) const;
  void download_loop();

  std::vector<std::unique_ptr<Stream>> streams_;
  std::vector<int64_t> stream_offset_;  // first global id of each stream
  int64_t total_ = 0;
  MdsSampleKind kind_ = MdsSampleKind::kTokens;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<int, int64_t>> queue_;  // (stream, shard) to download
  bool stop_ = false;
  std::vector<std::thread> pool_;
};

}  // namespace anvil
