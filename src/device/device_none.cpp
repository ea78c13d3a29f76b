// The device layer of a build without a GPU backend: every query answers "none", and using a
// device is an error that says how to get one.
#include "core/error.h"
#include "device/device.h"

namespace anvil {
namespace {
[[noreturn]] void not_built() {
  ANVIL_FAIL("this anvil was built without a GPU backend; build the cuda-release or hip-release preset "
             "(docs/gpu.md), or use kernels=cpu");
}
}  // namespace

bool gpu_backend_built() { return false; }
std::string gpu_backend_description() { return "none: built without a GPU backend"; }
std::vector<GpuInfo> gpu_devices() { return {}; }
void gpu_select(int) { not_built(); }
size_t gpu_free_bytes() { not_built(); }
std::string gpu_pci_bus_id() { not_built(); }
void* gpu_alloc(size_t) { not_built(); }
void gpu_release(void*) { not_built(); }
GpuAllocatorStats gpu_allocator_stats() { return {}; }
void* GpuScratch::get(size_t) { not_built(); }
void gpu_copy_to_device(void*, const void*, size_t) { not_built(); }
void gpu_copy_to_host(void*, const void*, size_t) { not_built(); }
void gpu_copy_on_device(void*, const void*, size_t) { not_built(); }
void gpu_zero(void*, size_t) { not_built(); }
void gpu_synchronize() { not_built(); }
void gpu_profiler_start() { not_built(); }
void gpu_profiler_stop() { not_built(); }
void gpu_use_comm_stream() { not_built(); }
void* gpu_timestamp() { not_built(); }
double gpu_elapsed_ms(void*, void*) { not_built(); }
void gpu_timestamp_release(void*) { not_built(); }
GpuMark gpu_mark_op_stream() { not_built(); }
void gpu_wait_mark(GpuMark) { not_built(); }

}  // namespace anvil
