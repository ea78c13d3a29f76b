// The emulated GPU runtime and the scheduler of emulated GPU threads (see emulation.h): one
// device whose memory is host memory, work done when issued, and the threads of a block as
// fibers (ucontext) switched at barriers.
#include "device/emulation.h"

#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <unordered_set>
#include <vector>

namespace anvil::emulation {

Position position;

namespace {

gpuError_t last_error = gpuSuccess;
int current_device = 0;

gpuError_t fail(gpuError_t e) {
  last_error = e;
  return e;
}

// ---- fibers

constexpr size_t kStackBytes = size_t{256} << 10;

enum class State { kRunnable, kAtBlockBarrier, kAtWarpBarrier, kDone };

struct Fiber {
  ucontext_t context;
  std::unique_ptr<char[]> stack;
  dim3 thread;
  State state = State::kRunnable;
};

// The block being run: its threads, which one runs, and who waits at which barrier.
struct BlockRun {
  const std::function<void()>* body = nullptr;
  ucontext_t scheduler;
  std::vector<Fiber> fibers;  // grown, never shrunk: their stacks are reused
  int threads = 0, current = 0, live = 0, at_block_barrier = 0;
  std::vector<int> warp_arrived;
  std::vector<uint64_t> exchange;  // a slot per thread for warp_exchange
  bool fibers_on = false;          // false: threads run as plain calls
  bool met_barrier = false;
};
BlockRun run;
std::mutex launch_mutex;  // one launch at a time: `position` and `run` are shared

void fiber_main() {
  (*run.body)();
  run.fibers[run.current].state = State::kDone;
  // Returning resumes the scheduler through uc_link.
}

dim3 thread_index(int t, dim3 block) {
  return dim3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y));
}

void resume(int t) {
  run.current = t;
  position.thread = run.fibers[t].thread;
  swapcontext(&run.scheduler, &run.fibers[t].context);
}

void yield_to_scheduler() { swapcontext(&run.fibers[run.current].context, &run.scheduler); }

// Frees the threads at a barrier once every thread of the block (of the warp) has reached it. A
// thread that ended before reaching it never will: as on a GPU, where a barrier must be reached
// by all or by none, the others wait for good, and run_block_on_fibers reports it.
void settle(bool finished) {
  if (finished) run.live--;
  if (run.at_block_barrier == run.threads) {
    for (int t = 0; t < run.threads; t++) run.fibers[t].state = State::kRunnable;
    run.at_block_barrier = 0;
  }
  for (size_t w = 0; w < run.warp_arrived.size(); w++) {
    const int first = static_cast<int>(w) * kWarpLanes, end = std::min(run.threads, first + kWarpLanes);
    if (run.warp_arrived[w] != end - first) continue;
    for (int t = first; t < end; t++) run.fibers[t].state = State::kRunnable;
    run.warp_arrived[w] = 0;
  }
}

// Runs thread t of the block as a fiber until it ends or waits at a barrier.
void start_fiber(int t, dim3 block) {
  Fiber& f = run.fibers[t];
  if (!f.stack) f.stack = std::make_unique<char[]>(kStackBytes);
  f.thread = thread_index(t, block);
  f.state = State::kRunnable;
  getcontext(&f.context);
  f.context.uc_stack.ss_sp = f.stack.get();
  f.context.uc_stack.ss_size = kStackBytes;
  f.context.uc_link = &run.scheduler;
  makecontext(&f.context, fiber_main, 0);
}

// The block's threads from `first` on started as fibers, and every fiber run until all have
// ended; false when some barrier is never reached. The sweeps alternate between ascending and
// descending thread order, so that a thread reading what another writes without a barrier between
// them reads it too early in one of the two, as it may on a GPU.
bool run_block_on_fibers(int first, dim3 block) {
  run.fibers_on = true;
  for (int t = first; t < run.threads; t++) start_fiber(t, block);
  bool progressed = true;
  for (bool descending = false; run.live > 0 && progressed; descending = !descending) {
    progressed = false;
    for (int i = 0; i < run.threads; i++) {
      const int t = descending ? run.threads - 1 - i : i;
      if (run.fibers[t].state != State::kRunnable) continue;
      resume(t);
      progressed = true;
      settle(run.fibers[t].state == State::kDone);
    }
  }
  run.fibers_on = false;
  return run.live == 0;
}

