// `anvil submit`: a training run as a SLURM batch job. The job script, written into the run
// directory beside the resolved config it trains, runs every task with srun --mpi=pmix, asks
// SLURM for a stop signal before the time limit (anvil saves and exits with kExitStopped, and the
// script requeues the job), and is itself requeueable: a preempted or requeued job continues
// from its newest checkpoint (autoresume), bit for bit.
#pragma once
#include <string>

#include "config/train_config.h"

namespace anvil {

struct SubmitOptions {
  int nodes = 1, tasks_per_node = 1, gpus_per_node = 0;
  std::string time, partition, account;  // "": SLURM's defaults
  int signal_seconds = 120;              // the stop signal comes this long before the time limit
  std::string anvil_path;                // the anvil the job runs
};

// The batch script for training `config_path` (a resolved config with autoresume on).
std::string sbatch_script(const TrainConfig& cfg, const std::string& config_path, const SubmitOptions& opt);

}  // namespace anvil
