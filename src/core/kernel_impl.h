// Which implementation the ops run: the scalar reference (the executable specification), the
// fast CPU kernels, or the GPU kernels. Every op takes it (kernels/op.h), whoever owns the arrays
// passes it (a model: ModelStorage::kernels), and the config names it (`kernels:`,
// config/choices.h); like ComputeDtype, it lives below all of them.
#pragma once

namespace anvil {

enum class KernelImpl { kRef, kCpu, kGpu };

}  // namespace anvil
