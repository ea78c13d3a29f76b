// A job queue on one thread, which data-parallel training issues its communication to, so that it
// overlaps the backward pass and runs in the same order on every rank.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "core/kernel_impl.h"
#include "device/device.h"

namespace anvil {

// Runs jobs on one thread, first in, first out. For a model on the GPU the thread launches on the
// communication stream (device/device.h): a job starts after the ops launched before it was
// submitted (they produced the data it reads and finished with the buffers it fills), and is
// done when its stream work is, so that waiting for its ticket orders what follows.
class CommThread {
 public:
  // impl: the kernels of the arrays the jobs move (kGpu: on the communication stream).
  explicit CommThread(KernelImpl impl);
  ~CommThread();
  uint64_t submit(std::function<void()> job);
  void wait(uint64_t ticket);  // rethrows a job's error
  void wait_all();

 private:
  void run();
  const bool gpu_;
  std::mutex mu_;
  std::condition_variable cv_;
  struct Job {
    uint64_t ticket;
    std::function<void()> run;
    GpuMark after;  // on the GPU
  };
  std::deque<Job> jobs_;
  uint64_t submitted_ = 0, finished_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace anvil
