#include "parallel/tensor_parallel.h"

#include <numeric>

#include "core/error.h"
#include "model/tensor_parallel.h"
#include "parallel/collectives.h"

namespace anvil {
namespace {
// Apart from the collectives' tags, the pipeline's and the experts', so that the chains never
// match another thread's messages between the same two ranks.
constexpr int kTagChain = 0x5a20;
}  // namespace

void TensorGroup::send(int to, const float* data, size_t n) {
  sends_.push_back(comm_->isend(data, n * sizeof(float), to, kTagChain));
}

void TensorGroup::receive(int from, float* data, size_t n) {
  PeerRequest r = comm_->irecv(data, n * sizeof(float), from, kTagChain);
  comm_->wait_all(&r, 1, "tensor parallelism: a partial sum from the previous rank");
}

void TensorGroup::wait_sends() {
  comm_->wait_all(sends_.data(), sends_.size(), "tensor parallelism: a partial sum to the next rank");
  sends_.clear();
}

void TensorGroup::broadcast(float* data, size_t n, int root) {
  anvil::broadcast(*comm_, data, n * sizeof(float), root);
}

void TensorGroup::all_gather(float* data, const std::vector<size_t>& counts) {
  anvil::all_gather(*comm_, data, counts);
}

TensorGroups make_tensor_groups(Communicator& world, const ModelConfig& cfg, int ranks) {
  const int W = world.size(), N = ranks;
  ANVIL_CHECK(N >= 1 && W % N == 0, "distributed.tensor_parallel {} does not divide the {} ranks: each copy of the "
              "model is shared by that many consecutive ranks", N, W);
  const std::string problem = tensor_parallel_problem(cfg, N);
  ANVIL_CHECK(problem.empty(), "distributed.tensor_parallel: {}", problem);
  ANVIL_CHECK(N == 1 || world.threads_may_talk_at_once(), "distributed.tensor_parallel passes partial sums while "
              "gradients are reduced, from two threads at once, and this MPI library does not provide "
              "MPI_THREAD_MULTIPLE");
  TensorGroups g;
  g.model = cfg;
  g.ranks = N;
  g.rank = world.rank() % N;
  std::vector<int> tensor(N), data(W / N);
  std::iota(tensor.begin(), tensor.end(), world.rank() / N * N);
  for (int d = 0; d < W / N; d++) data[d] = d * N + g.rank;
  g.tensor = std::make_unique<TensorGroup>(make_group_communicator(world, tensor));
  g.data = make_group_communicator(world, data);
  return g;
}

void gather_shares(Communicator& group, const ModelConfig& whole, const std::vector<ModelConfig>& shares,
                   const float* mine, size_t lo, size_t hi, float* out) {
  ANVIL_CHECK(shares.size() == static_cast<size_t>(group.size()), "internal: {} shares for a group of {} ranks",
              shares.size(), group.size());
  // The shares may differ in size (tensor parallelism's slices of the vocabulary): each rank's
  // goes out in turn.
  std::vector<float> buffer;
  for (int r = 0; r < group.size(); r++) {
    const size_t n = model_num_params(shares[r]);
    if (r == group.rank())
      buffer.assign(mine, mine + n);
    else
      buffer.resize(n);
    broadcast(group, buffer.data(), n * sizeof(float), r);
    put_share_range(whole, shares[r], buffer.data(), lo, hi, out);
  }
}

}  // namespace anvil
