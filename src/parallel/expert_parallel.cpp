#include "parallel/expert_parallel.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/error.h"

namespace anvil {
namespace {
// Apart from the collectives' tags and the pipeline's, so that the training thread's exchanges
// never match the communication thread's messages between the same two ranks.
constexpr int kTagExperts = 0x5a10;
}  // namespace

ExpertGroups make_expert_groups(Communicator& world, const ModelConfig& cfg, int ranks) {
  const int W = world.size(), R = ranks;
  ANVIL_CHECK(R >= 1 && W % R == 0, "distributed.expert_parallel {} does not divide the {} ranks: the experts are "
              "shared by groups of that many consecutive ranks", R, W);
  ANVIL_CHECK(cfg.has_moe() && cfg.moe.experts % R == 0, "distributed.expert_parallel {} must divide the {} experts, "
              "which its ranks share evenly", R, cfg.moe.experts);
  ANVIL_CHECK(R == 1 || world.threads_may_talk_at_once(), "distributed.expert_parallel exchanges the experts' rows "
              "while gradients are reduced, from two threads at once, and this MPI library does not provide "
              "MPI_THREAD_MULTIPLE");
  ExpertGroups g;
  g.model = cfg;
  g.ranks = R;
  g.rank = world.rank() % R;
  std::vector<int> members(R), holders(W / R);
  std::iota(members.begin(), members.end(), world.rank() / R * R);
  for (int d = 0; d < W / R; d++) holders[d] = d * R + g.rank;
  g.experts = std::make_unique<ExpertGroup>(make_group_communicator(world, members));
  g.data = make_group_communicator(world, holders);
  return g;
}

void ExpertGroup::exchange(const std::vector<Message>& sends, const std::vector<Message>& receives, const char* what) {
  const int me = comm_->rank();
  requests_.clear();
  for (const Message& m : receives)
    if (m.peer != me && m.bytes > 0) requests_.push_back(comm_->irecv(m.data, m.bytes, m.peer, kTagExperts));
  auto own = receives.begin();
  for (const Message& m : sends) {
    if (m.peer != me) {
      if (m.bytes > 0) requests_.push_back(comm_->isend(m.data, m.bytes, m.peer, kTagExperts));
      bytes_sent_ += static_cast<int64_t>(m.bytes);
      continue;
    }
    own = std::find_if(own, receives.end(), [&](const Message& r) { return r.peer == me; });
    ANVIL_CHECK(own != receives.end() && own->bytes == m.bytes, "{}: this rank's message to itself of {} bytes has "
                "no receive of that size", what, m.bytes);
    if (m.bytes > 0) std::memcpy(own->data, m.data, m.bytes);
    ++own;
  }
  comm_->wait_all(requests_.data(), requests_.size(), what);
}

}  // namespace anvil
