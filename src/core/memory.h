// How much memory this process may still take: what sizes `device_train_microbatch_size: auto`.
#pragma once
#include <cstddef>

namespace anvil {

// Bytes the kernel reports as available (MemAvailable), lowered to what the process's cgroup
// (memory.max - memory.current, cgroup v2) still allows when it sets a limit.
size_t available_memory_bytes();

}  // namespace anvil
