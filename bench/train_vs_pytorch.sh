#!/usr/bin/env bash
# anvil and PyTorch (Debian's python3-torch) training the same GPT-2 on this machine in one run,
# alternating round by round so both see the same machine, and the median of the per-round
# speed ratios (robust to a noisy neighbour). Installs python3-torch if missing.
# Usage: bench/train_vs_pytorch.sh [CONFIG] [--steps N] [--rounds R] [key=value ...]
#        (default configs/bench-16m.yaml; key=value overrides go to anvil, e.g. precision=amp_bf16)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
config=configs/bench-16m.yaml steps=5 rounds=5 overrides=()
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    *=*) overrides+=("$1"); shift ;;
    *) config="$1"; shift ;;
  esac
done
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "installing python3-torch (Debian) for the comparison"
  apt-get -o DPkg::Lock::Timeout=900 install -y -qq python3-torch >/dev/null
fi
[ -x build/bin/anvil ] || scripts/build.sh
threads=$(nproc)
export OMP_NUM_THREADS=$threads
get() { sed -n "s/^ *$1: *\([0-9]*\).*/\1/p" "$config" | head -1; }
layers=$(get n_layers) heads=$(get n_heads) dmodel=$(get d_model) vocab=$(get vocab_size)
seq=$(get max_seq_len) batch=$(get global_train_batch_size)
echo "model: GPT-2 L=$layers H=$heads d=$dmodel V=$vocab T=$seq B=$batch, fp32, AdamW, $threads threads, $steps timed steps x $rounds rounds"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); avx512: $(grep -qw avx512f /proc/cpuinfo && echo yes || echo no)"
ratios=()
best_anvil=0 best_torch=0 mem_anvil=0 mem_torch=0
for r in $(seq "$rounds"); do
  a=$(build/bin/anvil bench train "$config" ${overrides[@]+"${overrides[@]}"} --steps "$steps" 2>/dev/null | tail -1)
  t=$(/usr/bin/python3 bench/pytorch_gpt2.py --layers "$layers" --heads "$heads" --d-model "$dmodel" --vocab "$vocab" \
        --seq "$seq" --batch "$batch" --steps "$steps" --threads "$threads")
  echo "round $r: anvil $a"
  echo "round $r: torch $t"
  ta=$(echo "$a" | sed 's/.*"tokens_per_s": \([0-9.]*\).*/\1/'); tt=$(echo "$t" | sed 's/.*"tokens_per_s": \([0-9.]*\).*/\1/')
  ratios+=("$(awk -v a="$ta" -v t="$tt" 'BEGIN{printf "%.3f", a/t}')")
  best_anvil=$(awk -v x="$ta" -v y="$best_anvil" 'BEGIN{print (x>y)?x:y}')
  best_torch=$(awk -v x="$tt" -v y="$best_torch" 'BEGIN{print (x>y)?x:y}')
  ma=$(echo "$a" | sed 's/.*"peak_rss_mib": \([0-9.]*\).*/\1/'); mt=$(echo "$t" | sed 's/.*"peak_rss_mib": \([0-9.]*\).*/\1/')
  mem_anvil=$(awk -v x="$ma" -v y="$mem_anvil" 'BEGIN{print (x>y)?x:y}')
  mem_torch=$(awk -v x="$mt" -v y="$mem_torch" 'BEGIN{print (x>y)?x:y}')
done
median=$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{v[NR]=$1} END{print (NR%2)?v[(NR+1)/2]:(v[NR/2]+v[NR/2+1])/2}')
echo "per-round ratios (anvil/PyTorch): ${ratios[*]}"
awk -v a="$best_anvil" -v t="$best_torch" -v m="$median" \
  'BEGIN{printf "best tokens/s: anvil %.0f, PyTorch %.0f; median ratio %.2fx\n", a, t, m}'
awk -v a="$mem_anvil" -v t="$mem_torch" \
  'BEGIN{printf "peak memory: anvil %.0f MiB, PyTorch %.0f MiB; ratio %.2f\n", a, t, a/t}'
