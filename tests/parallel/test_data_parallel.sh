#!/usr/bin/env bash
# Data-parallel training under mpirun, as a user runs it: the same global batch on 1, 2, 3 and 4
# ranks with several microbatch sizes, every ZeRO stage and every all-reduce algorithm ends with
# the same weights, bit for bit, and the same loss at every step (deterministic_mode, the
# default; also with an automatic microbatch and activation checkpointing); with
# deterministic_mode: false (fp32 sums) and with bf16 gradient compression the runs follow the
# same curve to rounding. ZeRO-3 on 4 ranks holds under 40% of the unsharded
# model states; SIGKILL of one rank ends the whole job, within 60 s, naming the lost rank.
# Usage: test_data_parallel.sh ANVIL_BIN SOURCE_DIR
set -uo pipefail
anvil="$1" src="$2"
here="$(cd "$(dirname "$0")" && pwd)"
source "$src/tests/lib.sh"
export OMP_NUM_THREADS=1  # up to 4 ranks share 2 cores
start_test

small_gpt2_vocab "$src" "$tmp/vocab" && prepare_brown_news "$anvil" "$src" "$tmp" 32 "$tmp/vocab" \
  || { echo "FAIL: data prepare"; exit 1; }

# tests/configs/tiny-gpt2.yaml on a global batch of 12 (1, 2, 3, 4 and 6 divide it).
dp=(variables.data="$tmp/data" variables.tokenizer="$tmp/vocab" global_train_batch_size=12 device_eval_batch_size=4
    eval_subset_num_batches=3 seed=3)
# train NAME RANKS OVERRIDES...
train() {
  local name="$1" np="$2"; shift 2
  if ! train_run tiny-gpt2 "$name" "$np" "${dp[@]}" "$@"; then
    fail "$name: training on $np rank(s) failed"; tail -20 "$tmp/$name.out"
  fi
}
train w1 1 device_train_microbatch_size=12
train w2_mb3 2 device_train_microbatch_size=3
train w3_mb4 3 device_train_microbatch_size=4
train w4_mb1 4 device_train_microbatch_size=1
train w4_ring 4 device_train_microbatch_size=3 distributed.all_reduce=ring
train w2_ordered 2 device_train_microbatch_size=6 distributed.all_reduce=rank_ordered
train w4_zero1 4 device_train_microbatch_size=3 distributed.zero_stage=1
train w4_zero2 4 device_train_microbatch_size=1 distributed.zero_stage=2
train w4_zero3 4 device_train_microbatch_size=2 distributed.zero_stage=3
train w3_zero3 3 device_train_microbatch_size=4 distributed.zero_stage=3
train w2_auto_zero3 2 device_train_microbatch_size=auto activation_checkpointing=true distributed.zero_stage=3
train w2_float 2 device_train_microbatch_size=3 deterministic_mode=false
train w2_bf16 2 device_train_microbatch_size=6 deterministic_mode=false distributed.grad_compression=bf16

# Fixed-point gradients: any grouping of the batch gives the same bits.
/usr/bin/python3 "$here/compare_runs.py" 0 "$tmp/w1" "$tmp"/w2_mb3 "$tmp"/w3_mb4 "$tmp"/w4_mb1 "$tmp"/w4_ring \
  "$tmp"/w2_ordered "$tmp"/w4_zero1 "$tmp"/w4_zero2 "$tmp"/w4_zero3 "$tmp"/w3_zero3 "$tmp"/w2_auto_zero3 \
  || fail "runs differ from one rank"
# fp32 sums: rounding compounded through 12 Adam steps (measured: about 2e-7 on the weights).
/usr/bin/python3 "$here/compare_runs.py" 1e-5 "$tmp/w1" "$tmp/w2_float" || fail "fp32-summed run strays from the curve"
# bf16 on the wire changes the math: it must still follow the curve closely.
/usr/bin/python3 "$here/compare_runs.py" 5e-3 "$tmp/w1" "$tmp/w2_bf16" || fail "bf16-compressed run strays from the curve"

# Memory per rank, as the trainer reports it.
for run in w4_mb1 w4_zero1 w4_zero2 w4_zero3; do
  echo "$run: $(grep -m1 'memory per rank' "$tmp/$run/train.log" | sed 's/.*memory per rank: //')"
done
pct=$(grep -m1 'memory per rank' "$tmp/w4_zero3/train.log" | sed 's/.*= \([0-9.]*\)% of unsharded.*/\1/')
awk -v p="$pct" 'BEGIN { exit !(p < 40) }' && echo "ok: ZeRO-3 on 4 ranks holds $pct% of the unsharded model states" \
  || fail "ZeRO-3 on 4 ranks holds '$pct'% of the unsharded model states (want < 40)"

# SIGKILL of rank 2 mid-training: the whole job ends within 60 s and names the lost rank.
train_run tiny-gpt2 killed 4 "${dp[@]}" max_duration=100000ba device_train_microbatch_size=3 dist_timeout=30 &
job=$!
for _ in $(seq 1 300); do
  [ -f "$tmp/killed/metrics.jsonl" ] && [ "$(grep -c '"loss"' "$tmp/killed/metrics.jsonl")" -ge 3 ] && break
  sleep 0.2
done
victim=""
for pid in $(pgrep -f "run_dir=$tmp/killed"); do
  environment=$(tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null)
  if grep -qx "OMPI_COMM_WORLD_RANK=2" <<< "$environment"; then victim=$pid; fi
done
if [ -z "$victim" ]; then
  fail "SIGKILL: rank 2 of the job was not found"; kill "$job" 2>/dev/null
else
  start=$(date +%s)
  kill -9 "$victim"
  wait "$job"; rc=$?
  secs=$(( $(date +%s) - start ))
  if [ "$rc" -ne 0 ] && [ "$secs" -le 60 ] && grep -q "rank 2" "$tmp/killed.out"; then
    echo "ok: SIGKILL of rank 2 ended the job in ${secs} s (exit $rc): $(grep -m1 'rank 2' "$tmp/killed.out")"
  else
    fail "SIGKILL: exit $rc after ${secs} s"; tail -20 "$tmp/killed.out"
  fi
fi
[ "$failures" -eq 0 ]
