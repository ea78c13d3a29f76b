// Launch detection and the one-process communicator.
#include "parallel/communicator.h"

#include <unistd.h>

#include <cstdlib>

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"

namespace anvil {
namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  return end && *end == '\0' ? static_cast<int>(x) : fallback;
}
bool env_has(const char* name) { return std::getenv(name) != nullptr; }

class SingleProcess : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  std::string host() const override {
    char name[256] = {};
    gethostname(name, sizeof name - 1);
    return name;
  }
  std::string backend() const override { return "single process"; }
  PeerRequest isend(const void*, size_t, int peer, int) override { no_peer(peer); }
  PeerRequest irecv(void*, size_t, int peer, int) override { no_peer(peer); }
  void wait_all(PeerRequest*, size_t n, const char* operation) override {
    ANVIL_CHECK(n == 0, "{}: a single process has no peers to wait for", operation);
  }
  [[noreturn]] void abort(const std::string& message) override {
    log_line(LogLevel::kError, message);
    std::_Exit(1);
  }
  void library_all_reduce(float*, size_t) override {}
  bool threads_may_talk_at_once() const override { return true; }  // nobody to talk to

 private:
  [[noreturn]] static void no_peer(int peer) { ANVIL_FAIL("rank {} does not exist: this is a single-process run", peer); }
};

class GroupCommunicator : public Communicator {
 public:
  GroupCommunicator(Communicator& parent, std::vector<int> ranks) : parent_(parent), ranks_(std::move(ranks)) {
    for (size_t i = 0; i < ranks_.size(); i++) {
      ANVIL_CHECK(ranks_[i] >= 0 && ranks_[i] < parent.size(), "a group of ranks names rank {} of a job of {}",
                  ranks_[i], parent.size());
      if (ranks_[i] == parent.rank()) rank_ = static_cast<int>(i);
    }
    ANVIL_CHECK(rank_ >= 0, "rank {} builds a group it is not in", parent.rank());
  }
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(ranks_.size()); }
  int local_rank() const override { return parent_.local_rank(); }
  int local_size() const override { return parent_.local_size(); }
  std::string host() const override { return parent_.host(); }
  std::string backend() const override { return parent_.backend(); }
  PeerRequest isend(const void* buf, size_t bytes, int peer, int tag) override {
    return parent_.isend(buf, bytes, parent_rank(peer), tag);
  }
  PeerRequest irecv(void* buf, size_t bytes, int peer, int tag) override {
    return parent_.irecv(buf, bytes, parent_rank(peer), tag);
  }
  void wait_all(PeerRequest* reqs, size_t n, const char* operation) override { parent_.wait_all(reqs, n, operation); }
  [[noreturn]] void abort(const std::string& message) override {
    parent_.abort(message);
    std::_Exit(1);  // not reached: the parent's abort ends the process
  }
  void library_all_reduce(float*, size_t) override {
    ANVIL_FAIL("the MPI library's all-reduce runs over the whole job, not a group of its ranks");
  }
  bool threads_may_talk_at_once() const override { return parent_.threads_may_talk_at_once(); }

 private:
  int parent_rank(int peer) const {
    ANVIL_CHECK(peer >= 0 && peer < size(), "rank {} of a group of {}", peer, size());
    return ranks_[peer];
  }
  Communicator& parent_;
  std::vector<int> ranks_;
  int rank_ = -1;
};

}  // namespace

std::unique_ptr<Communicator> make_group_communicator(Communicator& parent, std::vector<int> ranks) {
  return std::make_unique<GroupCommunicator>(parent, std::move(ranks));
}

LaunchInfo detect_launch() {
  LaunchInfo li;
  if (env_has("OMPI_COMM_WORLD_SIZE")) {
    li = {"mpirun", env_int("OMPI_COMM_WORLD_SIZE", 1), true};
  } else if (env_has("PMIX_RANK") && env_has("SLURM_STEP_NUM_TASKS")) {
    li = {"srun", env_int("SLURM_STEP_NUM_TASKS", 1), true};
  } else if (env_has("PMI_SIZE") || env_has("PMI_RANK")) {
    li = {"mpich", env_int("PMI_SIZE", 1), true};
  } else if (env_has("SLURM_STEP_NUM_TASKS") && env_has("SLURM_PROCID")) {
    // Tasks of an srun step (a batch script itself is one task and passes).
    li = {"srun", env_int("SLURM_STEP_NUM_TASKS", 1), false};
  } else if (env_has("WORLD_SIZE") && env_has("RANK")) {
    li = {"torchrun", env_int("WORLD_SIZE", 1), false};
  }
  return li;
}

std::string describe_launch(const Communicator& comm) {
  const LaunchInfo li = detect_launch();
  std::string out = li.launcher.empty() ? "a plain process" : li.launcher;
  if (const char* job = std::getenv("SLURM_JOB_ID"))
    out += fmt::format(" (SLURM job {}, {} node(s), this one {})", job, env_int("SLURM_NNODES", 1),
                       env_int("SLURM_NODEID", 0));
  out += fmt::format("; rank {} of {}, local rank {} of {}, from {}", comm.rank(), comm.size(), comm.local_rank(),
                     comm.local_size(), comm.size() > 1 || li.mpi_launch ? "MPI" : "the process alone");
  return out;
}

// mpi_communicator.cpp
std::unique_ptr<Communicator> make_mpi_communicator(const LaunchInfo& li, bool threads_at_once);

std::unique_ptr<Communicator> make_communicator(bool require_mpi, bool threads_at_once) {
  const LaunchInfo li = detect_launch();
  std::unique_ptr<Communicator> comm;
  if (li.mpi_launch || require_mpi) {
    comm = make_mpi_communicator(li, threads_at_once);
  } else {
    ANVIL_CHECK(li.env_world <= 1, "{} started {} tasks, but anvil joins them through MPI: launch with mpirun -np N, "
                "or srun --mpi=pmix under SLURM", li.launcher, li.env_world);
    comm = std::make_unique<SingleProcess>();
  }
  return comm;
}

Communicator::~Communicator() = default;

}  // namespace anvil
