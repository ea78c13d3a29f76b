// The GPU as the rest of anvil sees it: which devices there are, memory through a caching
// allocator (once warm, a training step never calls the driver's allocator), copies, and the one
// stream the ops run on. It builds everywhere: without a GPU backend every query answers "none"
// and asking for a device is a clear error.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace anvil {

struct GpuInfo {
  int index = 0;
  std::string name;
  std::string arch;  // "sm_90" (compute capability 9.0) or "gfx90a"
  size_t total_bytes = 0, free_bytes = 0;
  int multiprocessors = 0;
};

// Whether this build has a GPU backend, and which ("CUDA" or "HIP").
bool gpu_backend_built();
// "CUDA runtime 13.0, driver 13.0"; "none: built without a GPU backend" when not built.
std::string gpu_backend_description();
// Devices visible to this process (empty without a GPU, a driver, or a backend).
std::vector<GpuInfo> gpu_devices();
// The device this process uses from now on; an error naming what is missing when there is none.
void gpu_select(int index);
// The selected device's PCI address ("0000:19:00.0"): with the host name, which physical GPU a
// process drives, whatever CUDA_VISIBLE_DEVICES numbering it sees.
std::string gpu_pci_bus_id();
// Free memory on the selected device now, as the driver reports it (what anvil's allocator caches
// counts as used).
size_t gpu_free_bytes();

// Memory on the selected device, from the caching allocator: a block freed is kept for the next
// request of its size class. Blocks are allocated and freed by the thread that launches the ops,
// whose work runs in order on the op stream, so a block reused is never in use.
void* gpu_alloc(size_t bytes);
void gpu_release(void* p);
struct GpuAllocatorStats {
  size_t in_use = 0, cached = 0;  // bytes
  size_t peak_in_use = 0;         // the most in use at once
  size_t device_mallocs = 0;      // calls to the driver's allocator so far
};
GpuAllocatorStats gpu_allocator_stats();

// Device memory for an op's scratch: grows to the largest request and is kept, so that a warm
// step allocates nothing. Requests are in stream order, so a block handed back while growing is
// not reused before the work that read it has run.
class GpuScratch {
 public:
  void* get(size_t bytes);

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// Two streams: the op stream, where the ops and their copies run, and the communication stream,
// where a thread that called gpu_use_comm_stream (data parallelism's communication thread)
// launches its copies, additions and collectives, so that gradients are reduced while the
// backward pass goes on. Every launch and copy below goes to the calling thread's stream. Work
// crosses from one to the other through marks: taken on the op stream, waited for on the other.
void gpu_use_comm_stream();
struct GpuMark {
  void* event = nullptr;
};
// A point in the op stream: the ops launched before it have run (written what they write, read
// what they read) once it is passed.
GpuMark gpu_mark_op_stream();
// The calling thread's stream waits for the mark, which is then released.
void gpu_wait_mark(GpuMark mark);

// Timestamps on the op stream, for the op profile: an event recorded now; the milliseconds between
// two (waiting for the later one to pass); and the event's release.
void* gpu_timestamp();
double gpu_elapsed_ms(void* start, void* end);
void gpu_timestamp_release(void* stamp);

// Queued on the calling thread's stream; host_src may be reused on return (small copies are staged
// in page-locked memory and do not wait, larger ones wait for their transfer).
void gpu_copy_to_device(void* dst, const void* host_src, size_t bytes);
void gpu_copy_to_host(void* host_dst, const void* src, size_t bytes);  // returns when done
void gpu_copy_on_device(void* dst, const void* src, size_t bytes);
void gpu_zero(void* dst, size_t bytes);
void gpu_synchronize();  // the calling thread's stream
// Marks what NVIDIA's profilers collect (`ncu --profile-from-start off`,
// bench/gpu_kernel_times.sh): the work between start and stop. Nothing on AMD.
void gpu_profiler_start();
void gpu_profiler_stop();

}  // namespace anvil
