// The op profile; see profile.h.
#include "kernels/profile.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>

#include "device/device.h"

namespace anvil {
namespace {

struct Pending {
  const char* op;
  void* start;
  void* end;
};

struct State {
  std::map<std::string, OpTime> totals;
  std::vector<Pending> pending;  // GPU intervals not read yet
  int depth = 0;                 // nesting: only the outermost op is timed
  std::thread::id owner;         // the thread timed
};
State& state() {
  static State s;
  return s;
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

void add(const char* op, double ms) {
  OpTime& t = state().totals[op];
  t.op = op;
  t.calls++;
  t.ms += ms;
}

}  // namespace

void OpProfileScope::begin(const char* op, KernelImpl impl) {
  State& s = state();
  if (std::this_thread::get_id() != s.owner) return;
  counted_ = true;
  if (s.depth++ > 0) return;
  active_ = true;
  op_ = op;
  if (impl == KernelImpl::kGpu)
    start_ = gpu_timestamp();
  else
    t0_ = now_s();
}

void OpProfileScope::end() {
  State& s = state();
  s.depth--;
  if (!active_) return;
  if (start_)
    s.pending.push_back({op_, start_, gpu_timestamp()});
  else
    add(op_, 1e3 * (now_s() - t0_));
}

void op_profile_start() {
  State& s = state();
  for (const Pending& p : s.pending) {
    gpu_timestamp_release(p.start);
    gpu_timestamp_release(p.end);
  }
  s = State{};
  s.owner = std::this_thread::get_id();
  OpProfileScope::enabled_ = true;
}

std::vector<OpTime> op_profile_stop() {
  OpProfileScope::enabled_ = false;
  State& s = state();
  for (const Pending& p : s.pending) {
    add(p.op, gpu_elapsed_ms(p.start, p.end));
    gpu_timestamp_release(p.start);
    gpu_timestamp_release(p.end);
  }
  s.pending.clear();
  std::vector<OpTime> out;
  for (const auto& [name, t] : s.totals) out.push_back(t);
  std::sort(out.begin(), out.end(), [](const OpTime& a, const OpTime& b) { return a.ms > b.ms; });
  return out;
}

}  // namespace anvil
