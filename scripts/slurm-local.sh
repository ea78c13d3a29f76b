#!/usr/bin/env bash
# A real SLURM cluster on this one machine, for the tests and for trying `srun`/`sbatch` by hand:
# munge and slurmctld, and N slurmd daemons that each play a node (n1..nN, on ports 17001..),
# all state under one directory and nothing written to /etc (every client reads $SLURM_CONF).
# No cgroups and no systemd are needed. scripts/setup.sh installs slurmctld, slurmd,
# slurm-client and munge.
#
#   scripts/slurm-local.sh up [NODES [CPUS_PER_NODE]]   start; prints the SLURM_CONF to export
#   scripts/slurm-local.sh down                         cancel every job, then stop the daemons
#
# SLURM_LOCAL_ROOT (default /tmp/anvil-slurm) holds the config, keys, spool, logs and pids.
set -euo pipefail
root=${SLURM_LOCAL_ROOT:-/tmp/anvil-slurm}
export SLURM_CONF="$root/slurm.conf"

up() {
  local nodes=${1:-2} cpus=${2:-$(nproc)}
  for tool in munged slurmctld slurmd sinfo; do
    command -v "$tool" > /dev/null || [ -x "/usr/sbin/$tool" ] || {
      echo "slurm-local: $tool is missing (scripts/setup.sh installs slurmctld, slurmd, slurm-client and munge)" >&2
      return 2
    }
  done
  local host mem
  host=$(hostname)
  mem=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
  mkdir -p "$root"/{munge,state,log,run}
  chmod 0755 "$root"  # munged runs as the munge user (the directories above must let it through too)
  # munged runs as the munge user and needs to reach its socket directory.
  chown munge:munge "$root/munge"
  chmod 0755 "$root/munge"
  if [ ! -s "$root/munge/munge.key" ]; then
    head -c 128 /dev/urandom > "$root/munge/munge.key"
    chown munge:munge "$root/munge/munge.key"
    chmod 0400 "$root/munge/munge.key"
  fi
  runuser -u munge -- /usr/sbin/munged --key-file="$root/munge/munge.key" --socket="$root/munge/munge.sock" \
    --pid-file="$root/munge/munged.pid" --log-file="$root/munge/munged.log" --seed-file="$root/munge/munged.seed"

  local node_lines="" i
  for i in $(seq 1 "$nodes"); do
    mkdir -p "$root/spool-n$i" "$root/tmp-n$i"
    node_lines+="NodeName=n$i NodeHostname=$host NodeAddr=127.0.0.1 Port=$((17000 + i)) CPUs=$cpus Sockets=1"
    node_lines+=" CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=$((mem / nodes)) State=UNKNOWN"$'\n'
  done
  cat > "$SLURM_CONF" <<CONF
ClusterName=anvil-local
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$root/munge/munge.sock
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$root/state
SlurmdSpoolDir=$root/spool-%n
TmpFS=$root/tmp-%n
SlurmctldPidFile=$root/run/slurmctld.pid
SlurmdPidFile=$root/run/slurmd-%n.pid
SlurmctldLogFile=$root/log/slurmctld.log
SlurmdLogFile=$root/log/slurmd-%n.log
# Nodes may declare more CPUs than the machine has, so that a test can place 2 tasks on each.
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MailProg=/bin/true
# Jobs start as soon as they can (a requeued job included), not at the next periodic pass.
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
JobRequeue=1
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=10
MinJobAge=300
$node_lines
PartitionName=debug Nodes=n[1-$nodes] Default=YES MaxTime=INFINITE State=UP
CONF
  slurmctld -c -D >> "$root/log/slurmctld.out" 2>&1 &
  echo $! > "$root/run/slurmctld.ours"
  for i in $(seq 1 "$nodes"); do
    slurmd -D -N "n$i" >> "$root/log/slurmd-n$i.out" 2>&1 &
    echo $! > "$root/run/slurmd-n$i.ours"
  done
  for _ in $(seq 1 150); do
    if [ "$(sinfo -h -o %t 2>/dev/null | sort -u)" = idle ]; then
      echo "slurm-local: $nodes node(s) of $cpus CPUs up; export SLURM_CONF=$SLURM_CONF"
      return 0
    fi
    sleep 0.2
  done
  echo "slurm-local: the cluster did not come up; logs in $root/log" >&2
  sinfo -N >&2 || true
  return 1
}

down() {
  # Jobs end first, while slurmd can still stop their steps (its tasks would outlive it).
  if timeout 5 scancel --quiet --user="$(id -un)" 2>/dev/null; then
    for _ in $(seq 1 150); do
      [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.1
    done
  fi
  local pids=() f p
  for f in "$root"/run/slurmd-*.ours "$root/run/slurmctld.ours" "$root/munge/munged.pid"; do
    [ -f "$f" ] && pids+=("$(cat "$f")") && rm -f "$f"
  done
  [ ${#pids[@]} -gt 0 ] || return 0
  kill "${pids[@]}" 2> /dev/null || true
  for _ in $(seq 1 100); do
    local alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2> /dev/null && alive=1; done
    [ $alive = 0 ] && return 0
    sleep 0.1
  done
  for p in "${pids[@]}"; do kill -9 "$p" 2> /dev/null || true; done
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) down ;;
  *) echo "usage: $0 up [NODES [CPUS_PER_NODE]] | down" >&2; exit 2 ;;
esac
