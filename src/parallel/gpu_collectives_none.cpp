// A build without NCCL/RCCL (no GPU backend, or the emulated one) has no GPU collectives.
#include "core/error.h"
#include "parallel/gpu_collectives.h"

namespace anvil {

std::string gpu_collectives_description() { return "none: built without NCCL/RCCL"; }
bool gpu_collectives_built() { return false; }
std::unique_ptr<GpuCollectives> make_gpu_collectives(Communicator&) {
  ANVIL_FAIL("NCCL/RCCL collectives need a GPU build (the cuda-release or hip-release preset)");
}

}  // namespace anvil
