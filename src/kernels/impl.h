// Readying the process for a kernel implementation (KernelImpl, core/kernel_impl.h): the scalar
// reference (the executable specification), the fast CPU kernels, or the GPU kernels (whose
// arrays live in GPU memory: kernels/buffer.h). Which implementation an op runs is its first
// argument (kernels/op.h); this only checks that one can run here and binds the GPU.
#pragma once
#include "core/kernel_impl.h"

namespace anvil {

// kGpu needs a build with a GPU backend and a visible GPU, and selects the process's GPU: number
// local_rank modulo the GPUs it sees (the ranks of a host take its GPUs in turn). Errors say
// what is missing. kRef and kCpu need nothing.
void prepare_kernel_impl(KernelImpl impl, int local_rank);

}  // namespace anvil
