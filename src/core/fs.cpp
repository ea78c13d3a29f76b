// File helpers. Atomic writes go through a pid-suffixed temporary in the same directory, so the
// rename never crosses file systems.
#include "core/fs.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace anvil {
namespace fs = std::filesystem;

std::string read_file(const std::string& path, std::string_view what) {
  FILE* f = std::fopen(path.c_str(), "rb");
  ANVIL_CHECK(f, "cannot open {} '{}': {}", what, path, std::strerror(errno));
  // Read into a string sized once: growing it by doubling copied and page-faulted a large file
  // (a 9 MB tokenizer.json) several times over.
  std::string out;
  struct stat st;
  if (::fstat(::fileno(f), &st) == 0 && S_ISREG(st.st_mode)) out.resize(static_cast<size_t>(st.st_size));
  size_t have = std::fread(out.data(), 1, out.size(), f);
  out.resize(have);
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);  // a pipe, or a file that grew
  bool failed = std::ferror(f);
  std::fclose(f);
  ANVIL_CHECK(!failed, "error reading {} '{}'", what, path);
  return out;
}

MappedFile::MappedFile(const std::string& path, std::string_view what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ANVIL_CHECK(fd >= 0, "cannot open {} '{}': {}", what, path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    ANVIL_FAIL("{} '{}' is not a regular file", what, path);
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);
    ANVIL_CHECK(p != MAP_FAILED, "cannot map {} '{}': {}", what, path, std::strerror(err));
    data_ = p;
  } else {
    ::close(fd);
  }
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<void*>(data_), size_);
}

void make_dirs(const std::string& path) {
  std::error_code ec;
  fs::create_directories(path, ec);
  ANVIL_CHECK(!ec, "cannot create directory '{}': {}", path, ec.message());
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

void write_directory_atomic(const std::string& dir, const std::function<void(const std::string& tmp)>& build) {
  const fs::path out(dir);
  const std::string tmp =
      (out.parent_path() / fmt::format(".{}.tmp.{}", out.filename().string(), ::getpid())).string();
  try {
    build(tmp);
    if (fs::exists(out)) fs::remove(out);  // empty: remove() refuses anything else
    fs::rename(tmp, out);
    fsync_dir(out.parent_path().string());
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  tmp_ = path_ + fmt::format(".tmp.{}", ::getpid());
  f_ = std::fopen(tmp_.c_str(), "wb");
  ANVIL_CHECK(f_, "cannot create '{}': {}", tmp_, std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (f_) {
    std::fclose(f_);
    std::remove(tmp_.c_str());
  }
}

void AtomicFile::fail_write(int err) const {
  std::error_code ec;
  const fs::path dir = fs::path(path_).parent_path();
  const fs::space_info space = fs::space(dir.empty() ? fs::path(".") : dir, ec);
  const std::string free_now = ec ? "" : fmt::format(", {} bytes free there now", space.available);
  const std::string needed = expected_ > 0 ? fmt::format("; the file needs {} bytes", expected_)
                                           : fmt::format("; {} bytes were written", written_);
  ANVIL_FAIL("cannot write '{}': {}{}{}", path_, std::strerror(err), needed, free_now);
}

void AtomicFile::write(const void* data, size_t bytes) {
  ANVIL_CHECK(f_, "write to '{}' after commit", path_);
  if (std::fwrite(data, 1, bytes, f_) != bytes) fail_write(errno);
  written_ += bytes;
}

void AtomicFile::commit() {
  ANVIL_CHECK(f_, "'{}' committed twice", path_);
  bool ok = std::fflush(f_) == 0 && ::fsync(fileno(f_)) == 0;
  int err = errno;
  ok = (std::fclose(f_) == 0) && ok;
  f_ = nullptr;
  if (!ok) {
    std::remove(tmp_.c_str());
    fail_write(err);
  }
  ANVIL_CHECK(std::rename(tmp_.c_str(), path_.c_str()) == 0, "cannot rename '{}' to '{}': {}", tmp_,
              path_, std::strerror(errno));
  fsync_dir(fs::path(path_).parent_path().string());
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  AtomicFile f(path);
  f.write(bytes.data(), bytes.size());
  f.commit();
}

uint64_t hash64(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

std::string hex64(uint64_t v) { return fmt::format("{:016x}", v); }

}  // namespace anvil
