#include "cli/submit.h"

#include <cctype>

#include <fmt/format.h>

#include "core/error.h"
#include "train/stop_signal.h"

namespace anvil {
namespace {

// A word for the shell, single-quoted.
std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

std::string sbatch_script(const TrainConfig& cfg, const std::string& config_path, const SubmitOptions& opt) {
  ANVIL_CHECK(opt.nodes >= 1 && opt.tasks_per_node >= 1 && opt.gpus_per_node >= 0,
              "--nodes and --tasks-per-node must be positive, --gpus-per-node not negative");
  ANVIL_CHECK(opt.signal_seconds >= 10, "--signal-seconds must leave at least 10 s to save a checkpoint");
  const std::string log = cfg.run_dir + "/slurm-%j.out";
  std::string s = "#!/bin/bash\n";
  s += fmt::format("# Written by anvil submit: train {} ({}) on {} node(s) x {} task(s).\n", cfg.run_name,
                   config_path, opt.nodes, opt.tasks_per_node);
  std::string job_name = cfg.run_name.empty() ? "anvil" : cfg.run_name;
  for (char& c : job_name)  // an #SBATCH line ends at whitespace
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') c = '-';
  s += fmt::format("#SBATCH --job-name={}\n", job_name);
  s += fmt::format("#SBATCH --nodes={}\n#SBATCH --ntasks-per-node={}\n", opt.nodes, opt.tasks_per_node);
  if (opt.gpus_per_node > 0) s += fmt::format("#SBATCH --gpus-per-node={}\n", opt.gpus_per_node);
  if (!opt.time.empty()) s += fmt::format("#SBATCH --time={}\n", opt.time);
  if (!opt.partition.empty()) s += fmt::format("#SBATCH --partition={}\n", opt.partition);
  if (!opt.account.empty()) s += fmt::format("#SBATCH --account={}\n", opt.account);
  s += fmt::format("#SBATCH --output={}\n#SBATCH --open-mode=append\n", log);
  s += "# Requeued jobs (preemption, scontrol requeue) start again and continue from the newest checkpoint.\n";
  s += "#SBATCH --requeue\n";
  s += fmt::format("# SIGUSR1 to every task {} s before the time limit: anvil saves a checkpoint and exits {}.\n",
                   opt.signal_seconds, kExitStopped);
  s += fmt::format("#SBATCH --signal=USR1@{}\n\n", opt.signal_seconds);
  s += "echo \"anvil submit: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, start ${SLURM_RESTART_COUNT:-0}\"\n";
  s += fmt::format("srun --mpi=pmix --kill-on-bad-exit=1 {} train {}\n", quoted(opt.anvil_path), quoted(config_path));
  s += "status=$?\n";
  s += fmt::format("if [ $status -eq {} ]; then\n", kExitStopped);
  s += "  # Stopped with its work saved (the time limit's signal): continue in a new allocation.\n";
  s += "  scontrol requeue \"$SLURM_JOB_ID\"\n";
  s += "fi\n";
  s += "exit $status\n";
  return s;
}

}  // namespace anvil
