// Arrays the ops work on. They live where the kernel implementation runs: host memory under the
// ref and cpu kernels, GPU memory under gpu (chosen when the array is allocated). Code written
// against the ops moves data in and out of them only through the copies below, so the same model
// code runs on either.
#pragma once
#include <cstddef>
#include <cstdint>

namespace anvil {

class OpMemory {
 public:
  OpMemory() = default;
  ~OpMemory() { reset(); }
  OpMemory(const OpMemory&) = delete;
  OpMemory& operator=(const OpMemory&) = delete;
  OpMemory(OpMemory&& o) noexcept { *this = static_cast<OpMemory&&>(o); }
  OpMemory& operator=(OpMemory&& o) noexcept;
  // bytes of zeros, where the ops run now; the old contents are freed first.
  void allocate_zeroed(size_t bytes);
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
  void assign_zeros(size_t n) {
    mem_.allocate_zeroed(n * sizeof(T));
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
void op_copy_from_host(void* dst, const void* host_src, size_t bytes);
void op_copy_to_host(void* host_dst, const void* src, size_t bytes);  // returns when done
void op_copy(void* dst, const void* src, size_t bytes);
void op_zero(void* dst, size_t bytes);

}  // namespace anvil
