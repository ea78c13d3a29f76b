// Communicator: who this process is among the job's ranks, and point-to-point messages with a
// deadline. Every collective anvil runs (src/parallel/collectives.h) is built on these few calls, so
// a backend only moves bytes; the algorithms, their reduction order and their timeouts are
// anvil's own. Two backends: one process (no peers, no MPI needed) and MPI.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace anvil {

// How the job was launched, from the environment: recognised for reporting and for checking
// that MPI sees every task the launcher started.
struct LaunchInfo {
  std::string launcher;  // "mpirun", "srun", "torchrun", "mpich" or "" (a plain process)
  int env_world = 1;     // tasks the launcher says it started (1 when unknown)
  bool mpi_launch = false;  // a launcher that MPI_Init can join
};
LaunchInfo detect_launch();
class Communicator;
// How this process was started and where its rank came from, for `anvil doctor` and the run log:
// the launcher, the SLURM job and nodes when under SLURM, and the source of the ranks (MPI,
// which mpirun, srun --mpi=pmix and MPICH's launchers all answer to).
std::string describe_launch(const Communicator& comm);

// A point-to-point transfer in flight.
struct PeerRequest {
  void* handle = nullptr;  // backend-owned
  int peer = -1;
  bool is_send = false;
  bool done = false;
};

class Communicator {
 public:
  virtual ~Communicator();
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_rank() const = 0;  // among the ranks on this host
  virtual int local_size() const = 0;
  virtual std::string host() const = 0;
  virtual std::string backend() const = 0;

  // Non-blocking transfers of bytes to/from a peer; a transfer of 0 bytes is never posted.
  virtual PeerRequest isend(const void* buf, size_t bytes, int peer, int tag) = 0;
  virtual PeerRequest irecv(void* buf, size_t bytes, int peer, int tag) = 0;
  // Waits for every request. Past the timeout it reports, naming the operation and the peers
  // whose messages did not arrive, and aborts the whole job: a collective never hangs.
  virtual void wait_all(PeerRequest* reqs, size_t n, const char* operation) = 0;
  // Ends every rank of the job (MPI_Abort), after printing message.
  [[noreturn]] virtual void abort(const std::string& message) = 0;

  // The library's own all-reduce (sum of floats, in place), for `anvil bench comm`.
  virtual void library_all_reduce(float* data, size_t n) = 0;
  // Whether two threads may talk at once (MPI_THREAD_MULTIPLE), as pipeline parallelism's
  // training thread does while the communication thread reduces gradients.
  virtual bool threads_may_talk_at_once() const = 0;

  void set_timeout(double seconds) { timeout_s_ = seconds; }
  double timeout() const { return timeout_s_; }

 protected:
  double timeout_s_ = 600;  // LLM Foundry's dist_timeout default
};

// A group of the parent's ranks, on the parent's transport: ranks[i] of the parent is the
// group's rank i (pipeline parallelism's data-parallel and pipeline groups). Groups share the
// parent's message tags, so two groups talking at once must not share a pair of ranks. Its
// waits, timeout and abort are the parent's; the library's all-reduce is the whole job's only.
std::unique_ptr<Communicator> make_group_communicator(Communicator& parent, std::vector<int> ranks);

// MPI when the process was started by an MPI launcher (or require_mpi), else one process.
// threads_at_once: MPI is asked for MPI_THREAD_MULTIPLE (threads_may_talk_at_once), which
// pipeline parallelism needs; otherwise MPI_THREAD_SERIALIZED, cheaper on some MPI stacks.
// Errors clearly when a launcher started several tasks that MPI cannot join.
std::unique_ptr<Communicator> make_communicator(bool require_mpi = false, bool threads_at_once = false);

// After an error on this rank (in `main`): where it is one of several MPI ranks, logs message
// with the rank and host and ends every rank (MPI_Abort), since the others would wait for it in
// their next collective; else returns. Works after the communicator is gone: an error unwinding
// past it leaves MPI up for this.
void end_job_on_error(const std::string& message);

}  // namespace anvil
