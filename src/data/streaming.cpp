// Streams and their caches. A shard is "prepared" (present, complete, verified, decompressed) by
// whichever thread or process needs it first, under a per-shard file lock; everyone else waits for
// it and then finds it in place.
#include "data/streaming.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <optional>

#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "core/progress.h"

namespace anvil {
namespace fs = std::filesystem;
namespace {

// A shard download that a reader waits for (training blocked on data): after a second of
// waiting, a progress bar of its bytes, finished when the wait ends.
class DownloadWatch {
 public:
  DownloadWatch(std::string name, int64_t bytes)
      : name_(std::move(name)), bytes_(bytes), start_(std::chrono::steady_clock::now()) {}
  ~DownloadWatch() {
    if (bar_) bar_->finish(name_);
  }
  void update(int64_t done) {
    if (!bar_ && std::chrono::steady_clock::now() - start_ < std::chrono::seconds(1)) return;
    if (!bar_) bar_.emplace("download", bytes_, "B");
    bar_->update(done, name_);
  }

 private:
  std::string name_;
  int64_t bytes_;
  std::chrono::steady_clock::time_point start_;
  std::optional<Progress> bar_;
};

// An exclusive flock on a lock file, held for the object's lifetime. flock locks belong to the
// open file description, so threads of one process exclude each other too.
class FileLock {
 public:
  explicit FileLock(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    ANVIL_CHECK(fd_ >= 0, "cannot open lock file '{}': {}", path, std::strerror(errno));
    while (::flock(fd_, LOCK_EX) != 0) ANVIL_CHECK(errno == EINTR, "cannot lock '{}': {}", path, std::strerror(errno));
  }
  ~FileLock() { ::close(fd_); }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

int64_t file_size_or(const std::string& path, int64_t missing) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : missing;
}

// The cheapest hash the index recorded for a file, or none.
const std::pair<std::string, std::string>* pick_hash(const MdsFileInfo& f) {
  for (const char* algo : {"xxh3_64", "xxh128", "xxh64", "xxh32", "md5", "sha1", "sha256", "sha512"})
    for (const auto& h : f.hashes)
      if (h.first == algo) return &h;
  for (const auto& h : f.hashes)
    if (mds_hash_supported(h.first)) return &h;
  return nullptr;
}

// "" if data matches the file's recorded hash (or none is recorded), else what differs.
std::string hash_mismatch(const MdsFileInfo& f, std::string_view data) {
  if (static_cast<int64_t>(data.size()) != f.bytes)
    return fmt::format("{} bytes, the index says {}", data.size(), f.bytes);
  const auto* h = pick_hash(f);
  if (!h) return "";
  const std::string got = mds_hash(h->first, data.data(), data.size());
  return got == h->second ? "" : fmt::format("{} is {}, the index says {}", h->first, got, h->second);
}

std::string join_path(const std::string& a, const std::string& b) { return b.empty() ? a : a + "/" + b; }

}  // namespace

class Stream {
 public:
  Stream(StreamSource src, const StreamingOptions& opt) : src_(std::move(src)), opt_(opt) {
    if (!src_.remote.empty()) {
      remote_ = open_remote(src_.remote, opt_.remote);
      if (src_.local.empty())
        src_.local = (fs::temp_directory_path() / "anvil-cache" /
                      hex64(hash64(src_.remote.data(), src_.remote.size()))).string();
    }
    ANVIL_CHECK(!src_.local.empty(), "stream '{}': give `local` (a dataset directory) or `remote`", src_.name);
    dir_ = join_path(src_.local, src_.split);
    const std::string index_path = dir_ + "/index.json";
    if (remote_) {
      make_dirs(dir_ + "/.anvil-locks");
      FileLock lock(dir_ + "/.anvil-locks/index.lock");
      const std::string tmp = fmt::format("{}/.index.json.tmp.{}", dir_, ::getpid());
      remote_->fetch(join_path(src_.split, "index.json"), tmp);
      std::error_code ec;
      fs::rename(tmp, index_path, ec);
      ANVIL_CHECK(!ec, "cannot place '{}': {}", index_path, ec.message());
    } else {
      ANVIL_CHECK(fs::is_directory(dir_), "stream '{}': dataset directory '{}' does not exist", src_.name, dir_);
      ANVIL_CHECK(fs::exists(index_path), "'{}' has no index.json: not an MDS dataset (write one with `anvil data "
                  "prepare`)", dir_);
    }
    index_ = parse_mds_index(read_file(index_path, "MDS index"), index_path);
    if (remote_) fetch_tokenizer_record();
    tokenizer_record_ = read_tokenizer_record(dir_);
    ANVIL_CHECK(!index_.shards.empty() && index_.num_samples() > 0, "'{}' lists no samples (an empty dataset)",
                index_path);
    int64_t largest = 0;
    for (const auto& sh : index_.shards) {
      layouts_.push_back(mds_column_layout(sh, fmt::format("{} ({})", index_path, sh.raw.basename)));
      ANVIL_CHECK(layouts_.back().kind == layouts_.front().kind, "'{}': shard {} holds {}, shard {} holds {}: one "
                  "dataset holds one kind of sample", index_path, sh.raw.basename,
                  mds_sample_kind_name(layouts_.back().kind), index_.shards.front().raw.basename,
                  mds_sample_kind_name(layouts_.front().kind));
      largest = std::max(largest, sh.raw.bytes + (sh.zip ? sh.zip->bytes : 0));
    }
    if (remote_ && opt_.cache_limit > 0)
      ANVIL_CHECK(opt_.cache_limit >= 2 * largest, "cache_limit {} bytes is too small for '{}': its largest shard "
                  "needs {} bytes while it downloads, and at least two shards must fit", opt_.cache_limit,
                  src_.remote, largest);
    slots_.resize(index_.shards.size());
  }

