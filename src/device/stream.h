// The stream every op and copy is issued on (device code and GPU host code only).
#pragma once
#include "device/runtime.h"

namespace anvil {
gpuStream_t gpu_stream();
}  // namespace anvil

// Launches a kernel on the op stream: GPU_LAUNCH(kernel, grid, block)(arguments...).
#if defined(ANVIL_GPU_EMULATION)
#define GPU_LAUNCH(kernel, grid, block) ::anvil::emulation::launch(kernel, grid, block)
#else
#define GPU_LAUNCH(kernel, grid, block) kernel<<<grid, block, 0, ::anvil::gpu_stream()>>>
#endif
