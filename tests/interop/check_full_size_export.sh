#!/usr/bin/env bash
# The interop issue's full-size check, run by hand (a few minutes; not part of CTest): GPT-2 124M
# (configs/bench-124m.yaml) and the 153M Llama of configs/llama-125m.yaml, each trained 2 steps on
# 2 ranks under ZeRO-3 (a sharded checkpoint), exported and imported back:
# - anvil eval of the checkpoint, of the export and of the import give the same loss, and the
#   independent reader (hf_reference.py) computes the export's loss to 1e-5;
# - export's peak memory (resident set) stays below the model's fp32 size: it streams tensor by
#   tensor instead of gathering the shards.
# Usage: check_full_size_export.sh ANVIL_BIN SOURCE_DIR DATASET_DIR (128-token samples, as
# scripts/demo.sh prepares data/brown)
set -uo pipefail
anvil="$(realpath "$1")" src="$(realpath "$2")" data="$(realpath "$3")"
source "$src/tests/lib.sh"
start_test
reader=(/usr/bin/python3 "$src/tests/interop/hf_reference.py")
# peak_rss_mib CMD...: runs CMD and prints its peak resident set in MiB.
peak_rss_mib() {
  /usr/bin/python3 -c 'import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024 if r.returncode == 0 else "failed")' "$@"
}
loss() { /usr/bin/python3 -c 'import json, sys; print(json.loads(sys.argv[1])["loss"])' "$1"; }
close() { /usr/bin/python3 -c 'import sys; a, b, t = map(float, sys.argv[1:]); sys.exit(0 if abs(a - b) <= t * abs(b) else 1)' "$@"; }

for config in bench-124m llama-125m; do
  run="$tmp/$config"
  mpirun_anvil 2 "$anvil" train "$src/configs/$config.yaml" run_dir="$run" max_seq_len=128 \
    train_loader.dataset.local="$data" eval_loader.dataset.local="$data" eval_interval=2ba max_duration=2ba \
    global_train_batch_size=4 device_train_microbatch_size=1 distributed.zero_stage=3 > "$run.out" 2>&1 \
    || { fail "$config: training"; tail -3 "$run.out"; continue; }
  params=$("$anvil" inspect "$run" | sed -n 's/^model:.* \([0-9]*\) parameters.*/\1/p')
  rss=$(peak_rss_mib "$anvil" export "$run" "$run-hf")
  fp32_mib=$(( ${params:-0} * 4 / 1048576 ))
  [ "$rss" != failed ] && [ "$fp32_mib" -gt 0 ] && [ "$rss" -lt "$fp32_mib" ] \
    && pass "$config: export of the 2-shard checkpoint peaks at $rss MiB, below the weights' $fp32_mib MiB" \
    || fail "$config: export peak $rss MiB, weights $fp32_mib MiB"
  "$anvil" import "$run-hf" "$run-import" > /dev/null 2>&1 || fail "$config: import"
  a=$(loss "$("$anvil" eval "$run" --data "$data" --max-samples 16 2>/dev/null | tail -1)")
  b=$(loss "$("$anvil" eval "$run-hf" --data "$data" --max-samples 16 2>/dev/null | tail -1)")
  c=$(loss "$("$anvil" eval "$run-import" --data "$data" --max-samples 16 2>/dev/null | tail -1)")
  d=$(loss "$("${reader[@]}" loss "$run-hf" "$data/val" 16 2>/dev/null)")
  [ "$a" = "$b" ] && [ "$a" = "$c" ] && close "$d" "$a" 1e-5 \
    && pass "$config: eval loss $a from the checkpoint, the export and the import; the reader's $d" \
    || fail "$config: eval losses checkpoint $a, export $b, import $c, reader $d"
done
exit $failures
