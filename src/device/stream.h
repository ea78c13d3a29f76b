// The stream every op and copy is issued on (device code and GPU host code only).
#pragma once
#include "device/runtime.h"

namespace anvil {
gpuStream_t gpu_stream();
}  // namespace anvil
