// The GEMM microkernel in portable C++ (std::fma per lane), for CPUs without AVX2+FMA: slow,
// but the same bits as the vector kernels.
#include <cmath>

#include "kernels/cpu/gemm_blocked.h"

namespace anvil::cpu {
namespace {

struct Portable {
  static constexpr int W = 8;
  struct Vec {
    float x[W];
  };
  static Vec zero() { return Vec{}; }
  static Vec load(const float* p) {
    Vec v;
    std::memcpy(v.x, p, sizeof v.x);
    return v;
  }
  static void store(float* p, const Vec& v) { std::memcpy(p, v.x, sizeof v.x); }
  static Vec add(const Vec& a, const Vec& b) {
    Vec c;
    for (int i = 0; i < W; i++) c.x[i] = a.x[i] + b.x[i];
    return c;
  }
  static Vec bcast(float s) {
    Vec v;
    for (float& e : v.x) e = s;
    return v;
  }
  static Vec fma(const Vec& a, const Vec& b, Vec c) {
    for (int i = 0; i < W; i++) c.x[i] = std::fma(a.x[i], b.x[i], c.x[i]);
    return c;
  }
};

}  // namespace

const GemmKernels& gemm_kernels_portable() {
  static const GemmKernels kernels{blocked_fp32<Portable, 4, 1>, nullptr};
  return kernels;
}

}  // namespace anvil::cpu
