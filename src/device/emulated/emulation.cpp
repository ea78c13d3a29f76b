// The emulated GPU runtime and the scheduler of emulated GPU threads (see emulation.h): one
// device whose memory is host memory, work done when issued, and the threads of a block as
// fibers switched at barriers. A switch saves the callee-saved registers and swaps stacks (x86-64
// assembly below): a block of 512 threads crosses ~20 barriers, so switching must cost
// nanoseconds, not the two system calls of swapcontext.
#include "device/emulated/emulation.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#if !defined(__x86_64__)
#error "the GPU emulator's fiber switch is written for x86-64"
#endif

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

// switch_stack(&save, load): pushes the callee-saved registers and the floating-point control
// words, stores the stack pointer in save, takes load as the stack pointer and pops the same from
// it, returning where that stack last called switch_stack (or into a new fiber's entry).
extern "C" void anvil_emulation_switch_stack(void** save, void* load);
asm(R"(
  .text
  .globl anvil_emulation_switch_stack
  .type anvil_emulation_switch_stack, @function
anvil_emulation_switch_stack:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size anvil_emulation_switch_stack, .-anvil_emulation_switch_stack
)");

namespace anvil::emulation {

Position position;

namespace {

thread_local gpuError_t last_error = gpuSuccess;  // per thread, as the runtimes keep it
int current_device = 0;

gpuError_t fail(gpuError_t e) {
  last_error = e;
  return e;
}

// ---- fibers

constexpr size_t kStackBytes = size_t{256} << 10;

enum class State { kRunnable, kAtBlockBarrier, kAtWarpBarrier, kDone };

struct Fiber {
  void* sp = nullptr;  // the stack pointer it was switched away at
  std::unique_ptr<char[]> stack;
  dim3 thread;
  State state = State::kRunnable;
};

// The block being run: its threads, which one runs, and who waits at which barrier.
struct BlockRun {
  const std::function<void()>* body = nullptr;
  void* scheduler_sp = nullptr;
  const void* scheduler_stack = nullptr;  // its bounds, for AddressSanitizer
  size_t scheduler_stack_bytes = 0;
  std::vector<Fiber> fibers;  // grown, never shrunk: their stacks are reused
  int threads = 0, current = 0, live = 0, at_block_barrier = 0;
  std::vector<int> warp_arrived;
  std::vector<uint64_t> exchange;  // a slot per thread for warp_exchange
  std::vector<uint64_t> gathered;  // slots per thread for warp_gather
  bool fibers_on = false;          // false: threads run as plain calls
  bool met_barrier = false;
};
BlockRun run;
std::mutex launch_mutex;  // one launch at a time: `position` and `run` are shared

// AddressSanitizer follows the stack switches (it must know which stack is in use).
void* start_switch(const void* to_stack, size_t bytes, bool leaving_for_good) {
  void* fake_stack = nullptr;
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_start_switch_fiber(leaving_for_good ? nullptr : &fake_stack, to_stack, bytes);
#else
  (void)to_stack, (void)bytes, (void)leaving_for_good;
#endif
  return fake_stack;
}
void finish_switch(void* fake_stack, const void** from_stack = nullptr, size_t* from_bytes = nullptr) {
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_finish_switch_fiber(fake_stack, from_stack, from_bytes);
#else
  (void)fake_stack, (void)from_stack, (void)from_bytes;
#endif
}

// Where a new fiber starts (entered by switch_stack's ret); it runs the thread, then hands the
// stack back for good.
[[noreturn]] void fiber_entry() {
  finish_switch(nullptr, &run.scheduler_stack, &run.scheduler_stack_bytes);
  (*run.body)();
  Fiber& f = run.fibers[run.current];
  f.state = State::kDone;
  start_switch(run.scheduler_stack, run.scheduler_stack_bytes, true);
  anvil_emulation_switch_stack(&f.sp, run.scheduler_sp);
  __builtin_unreachable();
}

dim3 thread_index(int t, dim3 block) {
  return dim3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y));
}

void resume(int t) {
  run.current = t;
  Fiber& f = run.fibers[t];
  position.thread = f.thread;
  void* fake_stack = start_switch(f.stack.get(), kStackBytes, false);
  anvil_emulation_switch_stack(&run.scheduler_sp, f.sp);
  finish_switch(fake_stack);
}

void yield_to_scheduler() {
  Fiber& f = run.fibers[run.current];
  void* fake_stack = start_switch(run.scheduler_stack, run.scheduler_stack_bytes, false);
  anvil_emulation_switch_stack(&f.sp, run.scheduler_sp);
  finish_switch(fake_stack);
}

// Frees the threads at a barrier once every thread of the block (of the warp) has reached it. A
// thread that ended before reaching it never will: as on a GPU, where a barrier must be reached
// by all or by none, the others wait for good, and run_block_on_fibers reports it.
void settle(int t, bool finished) {
  if (finished) run.live--;
  if (run.at_block_barrier == run.threads) {
    for (int u = 0; u < run.threads; u++) run.fibers[u].state = State::kRunnable;
    run.at_block_barrier = 0;
  }
  // Only thread t moved: only its warp can have become complete.
  const int w = t / kWarpLanes, first = w * kWarpLanes, end = std::min(run.threads, first + kWarpLanes);
  if (run.warp_arrived[w] != end - first) return;
  for (int u = first; u < end; u++) run.fibers[u].state = State::kRunnable;
  run.warp_arrived[w] = 0;
}

