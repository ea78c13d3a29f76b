// The parameter half of data parallelism (parallel/data_parallel.h describes the stages): under
// ZeRO-3 each rank keeps its shard and gathers a unit just before the model uses it (the next one
// fetched ahead, the embeddings in a buffer of their own); below that the parameters are the
// model's own full array, all-gathered after each optimizer step where the stage shards it.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/buffer.h"
#include "parallel/data_parallel_context.h"

namespace anvil {

struct MemoryReport;

class ParamShards {
 public:
  explicit ParamShards(const DataParallelContext& ctx);

  void add_memory(MemoryReport& m) const;

  // What this rank updates: [shards.lo, shards.hi) of the parameters.
  float* owned();
  // Initial parameters from the seed (each rank computes what it holds).
  void init(uint64_t seed);
  // After the optimizer has updated what this rank owns: every rank's updates where the stage
  // needs the parameters whole (ZeRO-1/2), or the gathered units marked stale (ZeRO-3).
  void share_update();
  // A copy of [lo, hi) (within this rank's shard) to the host.
  void copy_to_host(size_t lo, size_t hi, float* out);
  // The full parameters (n of them), of which each rank keeps what its stage holds.
  void load(const float* params);

  // UnitAccess's parameter half.
  const float* acquire(int unit, int next_unit);
  void release(int unit);

 private:
  struct Slot {
    OpArray<float> buf;
    int unit = -1;        // whose parameters it holds (or will, once ticket is done)
    bool in_use = false;  // acquired
    uint64_t ticket = 0;  // the gather that fills it
  };
  Slot* find_slot(int unit);
  Slot& free_slot(int unit);
  void start_gather(Slot& slot, int unit);
  void mark_stale();

  DataParallelContext ctx_;
  const KernelImpl impl_;  // the model's: where its arrays live and what runs on them
  const std::vector<ParamUnit>& units_;
  OpArray<float> shard_;  // ZeRO-3
  Slot emb_slot_, block_slots_[2];
};

}  // namespace anvil
