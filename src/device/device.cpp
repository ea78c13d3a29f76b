// The GPU device layer over the vendor runtime (device/runtime.h): device queries, the caching
// allocator, copies and the op stream.
#include "device/device.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

#include "core/error.h"
#include "device/stream.h"

namespace anvil {

void gpu_fail(const char* expr, const char* message, const char* file, int line) {
  throw_error(file, line, fmt::format("GPU call {} failed: {}", expr, message));
}

bool gpu_backend_built() { return true; }

std::string gpu_backend_description() {
  int runtime = 0, driver = 0;
  const bool have_runtime = gpuRuntimeGetVersion(&runtime) == gpuSuccess;
  const bool have_driver = gpuDriverGetVersion(&driver) == gpuSuccess;
  (void)gpuGetLastError();
#if defined(ANVIL_GPU_EMULATION)
  const char* name = "emulated";
#elif defined(ANVIL_HIP)
  const char* name = "HIP";
#else
  const char* name = "CUDA";
#endif
  return fmt::format("{} runtime {}.{}, driver {}", name, have_runtime ? runtime / 1000 : 0,
                     have_runtime ? (runtime % 1000) / 10 : 0,
                     have_driver && driver > 0 ? fmt::format("{}.{}", driver / 1000, (driver % 1000) / 10)
                                               : std::string("none"));
}

std::vector<GpuInfo> gpu_devices() {
  int n = 0;
  if (gpuGetDeviceCount(&n) != gpuSuccess) {
    (void)gpuGetLastError();  // no driver or no device: not an error for a query
    return {};
  }
  int current = 0;
  GPU_CHECK(gpuGetDevice(&current));
  std::vector<GpuInfo> out;
  for (int i = 0; i < n; i++) {
    gpuDeviceProp_t p{};
    GPU_CHECK(gpuGetDeviceProperties(&p, i));
    GpuInfo g;
    g.index = i;
    g.name = p.name;
#if defined(ANVIL_HIP) || defined(ANVIL_GPU_EMULATION)
    g.arch = p.gcnArchName;
#else
    g.arch = fmt::format("sm_{}{}", p.major, p.minor);
#endif
    g.total_bytes = p.totalGlobalMem;
    g.multiprocessors = p.multiProcessorCount;
    GPU_CHECK(gpuSetDevice(i));
    size_t free_bytes = 0, total = 0;
    GPU_CHECK(gpuMemGetInfo(&free_bytes, &total));
    g.free_bytes = free_bytes;
    out.push_back(g);
  }
  GPU_CHECK(gpuSetDevice(current));
  return out;
}

namespace {

// Host-to-device copies of up to kStagedCopyBytes (those inside a step: tokens, targets,
// positions, the embedding's touched rows) go through a ring of page-locked staging blocks: the
// caller's bytes are copied into the next block, the transfer is queued on the stream and the call
// returns, so the GPU is not stopped between a step's ops for the host to catch up. A block is
// reused once the event recorded after its last transfer has passed (kStagingBlocks copies later).
// Larger copies (weights, checkpoints, host collectives' results) wait for their transfer.
constexpr size_t kStagedCopyBytes = size_t{1} << 20;
constexpr int kStagingBlocks = 16;
struct StagingBlock {
  void* host = nullptr;
  gpuEvent_t done = nullptr;
};

struct DeviceState {
  int index = -1;
  gpuStream_t stream = nullptr, comm_stream = nullptr;
  std::mutex staging_mu;
  StagingBlock staging[kStagingBlocks];
  int next_staging = 0;
  std::mutex mu;
  std::map<size_t, std::vector<void*>> free_blocks;  // size class -> cached blocks
  std::unordered_map<void*, size_t> live;            // block -> size class
  GpuAllocatorStats stats;
};

DeviceState& state() {
  static DeviceState s;
  return s;
}

// The selected device, made current on the calling thread too: the runtime's current device is
// per thread, and the communication thread copies gradients as well.
DeviceState& selected() {
  DeviceState& s = state();
  if (s.index < 0) gpu_select(0);
  thread_local int current = -1;
  if (current != s.index) {
    GPU_CHECK(gpuSetDevice(s.index));
    current = s.index;
  }
  return s;
}

// Size classes: powers of two up to 1 MiB, then multiples of 2 MiB, so that buffers of similar
// size share blocks without wasting more than half of a small one or 2 MiB of a large one.
size_t size_class(size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (bytes <= (size_t{1} << 20)) {
    size_t c = 256;
    while (c < bytes) c <<= 1;
    return c;
  }
  const size_t step = size_t{2} << 20;
  return (bytes + step - 1) / step * step;
}

}  // namespace

void gpu_select(int index) {
  DeviceState& s = state();
  int n = 0;
  const gpuError_t err = gpuGetDeviceCount(&n);
  ANVIL_CHECK(err == gpuSuccess && n > 0, "no GPU is available to this process ({}); run with kernels=cpu, or "
              "on a machine with a GPU and its driver", err == gpuSuccess ? "0 devices" : gpuGetErrorString(err));
  ANVIL_CHECK(index >= 0 && index < n, "GPU {} does not exist: this process sees {} GPU(s)", index, n);
  if (s.index == index) return;
  ANVIL_CHECK(s.index < 0, "this process already uses GPU {}; one process drives one GPU", s.index);
  GPU_CHECK(gpuSetDevice(index));
  GPU_CHECK(gpuStreamCreateWithFlags(&s.stream, gpuStreamNonBlocking));
  s.index = index;
}

namespace {
thread_local bool t_comm_stream = false;  // this thread launches on the communication stream
}  // namespace

gpuStream_t gpu_stream() {
  DeviceState& s = selected();
  return t_comm_stream ? s.comm_stream : s.stream;
}

void gpu_use_comm_stream() {
  DeviceState& s = selected();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.comm_stream) GPU_CHECK(gpuStreamCreateWithFlags(&s.comm_stream, gpuStreamNonBlocking));
  }
  t_comm_stream = true;
}

