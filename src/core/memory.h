// How much memory this process may still take (what sizes `device_train_microbatch_size: auto`),
// and memory for large tables read at random.
#pragma once
#include <cstddef>

namespace anvil {

// Bytes the kernel reports as available (MemAvailable), lowered to what the process's cgroup
// (memory.max - memory.current, cgroup v2) still allows when it sets a limit.
size_t available_memory_bytes();

// Memory for a large table that is filled once and then read at random (a tokenizer's
// vocabulary and merges, its word caches): from 2 MiB up, aligned to 2 MiB and marked for
// transparent huge pages (madvise), so that filling it takes one page fault per 2 MiB instead of
// one per 4 KiB and lookups miss the TLB less; below that, the heap's. Throws std::bad_alloc.
void* allocate_table_bytes(size_t bytes);
void release_table_bytes(void* p, size_t bytes);

template <class T>
struct TableAllocator {
  using value_type = T;
  TableAllocator() = default;
  template <class U>
  TableAllocator(const TableAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(allocate_table_bytes(n * sizeof(T))); }
  void deallocate(T* p, size_t n) { release_table_bytes(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const TableAllocator<U>&) const {
    return true;
  }
};

}  // namespace anvil
