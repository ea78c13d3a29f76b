// Collectives on op memory; see op_collectives.h.
#include "parallel/op_collectives.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "device/device.h"
#include "kernels/buffer.h"

namespace anvil {

GpuSharing gpu_sharing(Communicator& comm) {
  constexpr size_t kKey = 128;
  std::vector<char> keys(kKey * static_cast<size_t>(comm.size()), 0);
  const std::string mine = comm.host() + "/" + gpu_pci_bus_id();
  std::copy_n(mine.begin(), std::min(mine.size(), kKey - 1), keys.begin() + kKey * comm.rank());
  all_gather_blocks(comm, keys.data(), kKey);
  std::vector<std::string> all;
  for (int r = 0; r < comm.size(); r++) all.emplace_back(keys.data() + kKey * r);
  GpuSharing out;
  out.on_my_gpu = static_cast<int>(std::count(all.begin(), all.end(), all[comm.rank()]));
  std::sort(all.begin(), all.end());
  out.any = std::adjacent_find(all.begin(), all.end()) != all.end();
  return out;
}

OpCollectives::OpCollectives(Communicator& comm, KernelImpl impl, size_t largest_bytes, GpuCollectivesChoice choice)
    : comm_(comm) {
  if (impl != KernelImpl::kGpu) return;  // kHost
  sharing_ = gpu_sharing(comm);
  const bool own_gpus = !sharing_.any;
  ANVIL_CHECK(choice != GpuCollectivesChoice::kNccl || own_gpus, "distributed.gpu_collectives: nccl needs a GPU per "
              "rank, but ranks of this job share a GPU (rank {} drives {} on {}); use host (or auto)", comm.rank(),
              gpu_pci_bus_id(), comm.host());
  if (choice == GpuCollectivesChoice::kNccl ||
      (choice == GpuCollectivesChoice::kAuto && comm.size() > 1 && gpu_collectives_built() && own_gpus)) {
    path_ = Path::kGpuLibrary;
    gpu_ = make_gpu_collectives(comm);
  } else if (comm.size() > 1) {
    path_ = Path::kStaged;
    stage_.resize(largest_bytes);  // once: a step allocates nothing
  } else {
    path_ = Path::kAlone;
  }
}

OpCollectives::~OpCollectives() = default;

std::string OpCollectives::description() const {
  switch (path_) {
    case Path::kHost: return "anvil's (host memory)";
    case Path::kStaged: return "anvil's, through host memory";
    case Path::kGpuLibrary: return gpu_collectives_description();
    case Path::kAlone: break;
  }
  return "none (one rank)";
}

template <class T, class F>
void OpCollectives::on_host(T* data, size_t n, F collective) {
  if (path_ == Path::kHost) {
    collective(data);
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  const size_t bytes = n * sizeof(T);
  ANVIL_CHECK(bytes <= stage_.size(), "a collective of {} bytes exceeds the {} bytes staged for it", bytes,
              stage_.size());
  T* host = reinterpret_cast<T*>(stage_.data());
  op_copy_to_host(KernelImpl::kGpu, host, data, bytes);  // every path but kHost holds GPU arrays
  collective(host);
  op_copy_from_host(KernelImpl::kGpu, data, host, bytes);
}

void OpCollectives::all_reduce(float* data, size_t n, AllReduceAlgo algo) {
  if (path_ == Path::kAlone) return;
  if (path_ == Path::kGpuLibrary) return gpu_->all_reduce(data, n);
  on_host(data, n, [&](float* d) { anvil::all_reduce(comm_, d, n, algo); });
}
void OpCollectives::all_reduce(int64_t* data, size_t n, AllReduceAlgo algo) {
  if (path_ == Path::kAlone) return;
  if (path_ == Path::kGpuLibrary) return gpu_->all_reduce(data, n);
  on_host(data, n, [&](int64_t* d) { anvil::all_reduce(comm_, d, n, algo); });
}
void OpCollectives::reduce_scatter(float* data, const std::vector<size_t>& counts, AllReduceAlgo algo) {
  if (path_ == Path::kAlone) return;
  if (path_ == Path::kGpuLibrary) return gpu_->reduce_scatter(data, counts);
  const size_t n = std::accumulate(counts.begin(), counts.end(), size_t{0});
  on_host(data, n, [&](float* d) { anvil::reduce_scatter(comm_, d, counts, algo); });
}
void OpCollectives::reduce_scatter(int64_t* data, const std::vector<size_t>& counts, AllReduceAlgo algo) {
  if (path_ == Path::kAlone) return;
  if (path_ == Path::kGpuLibrary) return gpu_->reduce_scatter(data, counts);
  const size_t n = std::accumulate(counts.begin(), counts.end(), size_t{0});
  on_host(data, n, [&](int64_t* d) { anvil::reduce_scatter(comm_, d, counts, algo); });
}
void OpCollectives::all_gather(float* data, const std::vector<size_t>& counts) {
  if (path_ == Path::kAlone) return;
  if (path_ == Path::kGpuLibrary) return gpu_->all_gather(data, counts);
  const size_t n = std::accumulate(counts.begin(), counts.end(), size_t{0});
  on_host(data, n, [&](float* d) { anvil::all_gather(comm_, d, counts); });
}

}  // namespace anvil
