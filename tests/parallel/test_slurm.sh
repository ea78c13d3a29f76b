#!/usr/bin/env bash
# Training under a real SLURM cluster (scripts/slurm-local.sh: munge, slurmctld and two slurmd
# nodes on this machine): `srun --mpi=pmix` starts 2 nodes x 2 tasks, which join through Open
# MPI's PMIx support, report the launch in `anvil doctor`, and train to the same weight digest as
# one process; `anvil submit` writes a batch job that, requeued mid-run (as a preemption does),
# saves on SLURM's SIGTERM, starts again and continues to the uninterrupted run's digest.
# Skipped (exit 77) where SLURM is not installed.
# Usage: test_slurm.sh ANVIL_BIN SOURCE_DIR
set -uo pipefail
anvil="$1" src="$2"
source "$src/tests/lib.sh"
for tool in slurmctld slurmd srun munged; do
  command -v "$tool" > /dev/null || [ -x "/usr/sbin/$tool" ] || {
    echo "skipped: $tool is not installed (scripts/setup.sh installs SLURM)"; exit 77; }
done
start_test
chmod 0755 "$tmp"  # munged, running as the munge user, must reach its socket below it
export SLURM_LOCAL_ROOT="$tmp/slurm"
trap '"$src/scripts/slurm-local.sh" down; rm -rf "$tmp"' EXIT
"$src/scripts/slurm-local.sh" up 2 2 > "$tmp/up.out" 2>&1 || { fail "slurm-local up"; cat "$tmp/up.out"; exit 1; }
export SLURM_CONF="$SLURM_LOCAL_ROOT/slurm.conf"
# Both virtual nodes are this machine: Open MPI's shared-memory transport would take tasks of
# different nodes for neighbours and mix their segments, so the tasks talk over TCP, as nodes do.
export OMPI_MCA_btl=tcp,self
tasks=(srun --nodes 2 --ntasks-per-node 2 --mpi=pmix --kill-on-bad-exit=1)

timeout 300 "${tasks[@]}" "$anvil" doctor > "$tmp/doctor.out" 2>&1
grep -q "^launch: srun (SLURM job [0-9]*, 2 node(s), this one 0); rank 0 of 4, local rank 0 of 2, from MPI" \
    "$tmp/doctor.out" && grep -q "all-reduce over 4 rank(s): exact" "$tmp/doctor.out" \
  && pass "anvil doctor under srun: $(grep '^launch' "$tmp/doctor.out")" \
  || { fail "doctor under srun"; tail -20 "$tmp/doctor.out"; }

small_gpt2_vocab "$src" "$tmp/vocab" && prepare_brown_news "$anvil" "$src" "$tmp" 32 "$tmp/vocab" \
  || { fail "data prepare"; exit 1; }
# tests/configs/tiny-gpt2.yaml under ZeRO-2, microbatch 2, 8 steps.
s=("$src/tests/configs/tiny-gpt2.yaml" variables.data="$tmp/data" variables.tokenizer="$tmp/vocab" max_duration=8ba
   device_train_microbatch_size=2 distributed.zero_stage=2)
digest() { "$anvil" inspect "$1" 2> /dev/null | sed -n 's/^weights sha256: //p'; }
"$anvil" train "${s[@]}" run_dir="$tmp/one" > "$tmp/one.out" 2>&1 || { fail "one-process run"; tail "$tmp/one.out"; }
if timeout 600 "${tasks[@]}" "$anvil" train "${s[@]}" run_dir="$tmp/srun" > "$tmp/srun.out" 2>&1; then
  want=$(digest "$tmp/one") got=$(digest "$tmp/srun")
  [ -n "$want" ] && [ "$got" = "$want" ] && grep -q "distributed: 4 ranks (2 on this host) via .*launched by srun" \
      "$tmp/srun/train.log" \
    && pass "srun --mpi=pmix, 2 nodes x 2 tasks, ZeRO-2: the one-process run's digest ${want:0:16}..." \
    || fail "srun run: digest '$got', want '$want'; $(grep 'distributed:' "$tmp/srun/train.log")"
else
  fail "srun training run"; tail -20 "$tmp/srun.out"
fi
# anvil submit: --dry-run prints the batch script and writes nothing.
"$anvil" submit "${s[@]}" run_dir="$tmp/job" --nodes 2 --tasks-per-node 2 --time 10:00 --dry-run > "$tmp/dry.out" 2>&1
grep -q "^#SBATCH --nodes=2$" "$tmp/dry.out" && grep -q "^#SBATCH --ntasks-per-node=2$" "$tmp/dry.out" \
  && grep -q "^#SBATCH --requeue$" "$tmp/dry.out" && grep -q "^#SBATCH --signal=USR1@120$" "$tmp/dry.out" \
  && grep -q "^srun --mpi=pmix" "$tmp/dry.out" && [ ! -e "$tmp/job" ] \
  && pass "anvil submit --dry-run prints the batch script (2 x 2 tasks, --requeue, --signal) and writes nothing" \
  || { fail "submit --dry-run"; cat "$tmp/dry.out"; }

# A submitted job, requeued once it has trained a few steps, continues bit for bit.
steps=40
"$anvil" train "${s[@]}" run_dir="$tmp/one-long" max_duration=${steps}ba > /dev/null 2>&1 || fail "one-process long run"
"$anvil" submit "${s[@]}" run_dir="$tmp/job" max_duration=${steps}ba --nodes 2 --tasks-per-node 2 \
  > "$tmp/submit.out" 2>&1
job=$(sed -n 's/^submitted job \([0-9]*\):.*/\1/p' "$tmp/submit.out")
if [ -n "$job" ]; then
  pass "anvil submit: $(head -1 "$tmp/submit.out")"
  for _ in $(seq 600); do
    [ "$(cat "$tmp/job/metrics.jsonl" 2> /dev/null | grep -c '"loss"')" -ge 5 ] && break
    sleep 0.2
  done
  scontrol requeue "$job"
  for _ in $(seq 300); do [ "$(squeue -h -j "$job" -o %T 2> /dev/null)" = PENDING ] && break; sleep 0.2; done
  scontrol update jobid="$job" StartTime=now  # SLURM holds a requeued job back two minutes
  for _ in $(seq 1500); do [ -z "$(squeue -h -j "$job" 2> /dev/null)" ] && break; sleep 0.2; done
  state=$(scontrol show job "$job" | grep -o "JobState=[A-Z]*")
  log="$tmp/job/slurm-$job.out"
  if grep -q "start 1" "$log" && grep -q "SIGTERM received: stopped after step" "$log" \
     && grep -q "resumed from" "$tmp/job/train.log" && [ "$(digest "$tmp/job")" = "$(digest "$tmp/one-long")" ] \
     && [ -n "$(digest "$tmp/job")" ]; then
    pass "requeued after $(sed -n 's/.*stopped after step \([0-9]*\) .*/\1/p' "$log" | head -1) steps, the job continued to step $steps: the one-process digest ($state)"
  else
    fail "requeue: $state, digest $(digest "$tmp/job") vs $(digest "$tmp/one-long")"; tail -20 "$log"
  fi
else
  fail "anvil submit"; cat "$tmp/submit.out"
fi
exit $((failures > 0))
