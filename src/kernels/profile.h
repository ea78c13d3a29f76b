// Where a step's time goes, op by op, for `anvil bench train --profile`. Off by default (one flag
// test per op call); when on, every op called through the dispatcher is timed: wall clock around
// the call on the CPU, timestamp events on the op stream on the GPU (read when reported, so the
// timing does not serialise the GPU). An op called from inside another counts in the outer one;
// only the thread that started the profile is timed (the communication thread's additions
// overlap the step).
#pragma once
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "core/kernel_impl.h"

namespace anvil {

void op_profile_start();  // clears what was recorded and turns timing on
struct OpTime {
  std::string op;
  int64_t calls = 0;
  double ms = 0;
};
// Turns timing off and returns the time per op since op_profile_start, largest first.
std::vector<OpTime> op_profile_stop();

// Times the enclosing op call while profiling is on (the dispatcher puts one in every op).
class OpProfileScope {
 public:
  OpProfileScope(const char* op, KernelImpl impl) {
    if (enabled_.load(std::memory_order_relaxed)) begin(op, impl);
  }
  ~OpProfileScope() {
    if (counted_) end();
  }
  OpProfileScope(const OpProfileScope&) = delete;
  OpProfileScope& operator=(const OpProfileScope&) = delete;

 private:
  void begin(const char* op, KernelImpl impl);
  void end();
  static inline std::atomic<bool> enabled_ = false;
  friend void op_profile_start();
  friend std::vector<OpTime> op_profile_stop();
  bool counted_ = false;  // on the timed thread (nesting depth counted)
  bool active_ = false;   // the outermost op: timed
  const char* op_ = nullptr;
  double t0_ = 0;            // CPU: seconds
  void* start_ = nullptr;    // GPU: timestamp event
};

}  // namespace anvil
