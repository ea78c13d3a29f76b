// `anvil train`: the run directory (resolved config, human log, metrics.jsonl, checkpoints),
// the deterministic sample order, the training loop with its progress bar, periodic eval, on
// one process or as one rank of a data-parallel job.
#pragma once
#include <cstdint>
#include <string>

#include "config/train_config.h"
#include "parallel/communicator.h"

namespace anvil {

struct TrainSummary {
  int64_t steps = 0;
  double first_eval_loss = -1;  // -1: none measured before the first step (eval_first false, or a resume)
  double last_eval_loss = -1;   // -1: no eval split
  double final_train_loss = 0;
  int64_t skipped_steps = 0;  // amp_fp16: steps whose gradients overflowed
  std::string checkpoint;
  int stopped_by = 0;  // the signal that stopped the run early, its checkpoint written (stop_signal.h); 0: none
};

// Every rank of comm calls this with the same config; rank 0 writes the run directory. A stop
// signal on any rank (stop_signal.h) ends every rank after the same step, with a checkpoint.
TrainSummary run_training(const TrainConfig& cfg, Communicator& comm);

}  // namespace anvil
