// Expert parallelism's layout of the job: the W ranks in groups of R consecutive ranks (rank
// g·R + i is member i of group g), each group sharing one set of experts, member i running experts
// [i·E/R, (i+1)·E/R) for the group's tokens (model/model.h: ExpertExchange). Every rank still holds
// the whole model's parameters and its data-parallel place: a rank's gradient for the experts it
// does not run is zero, and the data-parallel reduction over all W ranks sums every rank's
// contributions, so the weights are one process's whatever R.
#pragma once

#include <cstdint>
#include <memory>

#include "model/model.h"
#include "parallel/communicator.h"

namespace anvil {

class ExpertGroup final : public ExpertExchange {
 public:
  // Fails unless R divides the ranks and two threads may talk at once (the exchange runs on the
  // training thread while the communication thread reduces gradients).
  ExpertGroup(Communicator& world, int ranks_per_group);

  int ranks() const override { return comm_->size(); }
  int rank() const override { return comm_->rank(); }
  void exchange(const std::vector<Message>& sends, const std::vector<Message>& receives, const char* what) override;
  int64_t bytes_sent() const override { return bytes_sent_; }

 private:
  std::unique_ptr<Communicator> comm_;
  int64_t bytes_sent_ = 0;
  std::vector<PeerRequest> requests_;
};

}  // namespace anvil
