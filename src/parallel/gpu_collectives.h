// Collectives on GPU memory through NCCL (RCCL on AMD) for the ranks of a communicator, each
// driving its own GPU; the library's unique id travels through the communicator (MPI). Sums are
// in place, as anvil's own collectives (parallel/collectives.h): on int64 fixed-point gradients they
// are exact, so deterministic training keeps its bits whichever algorithm NCCL picks. Segments
// may be uneven (counts[r] elements for rank r, in rank order).
//
// A call launches on the calling thread's stream (device/device.h) and returns once the
// collective has completed; past the communicator's timeout it ends the job, naming the
// operation: a collective never hangs.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace anvil {

class GpuCollectives {
 public:
  virtual ~GpuCollectives() = default;
  virtual void all_reduce(float* data, size_t n) = 0;
  virtual void all_reduce(int64_t* data, size_t n) = 0;
  virtual void reduce_scatter(float* data, const std::vector<size_t>& counts) = 0;
  virtual void reduce_scatter(int64_t* data, const std::vector<size_t>& counts) = 0;
  virtual void all_gather(float* data, const std::vector<size_t>& counts) = 0;
};

// "NCCL 2.28.3" (the library loaded), or why there is none.
std::string gpu_collectives_description();
bool gpu_collectives_built();
// Collective: every rank of comm calls it, each with its GPU selected.
std::unique_ptr<GpuCollectives> make_gpu_collectives(Communicator& comm);

}  // namespace anvil
