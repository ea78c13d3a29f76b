// Tensor parallelism's layout of the job: W ranks as D = W / N tensor groups of N consecutive
// ranks (rank d·N + r is rank r of tensor group d), each holding one copy of the model cut N ways
// (model/tensor_parallel.h). The ranks with the same r form a data-parallel group of D, which
// trains rank r's share as data parallelism trains a whole model: each tensor group takes its own
// block of the global batch, every rank of it the same block. Under pipeline parallelism the W
// ranks are a stage's, and the stage's model is cut so.
//
// What the ranks of a tensor group must agree on, so that the weights are one process's to the
// bit: each tensor's fixed-point gradient scale, from the largest gradient of the whole tensor
// (the largest of its shares'); and the gradient norm, which sums a cut tensor's integer squares
// over its shares and counts a tensor every rank holds once (parallel/gradient_reduction.h).
#pragma once
#include <memory>
#include <vector>

#include "config/model_config.h"
#include "model/model.h"
#include "parallel/communicator.h"

namespace anvil {

// A tensor group's messages over MPI: the chains' sends and receives (with a tag of their own),
// and the broadcasts of their results.
class TensorGroup final : public TensorExchange {
 public:
  explicit TensorGroup(std::unique_ptr<Communicator> comm) : comm_(std::move(comm)) {}
  int ranks() const override { return comm_->size(); }
  int rank() const override { return comm_->rank(); }
  void send(int to, const float* data, size_t n) override;
  void receive(int from, float* data, size_t n) override;
  void wait_sends() override;
  void broadcast(float* data, size_t n, int root) override;
  void all_gather(float* data, const std::vector<size_t>& counts) override;
  Communicator& comm() { return *comm_; }

 private:
  std::unique_ptr<Communicator> comm_;
  std::vector<PeerRequest> sends_;
};

struct TensorGroups {
  ModelConfig model;        // the whole model whose copies the groups share
  int ranks = 1, rank = 0;  // in the tensor group
  std::unique_ptr<TensorGroup> tensor;   // the N ranks that share a copy of the model
  std::unique_ptr<Communicator> data;    // the D ranks with this rank's r
};

// The groups of `ranks` over world's ranks for cfg's model. Fails unless the ranks divide the job
// and cfg's blocks (tensor_parallel_problem), and (with more than one) two threads may talk at once:
// the training thread's chains run while the communication thread reduces gradients.
TensorGroups make_tensor_groups(Communicator& world, const ModelConfig& cfg, int ranks);

// Every rank's share of an array (this rank's, mine: model_param_layout(shares[group.rank()])
// order; shares: the group's ranks' share configs, tensor or expert parallelism's) into the range
// [lo, hi) of the whole array (model_param_layout(whole) order) at out, on every rank of the
// group: a collective of group.
void gather_shares(Communicator& group, const ModelConfig& whole, const std::vector<ModelConfig>& shares,
                   const float* mine, size_t lo, size_t hi, float* out);

}  // namespace anvil
