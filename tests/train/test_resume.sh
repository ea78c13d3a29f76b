#!/usr/bin/env bash
# Checkpoints and resume, as a user runs them:
# - save_interval and save_num_checkpoints_to_keep; `anvil inspect` verifies and digests;
# - stop at step 7 and autoresume to step 20 on the same world size: the same weight digest as the
#   uninterrupted run, bit for bit;
# - stop at step 7 on 2 ranks (ZeRO-1), resume on 4 ranks (ZeRO-3, another microbatch size) with
#   load_path: the uninterrupted one-rank run's losses and weight digest, bit for bit;
# - a weights-only fine-tune (load_path, load_weights_only) stopped and autoresumed continues from
#   its own checkpoint, not from load_path: the uninterrupted fine-tune's digest;
# - SIGKILL half-way through writing a checkpoint, then autoresume: the previous checkpoint is
#   used and the final digest is still the same;
# - SIGTERM to one rank of a 2-rank run, as a scheduler preempts it: every rank finishes the
#   step, the checkpoint is written, the exit status is 75, and autoresume continues bit for bit;
# - a full disk (a 1 MiB tmpfs as save_folder): the save fails naming the file and the bytes it
#   needs, the previous checkpoint stays whole and `latest`, and the run stops (save_failure:
#   stop) or trains on to the end (continue); a read-only one stops the run the same way;
# - a corrupt newest checkpoint is reported and skipped by autoresume; truncated, newer-format
#   checkpoints and one missing a rank's shard file, given by load_path, are one-line errors.
# Usage: test_resume.sh ANVIL_BIN SOURCE_DIR
set -uo pipefail
anvil="$1" src="$2"
source "$src/tests/lib.sh"
export OMP_NUM_THREADS=1
start_test

small_gpt2_vocab "$src" "$tmp/vocab" && prepare_brown_news "$anvil" "$src" "$tmp" 32 "$tmp/vocab" \
  || { echo "FAIL: data prepare"; exit 1; }
# tests/configs/tiny-gpt2.yaml for 20 steps, a checkpoint every 5.
r=(variables.data="$tmp/data" variables.tokenizer="$tmp/vocab" train_loader.num_workers=1 max_duration=20ba
   scheduler.t_max=20ba save_interval=5ba)
# run NAME RANKS OVERRIDES...: train; the run's output is in NAME.out.
run() {
  local name="$1" np="$2"; shift 2
  train_run tiny-gpt2 "$name" "$np" "${r[@]}" "$@"
}
digest() { "$anvil" inspect "$1" 2>/dev/null | sed -n 's/^weights sha256: //p'; }

# Uninterrupted, keeping the newest two checkpoints.
run full 1 save_num_checkpoints_to_keep=2 || { fail "uninterrupted run"; tail "$tmp/full.out"; }
kept=$(ls "$tmp/full/checkpoints" | grep -c '^step-')
[ "$kept" -eq 2 ] && [ -d "$tmp/full/checkpoints/step-00000020" ] && [ -d "$tmp/full/checkpoints/step-00000015" ] \
  && pass "save_interval 5ba, keep 2: $(ls "$tmp/full/checkpoints" | tr '\n' ' ')" || fail "kept checkpoints: $(ls "$tmp/full/checkpoints")"
want=$(digest "$tmp/full")
[ -n "$want" ] && pass "inspect: $("$anvil" inspect "$tmp/full" | grep -E '^step')" || fail "inspect gave no digest"

# Stop at 7, autoresume to 20 on one rank: bit for bit.
run same 1 max_duration=7ba && run same 1 autoresume=true || { fail "stop/resume on one rank"; tail "$tmp/same.out"; }
got=$(digest "$tmp/same")
grep -q "resumed from .*step-00000007" "$tmp/same.out" && [ "$got" = "$want" ] \
  && pass "stop at 7, autoresume to 20: digest $got equals the uninterrupted run's" \
  || fail "same-size resume: digest $got, want $want"
steps=$(grep -c '"loss"' "$tmp/same/metrics.jsonl")
[ "$steps" -eq 20 ] && pass "metrics.jsonl holds each of the 20 steps once" || fail "metrics.jsonl has $steps step rows"

# Stop at 7 on 2 ranks (ZeRO-1), resume on 4 ranks (ZeRO-3, microbatch 1) through load_path.
if have_mpirun; then
  run w2 2 max_duration=7ba distributed.zero_stage=1 || { fail "2-rank run"; tail "$tmp/w2.out"; }
  run w4 4 load_path="$tmp/w2/checkpoints/step-00000007" distributed.zero_stage=3 device_train_microbatch_size=1 \
    || { fail "4-rank resume"; tail "$tmp/w4.out"; }
  cp "$tmp"/w2/metrics.jsonl "$tmp/w2w4.jsonl"; grep '"loss"' "$tmp/w4/metrics.jsonl" >> "$tmp/w2w4.jsonl"
  mkdir -p "$tmp/w2w4"; mv "$tmp/w2w4.jsonl" "$tmp/w2w4/metrics.jsonl"; cp -r "$tmp/w4/checkpoints" "$tmp/w2w4/"
  /usr/bin/python3 "$src/tests/parallel/compare_runs.py" 0 "$tmp/full" "$tmp/w2w4" \
    && pass "2 ranks to step 7, then 4 ranks with ZeRO-3 to step 20: the uninterrupted run's bits" \
    || fail "resume across world sizes strays from the uninterrupted run"
