// oneDNN's matmul primitive (what PyTorch runs CPU matrix products on under autocast), as a
// yardstick that `anvil bench gemm` times beside anvil's GEMM. libdnnl is loaded when first asked
// for, so that anvil runs on machines without it; the bench then leaves its columns out.
#pragma once
#include <memory>
#include <string>

#include "kernels/cpu/gemm.h"

namespace anvil::cpu {

// Whether libdnnl.so.2 loaded, with its CPU engine; *why says what failed otherwise.
bool onednn_available(std::string* why);

class OneDnnMatmul {
 public:
  // C (M × N, rows N apart) = A · B, or C += A · B when accumulate, with A and B laid out as
  // GemmOperands. In bf16 the operands are rounded to bf16 here, once, and oneDNN reads those
  // (anvil's bf16 GEMM reads fp32 and rounds as it packs, on every call).
  OneDnnMatmul(GemmPrecision precision, int M, int N, int K, GemmOperand a, GemmOperand b, float* c, bool accumulate);
  ~OneDnnMatmul();
  OneDnnMatmul(const OneDnnMatmul&) = delete;
  OneDnnMatmul& operator=(const OneDnnMatmul&) = delete;

  void run();
  // oneDNN's name for the kernel it chose, e.g. "brg:avx512_core_bf16".
  std::string implementation() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace anvil::cpu
