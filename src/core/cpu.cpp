// CPU feature detection: compiler builtins for the ISA, /proc/cpuinfo for the model name and
// the flags the builtins do not know (avx512_bf16, AMX).
#include "core/cpu.h"

#include <omp.h>

#include <fstream>

namespace anvil {

const CpuInfo& cpu_info() {
  static const CpuInfo info = [] {
    CpuInfo c;
    __builtin_cpu_init();
    c.avx2 = __builtin_cpu_supports("avx2");
    c.fma = __builtin_cpu_supports("fma");
    c.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
      if (c.model.empty() && line.rfind("model name", 0) == 0) c.model = line.substr(line.find(':') + 2);
      if (line.rfind("flags", 0) == 0) {
        const std::string flags = line + " ";
        const auto has = [&](const std::string& flag) { return flags.find(" " + flag + " ") != std::string::npos; };
        c.avx512bf16 = has("avx512_bf16");
        c.amx_bf16 = has("amx_tile") && has("amx_bf16");
        break;
      }
    }
    c.threads = omp_get_max_threads();
    return c;
  }();
  return info;
}

}  // namespace anvil
