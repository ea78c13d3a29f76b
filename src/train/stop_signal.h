// Stop requests from a scheduler or a user: SIGTERM (SLURM's preemption and time limit, with
// sbatch --signal), SIGINT (Ctrl-C) and SIGUSR1 ask training to finish the step in progress,
// write a checkpoint and exit with kExitStopped; a second SIGINT stops at once. The handlers only
// record the request; the trainer polls it once a step, on every rank together.
#pragma once

namespace anvil {

// EX_TEMPFAIL: the run stopped on request with its work saved, and can be continued
// (autoresume: true) — what a requeued job does.
constexpr int kExitStopped = 75;

void install_stop_handlers();     // idempotent
int stop_requested();             // the first signal received, or 0
const char* signal_name(int signo);

}  // namespace anvil