  const StreamSource& source() const { return src_; }
  const std::optional<TokenizerRecord>& tokenizer_record() const { return tokenizer_record_; }
  const MdsIndex& index() const { return index_; }
  const MdsColumnLayout& layout(int64_t i) const { return layouts_[i]; }
  MdsSampleKind kind() const { return layouts_.front().kind; }

  bool ready(int64_t i) {
    std::lock_guard lk(mu_);
    return slots_[i].file != nullptr;
  }

  // The shard mapped, prepared first if need be. reader: a sample's reader waits for it (not a
  // background download), which a progress bar shows once the wait passes a second.
  std::shared_ptr<const MdsShardFile> shard(int64_t i, bool reader) {
    std::unique_lock lk(mu_);
    Slot& s = slots_[i];
    s.last_use = ++clock_;
    if (s.file) return s.file;
    std::optional<DownloadWatch> watch;
    if (reader && remote_) watch.emplace(index_.shards[i].stored().basename, index_.shards[i].stored().bytes);
    while (!cv_.wait_for(lk, std::chrono::milliseconds(250), [&] { return !s.busy; }))
      if (watch) watch->update(s.downloaded);
    if (s.file) return s.file;
    s.busy = true;
    s.downloaded = 0;
    lk.unlock();
    std::shared_ptr<const MdsShardFile> file;
    try {
      // Another process sharing the cache may evict the shard between its preparation and our
      // mapping; then prepare it again.
      const std::string path = dir_ + "/" + index_.shards[i].raw.basename;
      for (int attempt = 0; !file; attempt++) {
        prepare(i, watch ? &*watch : nullptr);
        if (attempt < 3 && !fs::exists(path)) continue;
        file = std::make_shared<const MdsShardFile>(path, index_.shards[i]);
      }
    } catch (...) {
      lk.lock();
      s.busy = false;
      cv_.notify_all();
      throw;
    }
    lk.lock();
    s.file = file;
    s.busy = false;
    mapped_.push_back(i);
    unmap_old_locked();
    cv_.notify_all();
    return file;
  }

  std::atomic<int64_t> bytes_downloaded{0}, shards_evicted{0};

 private:
  struct Slot {
    std::shared_ptr<const MdsShardFile> file;
    bool busy = false, verified = false;
    uint64_t last_use = 0;
    int64_t downloaded = 0;  // bytes of the download in progress, for a reader waiting on it
  };

