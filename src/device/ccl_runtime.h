// The collective-communication part of the vendor mapping (device/runtime.h holds the runtime):
// NCCL on NVIDIA, RCCL on AMD. RCCL keeps NCCL's names, so only the header differs.
#pragma once
#include "device/runtime.h"

#if defined(ANVIL_HIP)
#include <rccl/rccl.h>
#else
#include <nccl.h>
#endif