GpuMark gpu_mark_op_stream() {
  DeviceState& s = selected();
  gpuEvent_t e = nullptr;
  GPU_CHECK(gpuEventCreateWithFlags(&e, gpuEventDisableTiming));
  GPU_CHECK(gpuEventRecord(e, s.stream));
  return GpuMark{e};
}

void* gpu_timestamp() {
  DeviceState& s = selected();
  gpuEvent_t e = nullptr;
  GPU_CHECK(gpuEventCreate(&e));
  GPU_CHECK(gpuEventRecord(e, s.stream));
  return e;
}

double gpu_elapsed_ms(void* start, void* end) {
  GPU_CHECK(gpuEventSynchronize(static_cast<gpuEvent_t>(end)));
  float ms = 0.0f;
  GPU_CHECK(gpuEventElapsedTime(&ms, static_cast<gpuEvent_t>(start), static_cast<gpuEvent_t>(end)));
  return ms;
}

void gpu_timestamp_release(void* stamp) { GPU_CHECK(gpuEventDestroy(static_cast<gpuEvent_t>(stamp))); }

void gpu_wait_mark(GpuMark mark) {
  gpuEvent_t e = static_cast<gpuEvent_t>(mark.event);
  GPU_CHECK(gpuStreamWaitEvent(gpu_stream(), e, 0));
  GPU_CHECK(gpuEventDestroy(e));  // released once the wait is done; the wait stays queued
}

std::string gpu_pci_bus_id() {
  const DeviceState& s = selected();
  char id[64] = {};
  GPU_CHECK(gpuDeviceGetPCIBusId(id, sizeof id, s.index));
  return id;
}

size_t gpu_free_bytes() {
  selected();
  size_t free_bytes = 0, total = 0;
  GPU_CHECK(gpuMemGetInfo(&free_bytes, &total));
  return free_bytes;
}