else
  skip "resume across world sizes (no mpirun)"
fi

# A fine-tune from load_path's weights (load_weights_only) stopped at 7 and restarted with
# autoresume continues from its own step 7, not from load_path again: the digest of an
# uninterrupted fine-tune (as in Composer, autoresume wins over load_path).
ft=(load_path="$tmp/full/checkpoints/step-00000015" load_weights_only=true autoresume=true max_duration=10ba)
run ft_full 1 "${ft[@]}" && run ft_cut 1 "${ft[@]}" max_duration=7ba && run ft_cut 1 "${ft[@]}" \
  || { fail "weights-only fine-tunes"; tail "$tmp/ft_cut.out"; }
ft_want=$(digest "$tmp/ft_full") ft_got=$(digest "$tmp/ft_cut")
grep -q "resumed from .*ft_cut/checkpoints/step-00000007" "$tmp/ft_cut.out" && [ -n "$ft_want" ] && [ "$ft_got" = "$ft_want" ] \
  && pass "a weights-only fine-tune stopped at 7 autoresumes from its own checkpoint: the uninterrupted digest" \
  || fail "fine-tune autoresume: digest $ft_got, want $ft_want"

# SIGKILL in the middle of writing step 10's checkpoint, then autoresume.
ANVIL_FAULT_KILL_IN_SAVE=10 run killed 1
listing=$(ls -a "$tmp/killed/checkpoints")
grep -q '^\.step-00000010\.tmp' <<< "$listing" && [ ! -d "$tmp/killed/checkpoints/step-00000010" ] \
  && [ "$(cat "$tmp/killed/checkpoints/latest")" = "step-00000005" ] \
  && pass "killed while saving step 10: only a temporary directory, latest still step-00000005" \
  || fail "after the kill: $(ls -a "$tmp/killed/checkpoints" | tr '\n' ' ')"
run killed 1 autoresume=true || { fail "autoresume after the kill"; tail "$tmp/killed.out"; }
got=$(digest "$tmp/killed")
grep -q "resumed from .*step-00000005" "$tmp/killed.out" && [ "$got" = "$want" ] \
  && ! grep -q 'tmp' <<< "$(ls -a "$tmp/killed/checkpoints")" \
  && pass "autoresume from step 5 after the kill: same digest, temporary directory cleaned" \
  || fail "after kill + autoresume: digest $got, want $want"

# A corrupt newest checkpoint: autoresume reports it and falls back to the one before.
run corrupt 1 max_duration=10ba || fail "run to 10"
shard="$tmp/corrupt/checkpoints/step-00000010/shard-00000-of-00001.safetensors"  # a byte of wte, stored last:
printf '\x01' | dd of="$shard" bs=1 seek=$(( $(stat -c %s "$shard") - 2000 )) conv=notrunc 2>/dev/null
run corrupt 1 autoresume=true || { fail "autoresume past a corrupt checkpoint"; tail "$tmp/corrupt.out"; }
got=$(digest "$tmp/corrupt")
grep -q "autoresume: skipping .*step-00000010.*does not match its checksum" "$tmp/corrupt.out" \
  && grep -q "resumed from .*step-00000005" "$tmp/corrupt.out" && [ "$got" = "$want" ] \
  && pass "autoresume skipped the corrupt step 10, resumed from 5, same digest" \
  || fail "corrupt fallback: digest $got, want $want"

# load_path on damaged checkpoints: one clear line, exit 1.
bad="$tmp/bad"; cp -r "$tmp/full/checkpoints/step-00000020" "$bad"
truncate -s 1000 "$bad/shard-00000-of-00001.safetensors"
expect_error "truncated checkpoint" "shard-00000-of-00001.safetensors.* is truncated" \
  "$anvil" train "$src/tests/configs/tiny-gpt2.yaml" "${r[@]}" run_dir="$tmp/t1" load_path="$bad"
if have_mpirun; then
  cp -r "$tmp/w2/checkpoints/step-00000007" "$tmp/bad2"; rm "$tmp/bad2/shard-00001-of-00002.safetensors"
  expect_error "missing shard" "shard file 'shard-00001-of-00002.safetensors' is missing" \
    "$anvil" train "$src/tests/configs/tiny-gpt2.yaml" "${r[@]}" run_dir="$tmp/t2" load_path="$tmp/bad2"
