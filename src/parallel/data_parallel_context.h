// What the parameter and gradient halves of data parallelism (parallel/param_shards.h,
// parallel/gradient_reduction.h) share.
#pragma once

#include "model/model.h"
#include "parallel/comm_thread.h"
#include "parallel/communicator.h"
#include "parallel/op_collectives.h"
#include "parallel/shard_layout.h"

namespace anvil {

struct DataParallelOptions;

// What the two halves of data parallelism share: the group, the model, the layout of its shards,
// and the one communication thread whose jobs every rank issues in the same order.
struct DataParallelContext {
  Communicator& comm;
  Model& model;
  const DataParallelOptions& options;
  const ShardLayout& shards;
  CommThread& thread;
  OpCollectives& collectives;
};

}  // namespace anvil