  // The dataset's tokenizer record, where it has one: datasets written by other tools have none,
  // so a failed fetch only means there is nothing to compare.
  void fetch_tokenizer_record() {
    const std::string path = dir_ + "/" + kTokenizerRecordFile;
    const std::string tmp = fmt::format("{}/.{}.tmp.{}", dir_, kTokenizerRecordFile, ::getpid());
    try {
      remote_->fetch(join_path(src_.split, kTokenizerRecordFile), tmp);
      std::error_code ec;
      fs::rename(tmp, path, ec);
      ANVIL_CHECK(!ec, "cannot place '{}': {}", path, ec.message());
    } catch (const Error& e) {
      std::error_code ec;
      fs::remove(tmp, ec);
      log_file_only(fmt::format("stream '{}' has no tokenizer record ({})", src_.name, e.what()));
    }
  }

  // Keeps the number of mapped shards bounded: the least recently used ones no reader holds are
  // dropped (they map again on next use).
  void unmap_old_locked() {
    constexpr size_t kMaxMapped = 32;
    if (mapped_.size() <= kMaxMapped) return;
    std::sort(mapped_.begin(), mapped_.end(), [&](int64_t a, int64_t b) { return slots_[a].last_use < slots_[b].last_use; });
    std::vector<int64_t> keep;
    size_t excess = mapped_.size() - kMaxMapped;
    for (int64_t m : mapped_) {
      if (excess > 0 && slots_[m].file.use_count() == 1) {
        slots_[m].file.reset();
        excess--;
      } else {
        keep.push_back(m);
      }
    }
    mapped_ = std::move(keep);
  }

  // watch: a waiting reader's progress bar, fed with the download's bytes (may be null).
  void prepare(int64_t i, DownloadWatch* watch) {
    const MdsShardInfo& sh = index_.shards[i];
    const std::string raw_path = dir_ + "/" + sh.raw.basename;
    // A local dataset is only read (it may be read-only), unless a compressed shard must be
    // unpacked beside it; a cache is shared, so its shards are prepared under a lock.
    std::optional<FileLock> lock;
    if (remote_ || (sh.zip && file_size_or(raw_path, -1) != sh.raw.bytes)) {
      make_dirs(dir_ + "/.anvil-locks");
      lock.emplace(dir_ + "/.anvil-locks/" + sh.raw.basename + ".lock");
    }
    const int64_t have = file_size_or(raw_path, -1);
    if (have == sh.raw.bytes) {
      bool verified;
      {
        std::lock_guard lk(mu_);
        verified = slots_[i].verified;
      }
      if (verified || !opt_.validate_hash) return touch(raw_path);
      const std::string why = hash_mismatch(sh.raw, read_file(raw_path, "MDS shard"));
      if (why.empty()) return mark_verified(i), touch(raw_path);
      ANVIL_CHECK(remote_ != nullptr, "shard '{}' is corrupt: {}", raw_path, why);
      log_warn("cached shard '{}' is corrupt ({}); downloading it again", raw_path, why);
      fs::remove(raw_path);
    } else if (have >= 0) {
      ANVIL_CHECK(remote_ != nullptr, "shard '{}' is {} bytes, the index says {} (truncated or replaced)", raw_path,
                  have, sh.raw.bytes);
      fs::remove(raw_path);
    }
    if (!remote_) {
      ANVIL_CHECK(sh.zip.has_value(), "shard '{}' is missing (index.json lists it)", raw_path);
      const std::string zip_path = dir_ + "/" + sh.zip->basename;
      ANVIL_CHECK(fs::exists(zip_path), "shard '{}' is missing (index.json lists it; neither it nor '{}' exists)",
                  raw_path, sh.zip->basename);
      const std::string zip = read_file(zip_path, "compressed MDS shard");
      const std::string why = hash_mismatch(*sh.zip, zip);
      ANVIL_CHECK(why.empty(), "shard '{}' is corrupt: {}", zip_path, why);
      place_decompressed(sh, zip, raw_path, zip_path);
      return mark_verified(i), touch(raw_path);
    }
    const MdsFileInfo& stored = sh.stored();
    make_room(stored.bytes + (sh.zip ? sh.raw.bytes : 0), i);
    const std::string rel = join_path(src_.split, stored.basename);
    const std::string tmp = fmt::format("{}/.{}.tmp.{}.{}", dir_, stored.basename, ::getpid(), ::gettid());
    for (int attempt = 0;; attempt++) {
      remote_->fetch(rel, tmp, [&](int64_t bytes) {
        {
          std::lock_guard lk(mu_);
          slots_[i].downloaded = bytes;
        }
        if (watch) watch->update(bytes);
      });
      const std::string data = read_file(tmp, "downloaded shard");
      bytes_downloaded += static_cast<int64_t>(data.size());
      const std::string why = hash_mismatch(stored, data);
      if (!why.empty()) {
        fs::remove(tmp);
        ANVIL_CHECK(attempt == 0, "the remote copy of {} is corrupt: {} (downloaded twice)", remote_->url(rel), why);
        log_warn("downloaded {} is corrupt ({}); downloading it again", remote_->url(rel), why);
        continue;
      }
      if (sh.zip) {
        place_decompressed(sh, data, raw_path, remote_->url(rel));
        fs::remove(tmp);
      } else {
        std::error_code ec;
        fs::rename(tmp, raw_path, ec);
        ANVIL_CHECK(!ec, "cannot place '{}': {}", raw_path, ec.message());
        fsync_dir(dir_);
      }
      break;
    }
    mark_verified(i);
    touch(raw_path);
  }

