// Which implementation the ops run: the scalar reference (the executable specification) or the
// fast CPU kernels. Chosen once per process; every op dispatches on it in dispatch.cpp.
#pragma once
#include <string>

namespace anvil {

enum class KernelImpl { kRef, kCpu };

void set_kernel_impl(KernelImpl impl);
KernelImpl kernel_impl();
KernelImpl parse_kernel_impl(const std::string& name);  // "ref" or "cpu"

}  // namespace anvil
