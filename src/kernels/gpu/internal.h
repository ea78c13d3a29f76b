// What the GPU op sources share (device code and GPU host code only).
#pragma once

namespace anvil::gpu {

// out (C) += the column sums of x (N,C), in a fixed order.
void column_sums_accumulate(float* out, const float* x, int N, int C);
// Throws the anvil::Error for an op the GPU kernels cannot run (defined in host code, so that
// kernel sources need not compile the formatting library).
[[noreturn]] void op_error(const char* message);

}  // namespace anvil::gpu
