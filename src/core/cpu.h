// Facts about the host CPU that choose kernels and report the machine.
#pragma once
#include <string>

namespace anvil {

struct CpuInfo {
  std::string model;  // from /proc/cpuinfo
  bool avx2 = false, fma = false, avx512bf16 = false;
  bool amx_bf16 = false;  // AMX's tiles and their bf16 products, as Linux reports them
  bool avx512 = false;  // F, BW, VL and DQ: what OpenBLAS's SkylakeX kernels execute
  int threads = 1;    // OpenMP threads anvil will use
};

const CpuInfo& cpu_info();

}  // namespace anvil
