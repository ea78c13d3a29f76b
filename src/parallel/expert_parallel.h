// Expert parallelism's layout of the job: the W ranks in groups of R consecutive ranks (rank
// g·R + i is member i of group g), each group sharing one set of experts, member i running experts
// [i·E/R, (i+1)·E/R) for the group's tokens (model/model.h: ExpertExchange) and holding their
// weights alone (model/tensor_parallel.h: expert_share_config). Every rank keeps its data-parallel
// place: it takes its own block of the global batch. The ranks with the same i hold the same
// experts and form a data-parallel group, which reduces their gradients and shards their
// parameters and optimizer states (ZeRO) as data parallelism does a whole model's. The rest of the
// model is every rank's, so its gradient is summed over the R members too, once the data-parallel
// group has summed it (parallel/gradient_reduction.h); all these sums are of fixed-point
// integers, so the weights are one process's whatever R.
#pragma once

#include <cstdint>
#include <memory>

#include "config/model_config.h"
#include "model/model.h"
#include "parallel/communicator.h"

namespace anvil {

class ExpertGroup final : public ExpertExchange {
 public:
  explicit ExpertGroup(std::unique_ptr<Communicator> comm) : comm_(std::move(comm)) {}

  int ranks() const override { return comm_->size(); }
  int rank() const override { return comm_->rank(); }
  void exchange(const std::vector<Message>& sends, const std::vector<Message>& receives, const char* what) override;
  int64_t bytes_sent() const override { return bytes_sent_; }
  Communicator& comm() { return *comm_; }

 private:
  std::unique_ptr<Communicator> comm_;
  int64_t bytes_sent_ = 0;
  std::vector<PeerRequest> requests_;
};

struct ExpertGroups {
  ModelConfig model;        // the whole model whose experts the groups share
  int ranks = 1, rank = 0;  // in the expert group
  std::unique_ptr<ExpertGroup> experts;  // the R ranks that share the experts
  std::unique_ptr<Communicator> data;    // the W / R ranks holding this rank's experts
};

// The groups of `ranks` over world's ranks for cfg's model. Fails unless R divides the ranks and
// the experts, and (with more than one) two threads may talk at once: the exchanges run on the
// training thread while the communication thread reduces gradients.
ExpertGroups make_expert_groups(Communicator& world, const ModelConfig& cfg, int ranks);

}  // namespace anvil
