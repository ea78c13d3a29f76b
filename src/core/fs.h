// Files: whole-file reads with clear errors, and atomic writes (temporary name, fsync, rename,
// fsync of the directory) so that a crash never leaves a half-written file under the final name.
#pragma once
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>

namespace anvil {

std::string read_file(const std::string& path, std::string_view what = "file");
void write_file_atomic(const std::string& path, std::string_view bytes);
void make_dirs(const std::string& path);
void fsync_dir(const std::string& dir);
// A directory built whole under a temporary name beside `dir` (build(tmp) creates and fills tmp;
// it may clear and refill it) and renamed into place, so that a failure or a crash never leaves a
// partial one under the final name. `dir` must not exist, or be empty.
void write_directory_atomic(const std::string& dir, const std::function<void(const std::string& tmp)>& build);

// A whole file mapped read-only: its bytes are read where the page cache holds them, without the
// copy (and the page faults of fresh memory) that read_file costs a large file.
class MappedFile {
 public:
  MappedFile(const std::string& path, std::string_view what = "file");
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  std::string_view bytes() const { return {static_cast<const char*>(data_), size_}; }

 private:
  const void* data_ = nullptr;
  size_t size_ = 0;
};

// A file built up in pieces and published atomically by commit(); dropped if never committed.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  void write(const void* data, size_t bytes);
  void commit();
  // The file's whole size, when known ahead: a full disk's error then says how much was needed.
  void expect_bytes(uint64_t total) { expected_ = total; }

 private:
  [[noreturn]] void fail_write(int err) const;
  std::string path_, tmp_;
  FILE* f_ = nullptr;
  uint64_t written_ = 0, expected_ = 0;
};

// xxHash3 (64-bit) of a byte range: the checksum of anvil's own files.
uint64_t hash64(const void* data, size_t bytes);
std::string hex64(uint64_t v);

}  // namespace anvil