// Makes thread t of the block a fiber ready to start: its stack holds what switch_stack pops, with
// fiber_entry as the return address (16-byte aligned as a call would leave it).
void start_fiber(int t, dim3 block) {
  Fiber& f = run.fibers[t];
  if (!f.stack) f.stack = std::make_unique<char[]>(kStackBytes);
#if defined(__SANITIZE_ADDRESS__)
  ASAN_UNPOISON_MEMORY_REGION(f.stack.get(), kStackBytes);  // a fiber abandoned at a barrier left frames
#endif
  f.thread = thread_index(t, block);
  f.state = State::kRunnable;
  auto top = (reinterpret_cast<uintptr_t>(f.stack.get()) + kStackBytes) & ~uintptr_t{15};
  auto* slot = reinterpret_cast<uint64_t*>(top) - 2;  // slot[0]: fiber_entry; slot[1]: a null frame
  slot[0] = reinterpret_cast<uint64_t>(&fiber_entry);
  slot[1] = 0;
  slot -= 6;  // rbp, rbx, r12-r15
  for (int r = 0; r < 6; r++) slot[r] = 0;
  slot -= 1;  // the control words, as this thread has them
  uint32_t mxcsr = 0;
  uint16_t x87 = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(x87));
  std::memcpy(slot, &mxcsr, 4);
  std::memcpy(reinterpret_cast<char*>(slot) + 4, &x87, 2);
  f.sp = slot;
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
      settle(t, run.fibers[t].state == State::kDone);
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
    settle(0, run.fibers[0].state == State::kDone);
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

void warp_gather(const uint64_t* mine, int words, uint64_t* all) {
  const int t = run.current;
  const int lane0 = t - t % kWarpLanes, lanes = std::min(kWarpLanes, run.threads - lane0);
  const size_t w = static_cast<size_t>(words);
  // The first lane to arrive grows the slots, before any lane of this round has written.
  if (run.gathered.size() < static_cast<size_t>(run.threads) * w) run.gathered.resize(static_cast<size_t>(run.threads) * w);
  std::copy(mine, mine + w, run.gathered.begin() + static_cast<ptrdiff_t>(t * w));
  warp_barrier();  // every lane has written
  std::copy(run.gathered.begin() + static_cast<ptrdiff_t>(lane0 * w),
            run.gathered.begin() + static_cast<ptrdiff_t>((lane0 + lanes) * w), all);
  warp_barrier();  // every lane has read before any writes again
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

// The live allocations (start -> bytes), never destroyed: what the caching allocator still holds
// at exit stays reachable (a GPU's memory goes with the process), and freeing a pointer twice is
// an error.
std::mutex allocations_mutex;
auto* const allocations = new std::map<uintptr_t, size_t>;

size_t host_memory_bytes() {
  return static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace

namespace anvil::emulation {

bool on_device(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(allocations_mutex);
  auto it = allocations->upper_bound(a);
  if (it == allocations->begin()) return false;
  --it;
  return a <= it->first + it->second;
}

void fail_illegal_address() { fail(gpuErrorIllegalAddress); }

}  // namespace anvil::emulation

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
    case gpuErrorIllegalAddress:
      return "an illegal memory access was encountered (a kernel argument points outside device memory)";
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
  allocations->emplace(reinterpret_cast<uintptr_t>(*p), bytes);
  return gpuSuccess;
}

gpuError_t gpuFree(void* p) {
  if (!p) return gpuSuccess;
  std::lock_guard<std::mutex> lock(allocations_mutex);
  if (allocations->erase(reinterpret_cast<uintptr_t>(p)) == 0) return fail(gpuErrorInvalidValue);
  std::free(p);
  return gpuSuccess;
}

gpuError_t gpuMallocHost(void** p, size_t bytes) {
  *p = std::malloc(bytes == 0 ? 1 : bytes);
  return *p ? gpuSuccess : fail(gpuErrorMemoryAllocation);
}

gpuError_t gpuFreeHost(void* p) {
  std::free(p);
  return gpuSuccess;
}

// The direction must match the pointers, as it must on a GPU without unified addressing.
gpuError_t gpuMemcpyAsync(void* dst, const void* src, size_t bytes, gpuMemcpyKind kind, gpuStream_t) {
  const bool dst_device = anvil::emulation::on_device(dst), src_device = anvil::emulation::on_device(src);
  const bool fits = kind == gpuMemcpyHostToDevice   ? dst_device && !src_device
                    : kind == gpuMemcpyDeviceToHost ? !dst_device && src_device
                                                    : dst_device && src_device;
  if (!fits) return fail(gpuErrorInvalidValue);
  std::memmove(dst, src, bytes);
  return gpuSuccess;
}

gpuError_t gpuMemsetAsync(void* dst, int value, size_t bytes, gpuStream_t) {
  if (!anvil::emulation::on_device(dst)) return fail(gpuErrorInvalidValue);
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
gpuError_t gpuProfilerStart() { return gpuSuccess; }
gpuError_t gpuProfilerStop() { return gpuSuccess; }
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