  void place_decompressed(const MdsShardInfo& sh, std::string_view zip, const std::string& raw_path,
                          const std::string& where) {
    const std::string raw = mds_decompress(sh.compression, zip, sh.raw.bytes, where);
    const std::string why = hash_mismatch(sh.raw, raw);
    ANVIL_CHECK(why.empty(), "{} decompresses to data that does not match the index: {}", where, why);
    write_file_atomic(raw_path, raw);
  }

  void mark_verified(int64_t i) {
    std::lock_guard lk(mu_);
    slots_[i].verified = true;
  }

  static void touch(const std::string& path) { ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0); }

  // Evicts least recently used shards until `need` more bytes fit under the cache limit. Shards
  // being read or prepared in this process stay.
  void make_room(int64_t need, int64_t preparing) {
    if (opt_.cache_limit <= 0) return;
    FileLock lock(dir_ + "/.anvil-locks/cache.lock");
    struct Present {
      int64_t shard, bytes;
      timespec mtime;
    };
    std::vector<Present> present;
    int64_t usage = file_size_or(dir_ + "/index.json", 0);
    for (size_t k = 0; k < index_.shards.size(); k++) {
      int64_t bytes = 0;
      timespec mt{};
      for (const MdsFileInfo* f : {&index_.shards[k].raw, index_.shards[k].zip ? &*index_.shards[k].zip : nullptr}) {
        if (!f) continue;
        struct stat st {};
        if (::stat((dir_ + "/" + f->basename).c_str(), &st) == 0) bytes += st.st_size, mt = st.st_mtim;
      }
      if (bytes > 0) present.push_back({static_cast<int64_t>(k), bytes, mt});
      usage += bytes;
    }
    if (usage + need <= opt_.cache_limit) return;
    std::sort(present.begin(), present.end(), [](const Present& a, const Present& b) {
      return a.mtime.tv_sec != b.mtime.tv_sec ? a.mtime.tv_sec < b.mtime.tv_sec : a.mtime.tv_nsec < b.mtime.tv_nsec;
    });
    std::lock_guard lk(mu_);
    for (const Present& p : present) {
      if (usage + need <= opt_.cache_limit) break;
      Slot& s = slots_[p.shard];
      if (p.shard == preparing || s.busy || (s.file && s.file.use_count() > 1)) continue;
      s.file.reset();  // our mapping, if any; other processes' mappings survive the unlink
      s.verified = false;
      const MdsShardInfo& sh = index_.shards[p.shard];
      std::error_code ec;
      fs::remove(dir_ + "/" + sh.raw.basename, ec);
      if (sh.zip) fs::remove(dir_ + "/" + sh.zip->basename, ec);
      usage -= p.bytes;
      shards_evicted++;
    }
    mapped_.erase(std::remove_if(mapped_.begin(), mapped_.end(), [&](int64_t m) { return !slots_[m].file; }),
                  mapped_.end());
    if (usage + need > opt_.cache_limit)
      log_file_only(fmt::format("cache '{}' is over its limit ({} + {} > {} bytes): every shard left is in use", dir_,
                                usage, need, opt_.cache_limit));
  }

  StreamSource src_;
  StreamingOptions opt_;
  std::unique_ptr<Remote> remote_;
  std::string dir_;
  MdsIndex index_;
  std::optional<TokenizerRecord> tokenizer_record_;
  std::vector<MdsColumnLayout> layouts_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Slot> slots_;
  std::vector<int64_t> mapped_;
  uint64_t clock_ = 0;
};

