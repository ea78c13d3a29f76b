// The MPI backend: MPI_Init_thread (anvil's communication thread and the training thread call MPI
// one at a time, so MPI_THREAD_SERIALIZED is enough, except under pipeline parallelism, whose
// training thread sends activations while the communication thread reduces gradients: it asks
// for MPI_THREAD_MULTIPLE), non-blocking point-to-point polled against a
// deadline, MPI_Abort to end the job. Standard MPI-3 only, so it builds against Open MPI and MPICH.
#include <mpi.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <thread>

#include <fmt/ranges.h>

#include "core/error.h"
#include "core/log.h"
#include "parallel/communicator.h"

namespace anvil {
namespace {

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, len);
}

#define ANVIL_MPI_CHECK(call)                                                                     \
  do {                                                                                           \
    const int mpi_rc_ = (call);                                                                  \
    ANVIL_CHECK(mpi_rc_ == MPI_SUCCESS, "{} failed at {}:{}: {}", #call, __FILE__, __LINE__, mpi_error_text(mpi_rc_)); \
  } while (0)

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(const LaunchInfo& li, bool threads_at_once) {
    int provided = 0;
    ANVIL_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, threads_at_once ? MPI_THREAD_MULTIPLE : MPI_THREAD_SERIALIZED,
                                    &provided));
    ANVIL_CHECK(provided >= MPI_THREAD_SERIALIZED, "the MPI library provides thread level {}; anvil needs "
                "MPI_THREAD_SERIALIZED ({})", provided, MPI_THREAD_SERIALIZED);
    thread_multiple_ = provided >= MPI_THREAD_MULTIPLE;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MPI_Comm node;
    ANVIL_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
    MPI_Comm_rank(node, &local_rank_);
    MPI_Comm_size(node, &local_size_);
    MPI_Comm_free(&node);
    char name[MPI_MAX_PROCESSOR_NAME];
    int len = 0;
    MPI_Get_processor_name(name, &len);
    host_.assign(name, len);
    int major = 0, minor = 0;
    MPI_Get_version(&major, &minor);
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    MPI_Get_library_version(lib, &len);
    std::string first_line(lib, len);
    first_line = first_line.substr(0, first_line.find_first_of(",\n"));
    std::replace(first_line.begin(), first_line.end(), '\t', ' ');
    backend_ = fmt::format("MPI {}.{} ({})", major, minor, first_line);
    if (li.env_world > 1 && li.env_world != size_)
      abort(fmt::format("{} started {} tasks but MPI joined {}: under SLURM use srun --mpi=pmix", li.launcher,
                        li.env_world, size_));
  }
  ~MpiCommunicator() override {
    // An error on its way out of this rank leaves MPI up, for end_job_on_error: MPI_Finalize
    // would wait for the other ranks, which wait for this one in their next collective.
    if (std::uncaught_exceptions() > 0) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string host() const override { return host_; }
  std::string backend() const override { return backend_; }

  PeerRequest isend(const void* buf, size_t bytes, int peer, int tag) override {
    return post(const_cast<void*>(buf), bytes, peer, tag, true);
  }
  PeerRequest irecv(void* buf, size_t bytes, int peer, int tag) override { return post(buf, bytes, peer, tag, false); }

  void wait_all(PeerRequest* reqs, size_t n, const char* operation) override {
    const auto start = std::chrono::steady_clock::now();
    size_t left = 0;
    for (size_t i = 0; i < n; i++) left += !reqs[i].done;
    for (long polls = 0; left > 0; polls++) {
      for (size_t i = 0; i < n; i++) {
        if (reqs[i].done) continue;
        int flag = 0;
        const int rc = MPI_Test(static_cast<MPI_Request*>(reqs[i].handle), &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
          abort(fmt::format("{} on rank {} ({}): the transfer {} rank {} failed: {}", operation, rank_, host_,
                            reqs[i].is_send ? "to" : "from", reqs[i].peer, mpi_error_text(rc)));
        if (flag) {
          delete static_cast<MPI_Request*>(reqs[i].handle);
          reqs[i].handle = nullptr;
          reqs[i].done = true;
          left--;
        }
      }
      if (left == 0) break;
      // Spin briefly (a peer on shared memory answers in microseconds), then give the core away:
      // ranks may outnumber cores.
      if (polls < 200) continue;
      if ((polls & 63) != 0) {
        sched_yield();
        continue;
      }
      answer_probes();
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > timeout_s_) report_timeout(reqs, n, operation, waited);
      if (waited > 0.01) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  [[noreturn]] void abort(const std::string& message) override {
    log_line(LogLevel::kError, message);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);
  }

  bool threads_may_talk_at_once() const override { return thread_multiple_; }

  void library_all_reduce(float* data, size_t n) override {
    ANVIL_CHECK(n <= static_cast<size_t>(INT_MAX), "MPI_Allreduce of {} floats exceeds MPI's int count", n);
    ANVIL_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
  }

 private:
  PeerRequest post(void* buf, size_t bytes, int peer, int tag, bool send) {
    ANVIL_CHECK(peer >= 0 && peer < size_ && peer != rank_, "rank {} cannot exchange with rank {} (world size {})",
                rank_, peer, size_);
    ANVIL_CHECK(bytes > 0 && bytes <= static_cast<size_t>(INT_MAX), "a message of {} bytes is outside (0, {}]",
                bytes, INT_MAX);
    PeerRequest r;
    r.peer = peer;
    r.is_send = send;
    auto* req = new MPI_Request;
    const int count = static_cast<int>(bytes);
    if (send)
      ANVIL_MPI_CHECK(MPI_Isend(buf, count, MPI_BYTE, peer, tag, MPI_COMM_WORLD, req));
    else
      ANVIL_MPI_CHECK(MPI_Irecv(buf, count, MPI_BYTE, peer, tag, MPI_COMM_WORLD, req));
    r.handle = req;
    return r;
  }

  // A rank that times out asks every other rank whether it is waiting in a collective too; ranks
  // inside wait_all answer (answer_probes), so the ranks that do not answer are the ones that
  // never arrived: stopped, hung, computing far too long, or lost.
  static constexpr int kProbeTag = 0x7a01, kReplyTag = 0x7a02;

  void answer_probes() {
    for (;;) {
      int flag = 0;
      MPI_Status st;
      MPI_Message message;
      // Matched probes: under MPI_THREAD_MULTIPLE both threads may be answering at once.
      if (MPI_Improbe(MPI_ANY_SOURCE, kProbeTag, MPI_COMM_WORLD, &flag, &message, &st) != MPI_SUCCESS || !flag)
        return;
      int token = 0;
      MPI_Mrecv(&token, 1, MPI_INT, &message, MPI_STATUS_IGNORE);
      MPI_Send(&token, 1, MPI_INT, st.MPI_SOURCE, kReplyTag, MPI_COMM_WORLD);
    }
  }

  [[noreturn]] void report_timeout(PeerRequest* reqs, size_t n, const char* operation, double waited) {
    std::vector<int> waiting_for;
    for (size_t i = 0; i < n; i++)
      if (!reqs[i].done && std::find(waiting_for.begin(), waiting_for.end(), reqs[i].peer) == waiting_for.end())
        waiting_for.push_back(reqs[i].peer);
    std::vector<int> token(size_, rank_), reply(size_, -1);
    std::vector<MPI_Request> probes, replies(size_, MPI_REQUEST_NULL);
    for (int p = 0; p < size_; p++) {
      if (p == rank_) continue;
      probes.emplace_back();
      MPI_Isend(&token[p], 1, MPI_INT, p, kProbeTag, MPI_COMM_WORLD, &probes.back());
      MPI_Irecv(&reply[p], 1, MPI_INT, p, kReplyTag, MPI_COMM_WORLD, &replies[p]);
    }
    const auto asked = std::chrono::steady_clock::now();
    std::vector<bool> answered(size_, false);
    answered[rank_] = true;
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - asked).count() < 5.0) {
      answer_probes();
      bool all = true;
      for (int p = 0; p < size_; p++) {
        if (answered[p]) continue;
        int flag = 0;
        MPI_Test(&replies[p], &flag, MPI_STATUS_IGNORE);
        answered[p] = flag != 0;
        all = all && answered[p];
      }
      if (all) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::vector<int> missing;
    for (int p = 0; p < size_; p++)
      if (!answered[p]) missing.push_back(p);
    const std::string who = missing.empty()
                                ? fmt::format("every rank is waiting in a collective (mismatched collectives?)")
                                : fmt::format("rank(s) {} did not arrive (stopped, hung or lost)", fmt::join(missing, ", "));
    abort(fmt::format("{} timed out on rank {} ({}) after {:.0f} s waiting for rank(s) {}; {}. Aborting the job; raise "
                      "dist_timeout if a step legitimately takes longer", operation, rank_, host_, waited,
                      fmt::join(waiting_for, ", "), who));
  }

  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  bool thread_multiple_ = false;
  std::string host_, backend_;
};

}  // namespace

void end_job_on_error(const std::string& message) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  int size = 1, rank = 0;
  if (initialized && !finalized) {
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  }
  if (size <= 1) return;
  char host[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_Get_processor_name(host, &len);
  log_line(LogLevel::kError, fmt::format("rank {} ({}): {}", rank, std::string(host, len), message));
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

std::unique_ptr<Communicator> make_mpi_communicator(const LaunchInfo& li, bool threads_at_once) {
  return std::make_unique<MpiCommunicator>(li, threads_at_once);
}

}  // namespace anvil
