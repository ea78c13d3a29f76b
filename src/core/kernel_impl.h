// Which implementation the ops run: the scalar reference (the executable specification), the
// fast CPU kernels, or the GPU kernels. The kernels choose by it (kernels/impl.h) and the config
// names it (`kernels:`, config/choices.h); like ComputeDtype, it lives below both.
#pragma once

namespace anvil {

enum class KernelImpl { kRef, kCpu, kGpu };

}  // namespace anvil