void* gpu_alloc(size_t bytes) {
  DeviceState& s = selected();
  const size_t cls = size_class(bytes);
  std::lock_guard<std::mutex> lock(s.mu);
  void* p = nullptr;
  auto it = s.free_blocks.find(cls);
  if (it != s.free_blocks.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    s.stats.cached -= cls;
  } else {
    gpuError_t err = gpuMalloc(&p, cls);
    if (err != gpuSuccess) {
      // Give the cached blocks back to the driver and try once more before reporting.
      (void)gpuGetLastError();
      GPU_CHECK(gpuStreamSynchronize(s.stream));
      for (auto& [c, blocks] : s.free_blocks)
        for (void* b : blocks) GPU_CHECK(gpuFree(b));
      s.free_blocks.clear();
      s.stats.cached = 0;
      err = gpuMalloc(&p, cls);
      if (err != gpuSuccess) {
        (void)gpuGetLastError();
        size_t free_bytes = 0, total = 0;
        (void)gpuMemGetInfo(&free_bytes, &total);
        ANVIL_FAIL("GPU out of memory: {:.1f} MiB requested, {:.1f} MiB in use by anvil, {:.1f} MiB free of {:.1f} "
                   "MiB; lower device_train_microbatch_size or use activation_checkpointing",
                   cls / 1048576.0, s.stats.in_use / 1048576.0, free_bytes / 1048576.0, total / 1048576.0);
      }
    }
    s.stats.device_mallocs++;
  }
  s.live[p] = cls;
  s.stats.in_use += cls;
  s.stats.peak_in_use = std::max(s.stats.peak_in_use, s.stats.in_use);
  return p;
}

void gpu_release(void* p) {
  if (!p) return;
  DeviceState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.live.find(p);
  ANVIL_CHECK(it != s.live.end(), "gpu_release of a pointer the allocator did not hand out");
  s.free_blocks[it->second].push_back(p);
  s.stats.in_use -= it->second;
  s.stats.cached += it->second;
  s.live.erase(it);
}

void* GpuScratch::get(size_t bytes) {
  if (bytes > bytes_) {
    gpu_release(p_);
    p_ = gpu_alloc(bytes);
    bytes_ = bytes;
  }
  return p_;
}

GpuAllocatorStats gpu_allocator_stats() {
  DeviceState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.stats;
}

void gpu_copy_to_device(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  DeviceState& s = selected();
  // The host buffer may be reused as soon as this returns: its bytes are staged, or the copy waits.
  if (bytes > kStagedCopyBytes) {
    GPU_CHECK(gpuMemcpyAsync(dst, src, bytes, gpuMemcpyHostToDevice, gpu_stream()));
    GPU_CHECK(gpuStreamSynchronize(gpu_stream()));
    return;
  }
  std::lock_guard<std::mutex> lock(s.staging_mu);
  StagingBlock& block = s.staging[s.next_staging];
  s.next_staging = (s.next_staging + 1) % kStagingBlocks;
  if (!block.host) {
    GPU_CHECK(gpuMallocHost(&block.host, kStagedCopyBytes));
    GPU_CHECK(gpuEventCreateWithFlags(&block.done, gpuEventDisableTiming));
  } else {
    GPU_CHECK(gpuEventSynchronize(block.done));
  }
  std::memcpy(block.host, src, bytes);
  GPU_CHECK(gpuMemcpyAsync(dst, block.host, bytes, gpuMemcpyHostToDevice, gpu_stream()));
  GPU_CHECK(gpuEventRecord(block.done, gpu_stream()));
}

void gpu_copy_to_host(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  GPU_CHECK(gpuMemcpyAsync(dst, src, bytes, gpuMemcpyDeviceToHost, gpu_stream()));
  GPU_CHECK(gpuStreamSynchronize(gpu_stream()));
}

void gpu_copy_on_device(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  GPU_CHECK(gpuMemcpyAsync(dst, src, bytes, gpuMemcpyDeviceToDevice, gpu_stream()));
}

void gpu_zero(void* dst, size_t bytes) {
  if (bytes == 0) return;
  GPU_CHECK(gpuMemsetAsync(dst, 0, bytes, gpu_stream()));
}

void gpu_synchronize() { GPU_CHECK(gpuStreamSynchronize(gpu_stream())); }
#if defined(ANVIL_HIP)
// HIP's hipProfilerStart/Stop are deprecated for roctracer's markers, a library anvil does not
// link: AMD's profilers see the whole run.
void gpu_profiler_start() {}
void gpu_profiler_stop() {}
#else
void gpu_profiler_start() { GPU_CHECK(gpuProfilerStart()); }
void gpu_profiler_stop() { GPU_CHECK(gpuProfilerStop()); }
#endif

}  // namespace anvil
