// Test arrays in GPU memory: a host vector copied there, and back.
#pragma once
#include <vector>

#include "device/device.h"

namespace anvil::testing {

inline float* gpu_array(const std::vector<float>& host) {
  auto* p = static_cast<float*>(gpu_alloc(host.size() * sizeof(float)));
  gpu_copy_to_device(p, host.data(), host.size() * sizeof(float));
  return p;
}

inline std::vector<float> host_array(const float* p, size_t n) {
  std::vector<float> v(n);
  gpu_copy_to_host(v.data(), p, n * sizeof(float));
  return v;
}

}  // namespace anvil::testing
