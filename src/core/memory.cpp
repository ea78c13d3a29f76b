#include "core/memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <new>
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"

namespace anvil {
namespace {

// The first number in a small text file, or -1 if there is none (missing file, "max").
long long read_number(const std::string& path) {
  std::ifstream in(path);
  long long v = -1;
  if (!(in >> v)) return -1;
  return v;
}

}  // namespace

size_t available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  long long kib = -1;
  for (std::string line; std::getline(meminfo, line);) {
    std::istringstream fields(line);
    if (fields >> key && key == "MemAvailable:" && fields >> kib) break;
    kib = -1;
  }
  ANVIL_CHECK(kib >= 0, "/proc/meminfo has no MemAvailable line: cannot tell how much memory is free (give "
              "memory_limit)");
  size_t bytes = static_cast<size_t>(kib) * 1024;
  // cgroup v2 at the root of the process's own hierarchy, as containers mount it.
  const long long max = read_number("/sys/fs/cgroup/memory.max"), used = read_number("/sys/fs/cgroup/memory.current");
  if (max > 0 && used >= 0) bytes = std::min(bytes, static_cast<size_t>(std::max(0LL, max - used)));
  return bytes;
}

namespace {
constexpr size_t kHugePage = size_t{2} << 20;
}  // namespace

void* allocate_table_bytes(size_t bytes) {
  if (bytes < kHugePage) return ::operator new(bytes);
  const size_t whole_pages = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* p = std::aligned_alloc(kHugePage, whole_pages);
  if (!p) throw std::bad_alloc();
  // Advice only: where the kernel has no transparent huge pages the memory is as any other.
  madvise(p, whole_pages, MADV_HUGEPAGE);
  return p;
}

void release_table_bytes(void* p, size_t bytes) {
  if (bytes < kHugePage)
    ::operator delete(p);
  else
    std::free(p);
}

}  // namespace anvil
