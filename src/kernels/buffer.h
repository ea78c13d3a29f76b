// Arrays the ops work on. They live where their kernel implementation runs: host memory under the
// ref and cpu kernels, GPU memory under gpu (named when the array is allocated). Code written
// against the ops moves data in and out of them only through the copies below, which name the
// implementation too, so the same model code runs on either.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/kernel_impl.h"

namespace anvil {

class OpMemory {
 public:
  OpMemory() = default;
  ~OpMemory() { reset(); }
  OpMemory(const OpMemory&) = delete;
  OpMemory& operator=(const OpMemory&) = delete;
  OpMemory(OpMemory&& o) noexcept { *this = static_cast<OpMemory&&>(o); }
  OpMemory& operator=(OpMemory&& o) noexcept;
  // bytes of zeros, where impl's ops run; the old contents are freed first.
  void allocate_zeroed(KernelImpl impl, size_t bytes);
  void reset();
  void* get() const { return p_; }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
  bool gpu_ = false;
};

template <class T>
class OpArray {
 public:
  void assign_zeros(KernelImpl impl, size_t n) {
    mem_.allocate_zeroed(impl, n * sizeof(T));
    n_ = n;
  }
  void reset() {
    mem_.reset();
    n_ = 0;
  }
  T* data() { return static_cast<T*>(mem_.get()); }
  const T* data() const { return static_cast<const T*>(mem_.get()); }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }

 private:
  OpMemory mem_;
  size_t n_ = 0;
};

// Copies between op memory and the host, and within op memory (plain memcpy / memset on the CPU).
void op_copy_from_host(KernelImpl impl, void* dst, const void* host_src, size_t bytes);
void op_copy_to_host(KernelImpl impl, void* host_dst, const void* src, size_t bytes);  // returns when done
void op_copy(KernelImpl impl, void* dst, const void* src, size_t bytes);
void op_zero(KernelImpl impl, void* dst, size_t bytes);

}  // namespace anvil