bool run_block(dim3 block) {
  const int warps = (run.threads + kWarpLanes - 1) / kWarpLanes;
  run.live = run.threads;
  run.at_block_barrier = 0;
  run.warp_arrived.assign(warps, 0);
  if (run.fibers.size() < static_cast<size_t>(run.threads)) run.fibers.resize(run.threads);
  run.exchange.assign(run.threads, 0);

  // Thread 0 on a fiber: if it ends without a barrier, the block is taken to have none, and the
  // others run as plain calls (a barrier met then is reported, not mis-run).
  run.met_barrier = false;
  run.fibers_on = true;
  start_fiber(0, block);
  resume(0);
  run.fibers_on = false;
  if (run.met_barrier) {
    settle(run.fibers[0].state == State::kDone);
    return run_block_on_fibers(1, block);
  }
  for (int t = 1; t < run.threads; t++) {
    position.thread = thread_index(t, block);
    (*run.body)();
    if (run.met_barrier) return false;
  }
  return true;
}

void arrive(State at) {
  run.met_barrier = true;
  if (!run.fibers_on) return;  // a plain call cannot wait: run_block reports it
  Fiber& f = run.fibers[run.current];
  f.state = at;
  if (at == State::kAtBlockBarrier)
    run.at_block_barrier++;
  else
    run.warp_arrived[run.current / kWarpLanes]++;
  yield_to_scheduler();
}

}  // namespace

void block_barrier() { arrive(State::kAtBlockBarrier); }
void warp_barrier() { arrive(State::kAtWarpBarrier); }

uint64_t warp_exchange(uint64_t bits, int source) {
  const int t = run.current;
  const int lane0 = t - t % kWarpLanes;
  run.exchange[t] = bits;
  warp_barrier();  // every lane has written
  const uint64_t got = run.exchange[std::min(lane0 + source, run.threads - 1)];
  warp_barrier();  // every lane has read before any writes again
  return got;
}

void run_grid(dim3 grid, dim3 block, const std::function<void()>& thread_body) {
  std::lock_guard<std::mutex> lock(launch_mutex);
  const unsigned long threads = static_cast<unsigned long>(block.x) * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535 || threads == 0 ||
      threads > 1024 || block.z > 64) {
    fail(gpuErrorInvalidConfiguration);
    return;
  }
  run.body = &thread_body;
  run.threads = static_cast<int>(threads);
  position.block_dim = block;
  position.grid_dim = grid;
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        position.block = dim3(x, y, z);
        if (!run_block(block)) {
          fail(gpuErrorBarrierNotReached);
          return;
        }
      }
}

}  // namespace anvil::emulation

using anvil::emulation::fail;

// ---- the runtime

