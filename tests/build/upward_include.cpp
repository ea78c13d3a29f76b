// Compiled against anvil_kernels alone, it must not build: the config module sits above kernels
// (as does everything but core and device), so its headers are out of the kernels' reach
// (CMakeLists.txt, anvil_module).
#include "kernels/matmul.h"
#include "config/choices.h"
