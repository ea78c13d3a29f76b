#include "kernels/op_harness.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "device/device.h"
#include "kernels/round.h"

namespace anvil::testing {

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::kRef: return "ref";
    case Backend::kCpu: return "cpu";
    case Backend::kGpu: return "gpu";
  }
  return "?";
}

OpRun::~OpRun() {
  if (backend_ == Backend::kGpu)
    for (Array& a : arrays_) gpu_release(a.data);
}

void* OpRun::add(const char* name, const void* host, size_t bytes, Role role, size_t real_bytes, Check check) {
  Array a{name, {}, nullptr, bytes, role == Role::kInput, real_bytes, check};
  a.initial.assign(static_cast<const unsigned char*>(host), static_cast<const unsigned char*>(host) + bytes);
  if (backend_ == Backend::kGpu) {
    a.data = gpu_alloc(std::max<size_t>(bytes, 1));
    gpu_copy_to_device(a.data, host, bytes);
  } else {
    host_memory_.push_back(std::make_unique<unsigned char[]>(std::max<size_t>(bytes, 1)));
    a.data = host_memory_.back().get();
    std::memcpy(a.data, host, bytes);
  }
  arrays_.push_back(std::move(a));
  return arrays_.back().data;
}

void OpRun::result(const char* name, double value, Check check) { results_.push_back({name, value, check}); }

std::vector<unsigned char> OpRun::read(const Array& a) const {
  std::vector<unsigned char> h(a.bytes);
  if (backend_ == Backend::kGpu)
    gpu_copy_to_host(h.data(), a.data, a.bytes);
  else
    std::memcpy(h.data(), a.data, a.bytes);
  return h;
}

namespace {

struct Ran {
  std::vector<std::vector<unsigned char>> arrays;  // every array's bytes after the call
  std::vector<double> results;
};

Ran run_once(const OpCase& c, Backend b, std::vector<OpRun::Array>* arrays, std::vector<OpRun::Result>* results) {
  OpRun r(b);
  c.body(r);
  Ran ran;
  for (const OpRun::Array& a : r.arrays()) ran.arrays.push_back(r.read(a));
  for (const OpRun::Result& x : r.results()) ran.results.push_back(x.value);
  if (arrays) *arrays = r.arrays();
  if (results) *results = r.results();
  return ran;
}

// An array of floats (real_bytes 4) or doubles (8) as doubles.
std::vector<double> as_doubles(const std::vector<unsigned char>& bytes, size_t real_bytes) {
  std::vector<double> v(bytes.size() / real_bytes);
  for (size_t i = 0; i < v.size(); i++) {
    if (real_bytes == sizeof(double)) {
      std::memcpy(&v[i], bytes.data() + i * sizeof(double), sizeof(double));
    } else {
      float f;
      std::memcpy(&f, bytes.data() + i * sizeof(float), sizeof f);
      v[i] = f;
    }
  }
  return v;
}

// got against want, as check says; the failure names what and where.
::testing::AssertionResult agrees(const std::vector<double>& got, const std::vector<double>& want, const Check& check,
                                  Backend b) {
  const bool bits = check.bits || (check.bits_on_cpu && b == Backend::kCpu);
  if (bits) {
    // A NaN's payload is not the same on every processor (IEEE 754 leaves it open: x86 keeps the
    // operand's, NVIDIA's units give their canonical NaN), so NaN matches any NaN.
    for (size_t i = 0; i < got.size(); i++)
      if (std::memcmp(&got[i], &want[i], sizeof(double)) != 0 && !(std::isnan(got[i]) && std::isnan(want[i])))
        return ::testing::AssertionFailure() << "not the reference's bits: at " << i << " got " << got[i] << " want "
                                             << want[i];
    return ::testing::AssertionSuccess();
  }
  if (check.close.atol >= 0) {
    size_t bad = 0, worst = 0;
    double worst_excess = -1;
    for (size_t i = 0; i < got.size(); i++) {
      const double err = std::fabs(got[i] - want[i]), allowed = check.close.atol + check.close.rtol * std::fabs(want[i]);
      const bool ok = err <= allowed || (std::isnan(got[i]) && std::isnan(want[i]));
      if (ok) continue;
      bad++;
      const double excess = std::isnan(err) ? HUGE_VAL : err - allowed;
      if (excess > worst_excess) worst_excess = excess, worst = i;
    }
    if (bad)
      return ::testing::AssertionFailure() << bad << " of " << got.size() << " values out of tolerance (atol "
                                           << check.close.atol << ", rtol " << check.close.rtol << "); worst at "
                                           << worst << ": got " << got[worst] << " want " << want[worst];
  }
  if (check.rel_norm >= 0) {
    double num = 0, den = 0;
    for (size_t i = 0; i < got.size(); i++) num += (got[i] - want[i]) * (got[i] - want[i]), den += want[i] * want[i];
    const double e = den == 0 ? std::sqrt(num) : std::sqrt(num / den);
    if (!(e <= check.rel_norm))
      return ::testing::AssertionFailure() << "relative norm error " << e << " > " << check.rel_norm;
  }
  return ::testing::AssertionSuccess();
}

// Every value of v is one of dtype d (rounding it changes nothing).
::testing::AssertionResult values_of(const std::vector<double>& v, ComputeDtype d) {
  std::vector<float> f(v.begin(), v.end()), rounded = f;
  ref::round_to_dtype(rounded.data(), static_cast<long>(rounded.size()), d);
  for (size_t i = 0; i < f.size(); i++)
    if (std::memcmp(&f[i], &rounded[i], sizeof(float)) != 0)
      return ::testing::AssertionFailure() << "value " << i << " (" << f[i] << ") is not a " << dtype_name(d)
                                           << " value";
  return ::testing::AssertionSuccess();
}

}  // namespace

