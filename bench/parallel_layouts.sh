#!/usr/bin/env bash
# Tensor parallelism against data parallelism and one process, in one sitting on this machine: a
# GPT-2 of 4 layers, d_model 1024 and 4 heads of 256 (at 2 ranks a share of every product is a
# whole number of the GEMM's k blocks; D_MODEL=768 N_HEADS=12, GPT-2 124M's width and heads, gives
# each rank 384 channels, so that blocks straddle the ranks) with GPT-2's padded vocabulary of 50304
# (102M parameters) on the Brown news documents in sequences of 64 (ids from the 1024-token cut of
# tests/lib.sh), global batch 16, fp32, deterministic, 10 steps. Prints each run's tokens/s (its
# "trained" line), memory per rank and weight digest, in alternating rounds; the digests must all
# agree, or the script fails.
# Usage: [D_MODEL=1024 N_HEADS=4] bench/parallel_layouts.sh [ROUNDS]   (default 2)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rounds="${1:-2}"
anvil="$root/build/bin/anvil"
[ -x "$anvil" ] || { echo "build anvil first (scripts/build.sh)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
src="$root"
# shellcheck source=../tests/lib.sh
source "$root/tests/lib.sh"
small_gpt2_vocab "$root" "$tmp/vocab"
prepare_brown_news "$anvil" "$root" "$tmp" 64 "$tmp/vocab"
m=(variables.data="$tmp/data" variables.tokenizer="$tmp/vocab" max_seq_len=64 eval_loader=null max_duration=10ba
   global_train_batch_size=16 seed=5 model.n_layers=4 model.d_model="${D_MODEL:-1024}" model.n_heads="${N_HEADS:-4}"
   model.vocab_size=50304
   progress_bar=false)
digests=()
run() {
  local name="$1" np="$2" threads="$3"; shift 3
  rm -rf "$tmp/$name"
  OMP_NUM_THREADS="$threads" mpirun_anvil "$np" "$anvil" train "$root/tests/configs/tiny-gpt2.yaml" \
    run_dir="$tmp/$name" "${m[@]}" "$@" > "$tmp/$name.out" 2>&1 || { tail -5 "$tmp/$name.out"; exit 1; }
  local digest
  digest=$("$anvil" inspect "$tmp/$name" 2>/dev/null | sed -n 's/^weights sha256: //p')
  digests+=("$digest")
  printf '%-32s %s | %s | %s\n' "$name ($np rank(s), $threads thread(s))" \
    "$(grep -h 'trained' "$tmp/$name.out" | head -1 | sed 's/.* (\(.*\))$/\1/')" \
    "$(grep -h 'memory per rank' "$tmp/$name/train.log" | head -1 | sed 's/.*memory per rank: //')" "${digest:0:16}"
}
echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores"
for round in $(seq "$rounds"); do
  echo "round $round"
  run one_process 1 "$(nproc)"
  run data_parallel_2 2 1
  run tensor_parallel_2 2 1 distributed.tensor_parallel=2
done
for d in "${digests[@]}"; do
  [ "$d" = "${digests[0]}" ] || { echo "FAIL: the layouts' weights differ" >&2; exit 1; }
done
echo "every layout: weights sha256 ${digests[0]}"
