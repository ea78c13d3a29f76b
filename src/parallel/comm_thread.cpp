// CommThread: see comm_thread.h.
#include "parallel/comm_thread.h"

namespace anvil {

CommThread::CommThread(KernelImpl impl) : gpu_(impl == KernelImpl::kGpu), thread_([this] { run(); }) {}

CommThread::~CommThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

uint64_t CommThread::submit(std::function<void()> job) {
  const GpuMark after = gpu_ ? gpu_mark_op_stream() : GpuMark{};
  std::lock_guard<std::mutex> lock(mu_);
  jobs_.push_back({++submitted_, std::move(job), after});
  cv_.notify_all();
  return submitted_;
}

void CommThread::wait(uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return finished_ >= ticket || error_; });
  if (error_) std::rethrow_exception(error_);
}

void CommThread::wait_all() {
  uint64_t last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last = submitted_;
  }
  wait(last);
}

void CommThread::run() {
  try {
    if (gpu_) gpu_use_comm_stream();
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::current_exception();
  }
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    bool failed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      failed = error_ != nullptr;
    }
    try {
      if (gpu_) gpu_wait_mark(job.after);
      if (!failed) job.run();  // after an error, later jobs are skipped: their inputs are wrong
      if (gpu_) gpu_synchronize();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      finished_ = job.ticket;
    }
    cv_.notify_all();
  }
}

}  // namespace anvil
