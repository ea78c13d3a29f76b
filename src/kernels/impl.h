// Which implementation the ops run: the scalar reference (the executable specification), the
// fast CPU kernels, or the GPU kernels (whose arrays live in GPU memory: kernels/buffer.h).
// Chosen once per process; every op dispatches on it in dispatch.cpp.
#pragma once
#include <string>

namespace anvil {

enum class KernelImpl { kRef, kCpu, kGpu };

void set_kernel_impl(KernelImpl impl);
KernelImpl kernel_impl();
// "ref", "cpu" or "gpu"; "gpu" needs a build with a GPU backend and selects the process's GPU:
// number local_rank modulo the GPUs it sees (the ranks of a host take its GPUs in turn).
KernelImpl parse_kernel_impl(const std::string& name, int local_rank);

}  // namespace anvil
