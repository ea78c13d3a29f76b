// GPU collectives through NCCL (RCCL on AMD); see gpu_collectives.h.
#include <chrono>
#include <thread>

#include "core/error.h"
#include "device/ccl_runtime.h"
#include "device/stream.h"
#include "parallel/collectives.h"
#include "parallel/gpu_collectives.h"

namespace anvil {
namespace {

#if defined(ANVIL_HIP)
constexpr const char* kLibrary = "RCCL";
#else
constexpr const char* kLibrary = "NCCL";
#endif

#define NCCL_CHECK(expr)                                                                                    \
  do {                                                                                                      \
    const ncclResult_t anvil_nccl_err_ = (expr);                                                            \
    ANVIL_CHECK(anvil_nccl_err_ == ncclSuccess, "{} failed: {} ({})", #expr, ncclGetErrorString(anvil_nccl_err_), \
                kLibrary);                                                                                  \
  } while (0)

template <class T>
ncclDataType_t nccl_type();
template <>
ncclDataType_t nccl_type<float>() {
  return ncclFloat32;
}
template <>
ncclDataType_t nccl_type<int64_t>() {
  return ncclInt64;
}

class Nccl : public GpuCollectives {
 public:
  explicit Nccl(Communicator& comm) : comm_(comm) {
    ncclUniqueId id{};
    if (comm.rank() == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    broadcast(comm, &id, sizeof id, 0);
    gpu_stream();  // the process's GPU current on this thread: the communicator is bound to it
    NCCL_CHECK(ncclCommInitRank(&nccl_, comm.size(), id, comm.rank()));
  }
  ~Nccl() override {
    if (nccl_) ncclCommDestroy(nccl_);
  }

  void all_reduce(float* data, size_t n) override { all_reduce_of(data, n); }
  void all_reduce(int64_t* data, size_t n) override { all_reduce_of(data, n); }
  void reduce_scatter(float* data, const std::vector<size_t>& counts) override { reduce_scatter_of(data, counts); }
  void reduce_scatter(int64_t* data, const std::vector<size_t>& counts) override { reduce_scatter_of(data, counts); }
  void all_gather(float* data, const std::vector<size_t>& counts) override {
    check_counts(counts, "all_gather");
    // Each rank's segment broadcast from it; one group, so NCCL runs them together.
    NCCL_CHECK(ncclGroupStart());
    size_t offset = 0;
    for (int r = 0; r < comm_.size(); r++) {
      if (counts[r] > 0)
        NCCL_CHECK(ncclBroadcast(data + offset, data + offset, counts[r], nccl_type<float>(), r, nccl_, gpu_stream()));
      offset += counts[r];
    }
    NCCL_CHECK(ncclGroupEnd());
    wait_done("all_gather");
  }

 private:
  template <class T>
  void all_reduce_of(T* data, size_t n) {
    if (n == 0) return;
    NCCL_CHECK(ncclAllReduce(data, data, n, nccl_type<T>(), ncclSum, nccl_, gpu_stream()));
    wait_done("all_reduce");
  }

  // Segments may be uneven, which ncclReduceScatter does not allow: one reduce to each rank, in
  // one group.
  template <class T>
  void reduce_scatter_of(T* data, const std::vector<size_t>& counts) {
    check_counts(counts, "reduce_scatter");
    NCCL_CHECK(ncclGroupStart());
    size_t offset = 0;
    for (int r = 0; r < comm_.size(); r++) {
      if (counts[r] > 0)
        NCCL_CHECK(ncclReduce(data + offset, data + offset, counts[r], nccl_type<T>(), ncclSum, r, nccl_, gpu_stream()));
      offset += counts[r];
    }
    NCCL_CHECK(ncclGroupEnd());
    wait_done("reduce_scatter");
  }

  void check_counts(const std::vector<size_t>& counts, const char* op) const {
    ANVIL_CHECK(counts.size() == static_cast<size_t>(comm_.size()), "{}: {} segment counts for {} ranks", op,
                counts.size(), comm_.size());
  }

  // Polls instead of blocking, so that a rank that stopped (or a network that failed) ends the job
  // after the communicator's timeout rather than hanging every other rank.
  void wait_done(const char* op) {
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + std::chrono::duration<double>(comm_.timeout());
    for (;;) {
      const gpuError_t q = gpuStreamQuery(gpu_stream());
      if (q == gpuSuccess) return;
      if (q != gpuErrorNotReady) GPU_CHECK(q);
      ncclResult_t async = ncclSuccess;
      NCCL_CHECK(ncclCommGetAsyncError(nccl_, &async));
      if (async != ncclSuccess || Clock::now() > deadline) {
        const std::string why = async != ncclSuccess ? ncclGetErrorString(async)
                                                     : fmt::format("not complete after {:.0f} s (dist_timeout)",
                                                                   comm_.timeout());
        ncclCommAbort(nccl_);
        nccl_ = nullptr;
        comm_.abort(fmt::format("rank {}: {} {} over {} ranks: {}; a rank stopped, or its GPU or the network failed",
                                comm_.rank(), kLibrary, op, comm_.size(), why));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  Communicator& comm_;
  ncclComm_t nccl_ = nullptr;
};

}  // namespace

bool gpu_collectives_built() { return true; }

std::string gpu_collectives_description() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return fmt::format("{}: the library did not report its version", kLibrary);
  // NCCL_VERSION_CODE: major·10000 + minor·100 + patch since 2.9.
  return fmt::format("{} {}.{}.{}", kLibrary, v / 10000, v / 100 % 100, v % 100);
}

std::unique_ptr<GpuCollectives> make_gpu_collectives(Communicator& comm) { return std::make_unique<Nccl>(comm); }

}  // namespace anvil
