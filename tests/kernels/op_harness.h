// The op harness: every op of src/kernels, on the backend a test binary is built for (the CPU
// kernels, the GPU kernels, or the GPU kernels on the emulated runtime), against the scalar
// reference, over one table of cases (tests/kernels/op_table.cpp).
//
// A case is a function that builds its inputs and outputs through an OpRun and calls the op
// once with ANVIL_RUN_OP. The harness runs it three times: on the reference, and twice on the
// backend under test, with arrays in that backend's memory. It then checks
//   - every output against the reference's, as the output's Check says;
//   - the backend's two runs give the same bits (no atomics, no uninitialised reads);
//   - no input was written (inputs are const in every op's contract);
// and outputs an op must overwrite start as NaN, so a value it fails to write shows.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "compare.h"
#include "core/dtype.h"
#include "core/kernel_impl.h"

namespace anvil::testing {

enum class Backend { kRef, kCpu, kGpu };
const char* backend_name(Backend b);

// How an output must agree with the reference's. Each field that is set applies.
struct Check {
  bool bits = false;                  // the reference's bits exactly
  bool bits_on_cpu = false;           // exactly on the CPU backend, as close otherwise
  Tolerance close{-1, -1};            // element-wise, when atol >= 0 (tests/compare.h)
  double rel_norm = -1;               // ||got - want|| / ||want|| <= rel_norm, when >= 0
  ComputeDtype values_of = ComputeDtype::kFp32;  // a 16-bit dtype: every value is one of it
  bool unspecified = false;           // the contract leaves the values open: only repeated
};
inline Check exact() { return Check{.bits = true}; }
inline Check close(Tolerance t) { return Check{.close = t}; }
inline Check norm(double rel) { return Check{.rel_norm = rel}; }
inline Check unspecified() { return Check{.unspecified = true}; }

// One run of a case on one backend: the arrays it made, where that backend keeps them.
class OpRun {
 public:
  explicit OpRun(Backend b) : backend_(b) {}
  ~OpRun();
  OpRun(const OpRun&) = delete;
  OpRun& operator=(const OpRun&) = delete;
  Backend backend() const { return backend_; }
  // The kernels the backend names, for what an op's context carries (MatmulContext).
  KernelImpl impl() const {
    return backend_ == Backend::kGpu   ? KernelImpl::kGpu
           : backend_ == Backend::kCpu ? KernelImpl::kCpu
                                       : KernelImpl::kRef;
  }

  // An input: a copy of host in this backend's memory, which the op must leave as it is.
  template <class T>
  const T* in(const char* name, const std::vector<T>& host) {
    return static_cast<const T*>(add(name, host.data(), host.size() * sizeof(T), Role::kInput, 0, {}));
  }
  // An output the op writes (=): starts as NaN.
  float* out(const char* name, size_t n, Check check) {
    return inout(name, std::vector<float>(n, std::nanf("")), check);
  }
  // An output the op reads first (+=, in place): starts as initial.
  template <class T>
  T* inout(const char* name, const std::vector<T>& initial, Check check) {
    const size_t real = std::is_same_v<T, float> || std::is_same_v<T, double> ? sizeof(T) : 0;
    return static_cast<T*>(add(name, initial.data(), initial.size() * sizeof(T), Role::kOutput, real, check));
  }
  // A value the op returns.
  void result(const char* name, double value, Check check);

  struct Array {
    std::string name;
    std::vector<unsigned char> initial;  // as given, host bytes
    void* data;                          // in the backend's memory
    size_t bytes;
    bool is_input;
    size_t real_bytes;  // of its values: float's or double's (checked as Check says); 0: integers (bits)
    Check check;
  };
  const std::vector<Array>& arrays() const { return arrays_; }
  struct Result {
    std::string name;
    double value;
    Check check;
  };
  const std::vector<Result>& results() const { return results_; }
  // The bytes an array holds now.
  std::vector<unsigned char> read(const Array& a) const;

 private:
  enum class Role { kInput, kOutput };
  void* add(const char* name, const void* host, size_t bytes, Role role, size_t real_bytes, Check check);
  Backend backend_;
  std::vector<Array> arrays_;
  std::vector<std::unique_ptr<unsigned char[]>> host_memory_;
  std::vector<Result> results_;
};

struct OpCase {
  std::string name;  // op and shape, as a test name: layernorm_forward_N5_C7
  std::function<void(OpRun&)> body;
};
inline void PrintTo(const OpCase& c, std::ostream* os) { *os << c.name; }

// Runs c on the reference and twice on backend b, with gtest failures for what differs.
void run_op_case(const OpCase& c, Backend b);

// Never called: a binary without GPU kernels never runs the GPU backend.
[[noreturn]] inline void no_gpu_kernels() { std::abort(); }

}  // namespace anvil::testing

// op(args...) on the backend run r is for: ref::op, cpu::op or gpu::op, the args being arrays
// from r's in/out/inout. Its value, for ops that return one.
#if defined(ANVIL_OP_TEST_GPU)
#define ANVIL_TEST_GPU_OP(op, ...) ::anvil::gpu::op(__VA_ARGS__)
#else
#define ANVIL_TEST_GPU_OP(op, ...) (::anvil::testing::no_gpu_kernels(), ::anvil::ref::op(__VA_ARGS__))
#endif
#define ANVIL_RUN_OP(r, op, ...)                                        \
  ((r).backend() == ::anvil::testing::Backend::kRef ? ::anvil::ref::op(__VA_ARGS__) \
   : (r).backend() == ::anvil::testing::Backend::kCpu ? ::anvil::cpu::op(__VA_ARGS__) \
                                                      : ANVIL_TEST_GPU_OP(op, __VA_ARGS__))
