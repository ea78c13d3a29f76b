// anvil's collectives on op memory (kernels/buffer.h): what data parallelism reduces and gathers
// lives wherever the ops run. Host arrays go straight to anvil's collectives (parallel/collectives.h).
// GPU arrays go to NCCL/RCCL (parallel/gpu_collectives.h), or are copied through host memory around
// anvil's collectives: the way when the ranks of a host share GPUs, which NCCL refuses. Integer
// (fixed-point) sums are exact on every path, so the path never changes a bit of a
// deterministic run.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "parallel/collectives.h"
#include "parallel/gpu_collectives.h"

namespace anvil {

// How GPU arrays travel: auto (NCCL/RCCL when the build has it and no two ranks share a GPU, else
// host), nccl (NCCL/RCCL, even for one rank), host (copies through host memory).

// Which ranks drive the same physical GPU, from every rank's host name and GPU PCI address
// (device numbers alone mislead when a launcher gives each task its own CUDA_VISIBLE_DEVICES).
// Collective; every rank has its GPU selected.
struct GpuSharing {
  int on_my_gpu = 1;  // ranks driving this rank's GPU, this one included
  bool any = false;   // whether any two ranks of the job share a GPU
};
GpuSharing gpu_sharing(Communicator& comm);

class OpCollectives {
 public:
  // impl: the kernels of the arrays given (their memory). largest_bytes: the largest array any call
  // below will be given. Collective over comm's ranks.
  OpCollectives(Communicator& comm, KernelImpl impl, size_t largest_bytes, GpuCollectivesChoice choice);
  ~OpCollectives();
  // "anvil's (host memory)", "NCCL 2.28.3", "anvil's, through host memory".
  std::string description() const;
  // For arrays on the GPU, which ranks share a GPU (found once, at construction); {1, false} otherwise.
  const GpuSharing& sharing() const { return sharing_; }

  void all_reduce(float* data, size_t n, AllReduceAlgo algo);
  void all_reduce(int64_t* data, size_t n, AllReduceAlgo algo);
  void reduce_scatter(float* data, const std::vector<size_t>& counts, AllReduceAlgo algo);
  void reduce_scatter(int64_t* data, const std::vector<size_t>& counts, AllReduceAlgo algo);
  void all_gather(float* data, const std::vector<size_t>& counts);

 private:
  enum class Path { kHost, kStaged, kGpuLibrary, kAlone };
  // Runs the host collective on data, or on a host copy of it (copied back after).
  template <class T, class F>
  void on_host(T* data, size_t n, F collective);

  Communicator& comm_;
  Path path_ = Path::kHost;
  GpuSharing sharing_;
  std::unique_ptr<GpuCollectives> gpu_;
  std::mutex mu_;
  std::vector<unsigned char> stage_;
};

}  // namespace anvil