namespace {

// The live allocations, never destroyed: what the caching allocator still holds at exit stays
// reachable (a GPU's memory goes with the process), and freeing a pointer twice is an error.
std::mutex allocations_mutex;
auto* const allocations = new std::unordered_set<void*>;

size_t host_memory_bytes() {
  return static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace

struct EmulatedStream {};
struct EmulatedEvent {
  std::chrono::steady_clock::time_point at;
};

const char* gpuGetErrorString(gpuError_t error) {
  switch (error) {
    case gpuSuccess: return "no error";
    case gpuErrorInvalidValue: return "invalid argument";
    case gpuErrorMemoryAllocation: return "out of memory";
    case gpuErrorInvalidConfiguration: return "invalid configuration argument";
    case gpuErrorNotReady: return "device not ready";
    case gpuErrorBarrierNotReached:
      return "a barrier was not reached by every thread of its block or warp (the kernel would hang on a GPU)";
  }
  return "unknown error";
}

gpuError_t gpuGetLastError() {
  const gpuError_t e = anvil::emulation::last_error;
  anvil::emulation::last_error = gpuSuccess;
  return e;
}

gpuError_t gpuGetDeviceCount(int* count) {
  *count = 1;
  return gpuSuccess;
}

gpuError_t gpuGetDeviceProperties(gpuDeviceProp_t* prop, int device) {
  if (device != 0) return fail(gpuErrorInvalidValue);
  *prop = gpuDeviceProp_t{};
  std::snprintf(prop->name, sizeof prop->name, "anvil GPU emulator (kernels on the CPU, %d-lane warps)",
                anvil::emulation::kWarpLanes);
  std::snprintf(prop->gcnArchName, sizeof prop->gcnArchName, "emulated");
  prop->totalGlobalMem = host_memory_bytes();
  prop->multiProcessorCount = 1;
  return gpuSuccess;
}

gpuError_t gpuSetDevice(int device) {
  if (device != 0) return fail(gpuErrorInvalidValue);
  anvil::emulation::current_device = device;
  return gpuSuccess;
}

gpuError_t gpuGetDevice(int* device) {
  *device = anvil::emulation::current_device;
  return gpuSuccess;
}

gpuError_t gpuDriverGetVersion(int* version) {
  *version = 0;
  return gpuSuccess;
}

gpuError_t gpuRuntimeGetVersion(int* version) {
  *version = 0;
  return gpuSuccess;
}

gpuError_t gpuMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  *total_bytes = host_memory_bytes();
  *free_bytes = static_cast<size_t>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return gpuSuccess;
}

gpuError_t gpuDeviceGetPCIBusId(char* id, int length, int device) {
  if (device != 0 || length < 1) return fail(gpuErrorInvalidValue);
  std::snprintf(id, static_cast<size_t>(length), "emulated:0");
  return gpuSuccess;
}

// Fresh memory holds all-ones bytes (NaN floats, -1 integers), not zeros: a kernel that reads
// what nobody wrote shows it, as on a GPU whose memory holds whatever was there before.
gpuError_t gpuMalloc(void** p, size_t bytes) {
  *p = std::aligned_alloc(256, (std::max<size_t>(bytes, 1) + 255) / 256 * 256);
  if (!*p) return fail(gpuErrorMemoryAllocation);
  std::memset(*p, 0xff, bytes);
  std::lock_guard<std::mutex> lock(allocations_mutex);
  allocations->insert(*p);
  return gpuSuccess;
}

gpuError_t gpuFree(void* p) {
  if (!p) return gpuSuccess;
  std::lock_guard<std::mutex> lock(allocations_mutex);
  if (allocations->erase(p) == 0) return fail(gpuErrorInvalidValue);
  std::free(p);
  return gpuSuccess;
}

gpuError_t gpuMemcpyAsync(void* dst, const void* src, size_t bytes, gpuMemcpyKind, gpuStream_t) {
  std::memmove(dst, src, bytes);
  return gpuSuccess;
}

gpuError_t gpuMemsetAsync(void* dst, int value, size_t bytes, gpuStream_t) {
  std::memset(dst, value, bytes);
  return gpuSuccess;
}

gpuError_t gpuStreamCreateWithFlags(gpuStream_t* stream, unsigned) {
  *stream = new EmulatedStream;
  return gpuSuccess;
}

gpuError_t gpuStreamDestroy(gpuStream_t stream) {
  delete stream;
  return gpuSuccess;
}

gpuError_t gpuStreamSynchronize(gpuStream_t) { return gpuSuccess; }
gpuError_t gpuStreamQuery(gpuStream_t) { return gpuSuccess; }
gpuError_t gpuStreamWaitEvent(gpuStream_t, gpuEvent_t, unsigned) { return gpuSuccess; }

gpuError_t gpuEventCreate(gpuEvent_t* event) {
  *event = new EmulatedEvent;
  return gpuSuccess;
}

gpuError_t gpuEventCreateWithFlags(gpuEvent_t* event, unsigned) { return gpuEventCreate(event); }

gpuError_t gpuEventDestroy(gpuEvent_t event) {
  delete event;
  return gpuSuccess;
}

gpuError_t gpuEventRecord(gpuEvent_t event, gpuStream_t) {
  event->at = std::chrono::steady_clock::now();
  return gpuSuccess;
}

gpuError_t gpuEventSynchronize(gpuEvent_t) { return gpuSuccess; }

gpuError_t gpuEventElapsedTime(float* ms, gpuEvent_t start, gpuEvent_t end) {
  *ms = std::chrono::duration<float, std::milli>(end->at - start->at).count();
  return gpuSuccess;
}
