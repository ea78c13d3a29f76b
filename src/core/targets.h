// The target value that marks "no loss here", shared by the data loader (which writes it) and the
// loss (which skips it). PyTorch's value, so label tensors mean the same in both.
#pragma once
#include <cstdint>

namespace anvil {

constexpr int32_t kIgnoreIndex = -100;

}  // namespace anvil