fi
cp -r "$tmp/full/checkpoints/step-00000020" "$tmp/bad3"; sed -i 's/"version": [0-9]*/"version": 99/' "$tmp/bad3/manifest.json"
expect_error "newer format" "format version 99, newer than this anvil reads" "$anvil" inspect "$tmp/bad3"
# Preemption: SIGTERM to one rank (the newest process of the job) once a few steps are done.
if have_mpirun; then
  run sig 2 max_duration=100000ba &
  job=$!
  for _ in $(seq 600); do
    steps=$(grep -c '"loss"' "$tmp/sig/metrics.jsonl" 2>/dev/null); [ "${steps:-0}" -ge 3 ] && break
    sleep 0.1
  done
  pkill -TERM -n -f "run_dir=$tmp/sig .*max_duration=100000ba"
  wait "$job"; rc=$?
  k=$(sed -n 's/^stopped by SIGTERM after step \([0-9]*\);.*/\1/p' "$tmp/sig.out")
  if [ "$rc" -eq 75 ] && [ -n "$k" ] && [ -d "$tmp/sig/checkpoints/step-$(printf %08d "$k")" ]; then
    pass "SIGTERM to one of 2 ranks: both stopped after step $k with its checkpoint, exit status 75"
    end=$((k + 3))
    run sig 2 autoresume=true max_duration=${end}ba || fail "autoresume after SIGTERM"
    run sig_full 2 max_duration=${end}ba || fail "uninterrupted run to $end"
    [ -n "$(digest "$tmp/sig")" ] && [ "$(digest "$tmp/sig")" = "$(digest "$tmp/sig_full")" ] \
      && pass "autoresume after the SIGTERM to step $end: the uninterrupted run's digest" \
      || fail "after SIGTERM: digest $(digest "$tmp/sig"), want $(digest "$tmp/sig_full")"
  else
    fail "SIGTERM: exit status $rc, stopped after '$k'"; tail -5 "$tmp/sig.out"
  fi
else
  skip "SIGTERM to one of 2 ranks (no mpirun)"
fi

# A full disk: a 1 MiB tmpfs holds the step-5 checkpoint (about 0.7 MiB) but not the next.
full="$tmp/full-disk"
mkdir -p "$full"
if mount -t tmpfs -o size=1m anvil-test "$full" 2> /dev/null; then
  trap 'umount "$full" 2> /dev/null; rm -rf "$tmp"' EXIT
  run nospace 1 save_folder="$full/stop"
  rc=$?
  latest=$(cat "$full/stop/latest" 2> /dev/null)
  if [ $rc -eq 1 ] && grep -q "No space left on device; the file needs [0-9]* bytes" "$tmp/nospace.out" \
     && [ "$latest" = step-00000005 ] && [ -n "$(digest "$full/stop/step-00000005")" ] \
     && [ -z "$(ls -A "$full/stop" | grep -v '^step-00000005$\|^latest$')" ]; then
    pass "full disk, save_failure stop: exit 1, $(grep -o "cannot write.*" "$tmp/nospace.out" | head -1 | cut -c1-60)...; step 5 intact and latest, nothing else left"
  else
    fail "full disk (stop): exit $rc, latest '$latest', left: $(ls -A "$full/stop")"; tail -3 "$tmp/nospace.out"
  fi
  rm -rf "$full/stop"
  run nospace_go 1 save_folder="$full/go" save_failure=continue
  rc=$?
  if [ $rc -eq 0 ] && [ "$(grep -c '"loss"' "$tmp/nospace_go/metrics.jsonl")" -eq 20 ] \
     && [ "$(grep -c "was not saved: cannot write" "$tmp/nospace_go/train.log")" -eq 3 ] \
     && [ "$(cat "$full/go/latest")" = step-00000005 ] && [ -n "$(digest "$full/go/step-00000005")" ]; then
    pass "full disk, save_failure continue: 20 steps trained, steps 10, 15, 20 not saved and reported, step 5 still latest"
  else
    fail "full disk (continue): exit $rc, latest '$(cat "$full/go/latest")'"; tail -5 "$tmp/nospace_go.out"
  fi
  # The same directory made read-only: an autoresumed run loads step 5, then cannot save.
  mount -o remount,ro "$full"
  run nospace_go 1 save_folder="$full/go" autoresume=true max_duration=25ba
  rc=$?
  [ $rc -eq 1 ] && grep -q "Read-only file system" "$tmp/nospace_go.out" && [ "$(cat "$full/go/latest")" = step-00000005 ] \
    && pass "read-only save_folder: $(grep -o "error: .*" "$tmp/nospace_go.out" | cut -c1-90)..." \
    || { fail "read-only save_folder: exit $rc"; tail -3 "$tmp/nospace_go.out"; }
  umount "$full"
else
  echo "skipped: full-disk checks (mounting a tmpfs needs root)"
fi

expect_error "existing run without autoresume" "continue it with autoresume=true" "$anvil" train "$src/tests/configs/tiny-gpt2.yaml" "${r[@]}" run_dir="$tmp/full"
[ "$failures" -eq 0 ]
