// The GPU runtime's caching allocator (src/device). The GPU ops themselves are checked against
// the reference by the op table (tests/kernels/op_table.cpp), in the same binary. Without a GPU
// the test skips and says so; the CPU build runs it on the emulated runtime.
#include <gtest/gtest.h>

#include "device/device.h"

namespace anvil {
namespace {

// Once the sizes have been seen, the caching allocator serves them without the driver.
TEST(GpuAllocator, ReusesCachedBlocks) {
  if (gpu_devices().empty()) GTEST_SKIP() << "no GPU visible (" << gpu_backend_description() << ")";
  gpu_select(0);
  for (int i = 0; i < 3; i++) {
    void* a = gpu_alloc(1000);
    void* b = gpu_alloc(5 << 20);
    gpu_release(a);
    gpu_release(b);
  }
  const size_t before = gpu_allocator_stats().device_mallocs;
  for (int i = 0; i < 100; i++) {
    void* a = gpu_alloc(900);
    void* b = gpu_alloc(5 << 20);
    gpu_release(b);
    gpu_release(a);
  }
  EXPECT_EQ(gpu_allocator_stats().device_mallocs, before);
}

}  // namespace
}  // namespace anvil