StreamingDataset::StreamingDataset(std::vector<StreamSource> sources, StreamingOptions opt) {
  ANVIL_CHECK(!sources.empty(), "a dataset needs at least one stream");
  for (auto& src : sources) {
    stream_offset_.push_back(total_);
    streams_.push_back(std::make_unique<Stream>(std::move(src), opt));
    total_ += streams_.back()->index().num_samples();
    const Stream& first = *streams_.front();
    ANVIL_CHECK(streams_.back()->kind() == first.kind(), "stream '{}' holds {} and stream '{}' holds {}: the streams "
                "of one loader hold one kind of sample", streams_.back()->source().name,
                mds_sample_kind_name(streams_.back()->kind()), first.source().name, mds_sample_kind_name(first.kind()));
  }
  kind_ = streams_.front()->kind();
  for (int t = 0; t < std::max(1, opt.download_threads); t++) pool_.emplace_back([this] { download_loop(); });
}

StreamingDataset::~StreamingDataset() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : pool_) t.join();
}

const StreamSource& StreamingDataset::source(int s) const { return streams_[s]->source(); }
const MdsIndex& StreamingDataset::index(int s) const { return streams_[s]->index(); }

const std::optional<TokenizerRecord>& StreamingDataset::tokenizer_record(int s) const {
  return streams_[s]->tokenizer_record();
}

std::vector<int64_t> StreamingDataset::shard_samples(int s) const {
  std::vector<int64_t> v;
  for (const auto& sh : streams_[s]->index().shards) v.push_back(sh.samples);
  return v;
}

std::pair<int, int64_t> StreamingDataset::locate(int64_t id, int64_t* shard) const {
  ANVIL_CHECK(id >= 0 && id < total_, "sample {} is out of range (the dataset has {})", id, total_);
  const int s = static_cast<int>(std::upper_bound(stream_offset_.begin(), stream_offset_.end(), id) -
                                 stream_offset_.begin()) - 1;
  int64_t local = id - stream_offset_[s];
  const auto& shards = streams_[s]->index().shards;
  for (size_t k = 0; k < shards.size(); k++) {
    if (local < shards[k].samples) {
      *shard = static_cast<int64_t>(k);
      return {s, local};
    }
    local -= shards[k].samples;
  }
  ANVIL_FAIL("internal: sample {} not found in stream {}", id, s);
}

int64_t StreamingDataset::tokens(int64_t id, int32_t* out, int64_t max_tokens) {
  int64_t shard = 0;
  const auto [s, local] = locate(id, &shard);
  const auto file = streams_[s]->shard(shard, /*reader=*/true);
  return file->tokens(local, streams_[s]->layout(shard), out, max_tokens);
}

std::string StreamingDataset::sample_json(int64_t id) {
  int64_t shard = 0;
  const auto [s, local] = locate(id, &shard);
  const auto file = streams_[s]->shard(shard, /*reader=*/true);
  const std::span<const uint8_t> col = file->column(local, streams_[s]->layout(shard));
  return {reinterpret_cast<const char*>(col.data()), col.size()};
}

void StreamingDataset::prefetch(int64_t id) {
  int64_t shard = 0;
  const auto [s, local] = locate(id, &shard);
  if (streams_[s]->ready(shard)) return;
  std::lock_guard lk(mu_);
  for (const auto& q : queue_)
    if (q.first == s && q.second == shard) return;
  queue_.emplace_back(s, shard);
  cv_.notify_one();
}

void StreamingDataset::download_loop() {
  for (;;) {
    std::pair<int, int64_t> job;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      job = queue_.front();
      queue_.pop_front();
    }
    try {
      streams_[job.first]->shard(job.second, /*reader=*/false);
    } catch (const std::exception& e) {
      // The reader that needs this shard prepares it again and reports the error itself.
      log_file_only(fmt::format("background download failed: {}", e.what()));
    }
  }
}

int64_t StreamingDataset::bytes_downloaded() const {
  int64_t n = 0;
  for (const auto& s : streams_) n += s->bytes_downloaded;
  return n;
}

int64_t StreamingDataset::shards_evicted() const {
  int64_t n = 0;
  for (const auto& s : streams_) n += s->shards_evicted;
  return n;
}

}  // namespace anvil
