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

#include "device/device.h"

namespace anvil {

// Runs jobs on one thread, first in, first out. Under kernels=gpu the thread launches on the
// communication stream (device/device.h): a job starts after the ops launched before it was
// submitted (they produced the data it reads and finished with the buffers it fills), and is
// done when its stream work is, so that waiting for its ticket orders what follows.
class CommThread {
 public:
  CommThread();
  ~CommThread();
  uint64_t submit(std::function<void()> job);
  void wait(uint64_t ticket);  // rethrows a job's error
  void wait_all();

 private:
  void run();
  std::mutex mu_;
  std::condition_variable cv_;
  struct Job {
    uint64_t ticket;
    std::function<void()> run;
    GpuMark after;  // under kernels=gpu
  };
  std::deque<Job> jobs_;
  uint64_t submitted_ = 0, finished_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace anvil
