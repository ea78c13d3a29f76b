// Compiled against anvil_kernels alone, it must not build: the model module sits above kernels,
// so its headers are out of the kernels' reach (CMakeLists.txt, anvil_module).
#include "kernels/matmul.h"
#include "model/model.h"
