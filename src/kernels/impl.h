// Which implementation the ops run (KernelImpl, core/kernel_impl.h): the scalar reference (the
// executable specification), the fast CPU kernels, or the GPU kernels (whose arrays live in GPU
// memory: kernels/buffer.h). Chosen once per process, as the device is: every op dispatches on
// it in dispatch.cpp.
#pragma once
#include "core/kernel_impl.h"

namespace anvil {

// kGpu needs a build with a GPU backend and a visible GPU, and selects the process's GPU: number
// local_rank modulo the GPUs it sees (the ranks of a host take its GPUs in turn). Errors say
// what is missing.
void select_kernel_impl(KernelImpl impl, int local_rank);
// Without checks: tests that run the reference and the fast kernels side by side.
void set_kernel_impl(KernelImpl impl);
KernelImpl kernel_impl();

}  // namespace anvil
