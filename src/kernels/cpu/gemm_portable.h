// A vector type for the GEMM templates (gemm_blocked.h) in portable C++: Width lanes, each
// computed on its own with std::fma. The portable kernel uses 8 lanes; test_gemm runs the
// AVX-512 blocking on 16.
#pragma once
#include <cmath>
#include <cstring>

namespace anvil::cpu {
namespace {

template <int Width>
struct PortableLanes {
  static constexpr int W = Width;
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
}  // namespace anvil::cpu