void run_op_case(const OpCase& c, Backend b) {
  std::vector<OpRun::Array> arrays;
  std::vector<OpRun::Result> results;
  const Ran want = run_once(c, Backend::kRef, &arrays, &results);
  const Ran got = run_once(c, b, nullptr, nullptr);
  const Ran again = run_once(c, b, nullptr, nullptr);
  ASSERT_EQ(got.arrays.size(), arrays.size());
  for (size_t k = 0; k < arrays.size(); k++) {
    const OpRun::Array& a = arrays[k];
    SCOPED_TRACE(::testing::Message() << (a.is_input ? "input " : "output ") << a.name << " on "
                                      << backend_name(b));
    EXPECT_TRUE(again.arrays[k] == got.arrays[k]) << "a second run gave other bits";
    if (a.check.unspecified) continue;
    if (a.is_input) {
      EXPECT_TRUE(got.arrays[k] == a.initial) << "the op wrote an input";
      EXPECT_TRUE(want.arrays[k] == a.initial) << "the reference wrote an input";
      continue;
    }
    if (!a.real_bytes) {  // integers and their sums: the reference's bits
      EXPECT_TRUE(got.arrays[k] == want.arrays[k]) << "not the reference's bits";
      continue;
    }
    const std::vector<double> g = as_doubles(got.arrays[k], a.real_bytes),
                              w = as_doubles(want.arrays[k], a.real_bytes);
    EXPECT_TRUE(agrees(g, w, a.check, b));
    if (a.check.values_of != ComputeDtype::kFp32) {
      EXPECT_TRUE(values_of(w, a.check.values_of)) << "the reference";
      EXPECT_TRUE(values_of(g, a.check.values_of));
    }
  }
  for (size_t k = 0; k < results.size(); k++) {
    SCOPED_TRACE(::testing::Message() << "result " << results[k].name << " on " << backend_name(b));
    EXPECT_TRUE(std::memcmp(&again.results[k], &got.results[k], sizeof(double)) == 0) << "a second run gave other bits";
    EXPECT_TRUE(agrees({got.results[k]}, {want.results[k]}, results[k].check, b));
  }
}

}  // namespace anvil::testing
