// GoogleTest entry point shared by every anvil test binary: selects the BLAS kernels as the
// anvil CLI does, so tests exercise the same code paths users run.
#include <gtest/gtest.h>

#include "kernels/blas.h"

int main(int argc, char** argv) {
  anvil::blas_select_kernels(argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
