// Op memory on the host or the GPU, as the kernel implementation says.
#include "kernels/buffer.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "device/device.h"

namespace anvil {
namespace {
bool on_gpu(KernelImpl impl) { return impl == KernelImpl::kGpu; }
}  // namespace

OpMemory& OpMemory::operator=(OpMemory&& o) noexcept {
  if (this != &o) {
    reset();
    p_ = o.p_;
    bytes_ = o.bytes_;
    gpu_ = o.gpu_;
    o.p_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void OpMemory::allocate_zeroed(KernelImpl impl, size_t bytes) {
  reset();
  if (bytes == 0) return;
  gpu_ = on_gpu(impl);
  if (gpu_) {
    p_ = gpu_alloc(bytes);
    gpu_zero(p_, bytes);
  } else {
    p_ = std::calloc(bytes, 1);
    if (!p_) throw std::bad_alloc();
  }
  bytes_ = bytes;
}

void OpMemory::reset() {
  if (!p_) return;
  if (gpu_)
    gpu_release(p_);
  else
    std::free(p_);
  p_ = nullptr;
  bytes_ = 0;
}

void op_copy_from_host(KernelImpl impl, void* dst, const void* src, size_t bytes) {
  if (on_gpu(impl))
    gpu_copy_to_device(dst, src, bytes);
  else if (bytes)
    std::memcpy(dst, src, bytes);
}

void op_copy_to_host(KernelImpl impl, void* dst, const void* src, size_t bytes) {
  if (on_gpu(impl))
    gpu_copy_to_host(dst, src, bytes);
  else if (bytes)
    std::memcpy(dst, src, bytes);
}

void op_copy(KernelImpl impl, void* dst, const void* src, size_t bytes) {
  if (on_gpu(impl))
    gpu_copy_on_device(dst, src, bytes);
  else if (bytes)
    std::memmove(dst, src, bytes);
}

void op_zero(KernelImpl impl, void* dst, size_t bytes) {
  if (on_gpu(impl))
    gpu_zero(dst, bytes);
  else if (bytes)
    std::memset(dst, 0, bytes);
}

}  // namespace anvil
