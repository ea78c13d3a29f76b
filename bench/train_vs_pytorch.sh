#!/usr/bin/env bash
# anvil and PyTorch training the same model (any family) on this machine in one run, alternating
# round by round so both see the same machine, and the median of the per-round speed ratios
# (robust to a noisy neighbour). key=value overrides go to anvil; PyTorch
# (bench/pytorch_decoder.py) builds the model, batch and precision that anvil reports in its JSON
# line. With kernels=gpu both run on the GPU (anvil from the cuda-release build, PyTorch on cuda)
# and the memory compared is GPU memory; otherwise both run on the CPU with all its threads, and on the CPU PyTorch runs twice: as Debian ships it, and tuned (a
# caching allocator, tcmalloc, preloaded; OpenBLAS told to use its AVX-512 kernels where the CPU
# has them, which its Debian build does not detect on Zen 4/5). Installs Debian's python3-torch
# and libtcmalloc-minimal4 if they are missing.
# Usage: bench/train_vs_pytorch.sh [CONFIG] [--steps N] [--rounds R] [--warmup W] [--attention manual|sdpa]
#                                  [--compile] [key=value ...]   (--compile: PyTorch's model under
#                                  torch.compile; --warmup: anvil's untimed steps, default its own 2;
#                                  deterministic_mode wants 4, since a step run again at a new
#                                  fixed-point scale would be timed)
#        (default configs/bench-16m.yaml; e.g. precision=amp_bf16, max_seq_len=1024, kernels=gpu)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
config=configs/bench-16m.yaml steps=5 rounds=5 attention=manual compile=() overrides=() warmup=()
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --warmup) warmup=(--warmup "$2"); shift 2 ;;
    --attention) attention="$2"; shift 2 ;;
    --compile) compile=(--compile); shift ;;
    *=*) overrides+=("$1"); shift ;;
    *) config="$1"; shift ;;
  esac
done
python=python3
command -v /usr/bin/python3 > /dev/null && /usr/bin/python3 -c "import torch" 2>/dev/null && python=/usr/bin/python3
apt_install() {
  local sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get -o DPkg::Lock::Timeout=900 install -y -qq "$@" >/dev/null
}
if ! "$python" -c "import torch" 2>/dev/null; then
  echo "installing python3-torch (Debian) for the comparison"
  apt_install python3-torch
  python=/usr/bin/python3
fi
# The device comes from the last kernels= override or the config's kernels: key; everything else
# PyTorch builds (shape, architecture, batch, precision) from the JSON line anvil prints.
kernels=""
for o in ${overrides[@]+"${overrides[@]}"}; do [ "${o%%=*}" = kernels ] && kernels="${o#*=}"; done
[ -n "$kernels" ] || kernels=$(sed -n 's/^kernels: *\([a-z]*\).*/\1/p' "$config" | head -1)
threads=$(nproc)
export OMP_NUM_THREADS=$threads
anvil=build/bin/anvil device=cpu memory=peak_rss_mib tuned=()
if [ "$kernels" = gpu ]; then
  anvil=build/cuda-release/bin/anvil device=cuda memory=gpu_peak_mib
  [ -x "$anvil" ] || { cmake --preset cuda-release > /dev/null && cmake --build build/cuda-release -j"$threads" --target anvil > /dev/null; }
else
  [ -x "$anvil" ] || scripts/build.sh
  tcmalloc=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
  [ -f "$tcmalloc" ] || { echo "installing libtcmalloc-minimal4 (Debian) for tuned PyTorch"; apt_install libtcmalloc-minimal4; }
  tuned=(env LD_PRELOAD="$tcmalloc")
  grep -qw avx512f /proc/cpuinfo && tuned+=(OPENBLAS_CORETYPE=SkylakeX)
fi
echo "config: $config ${overrides[*]+${overrides[*]}}; on $device ($threads threads), $steps timed steps x $rounds" \
     "rounds; PyTorch attention: $attention${compile[@]+, torch.compile}"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); avx512: $(grep -qw avx512f /proc/cpuinfo && echo yes || echo no)"
field() { "$python" -c 'import json, sys; print(json.loads(sys.stdin.read())[sys.argv[1]])' "$1"; }
describe() {
  "$python" -c 'import json, sys; r = json.loads(sys.argv[1])
print("model: %s; seq %d, batch %d, %s" % (json.dumps(r["model"]), r["seq_len"], r["batch"], r["precision"]))' "$1"
}
max() { awk -v x="$1" -v y="$2" 'BEGIN{print (x>y)?x:y}'; }
median() { printf '%s\n' "$@" | sort -n | awk '{v[NR]=$1} END{print (NR%2)?v[(NR+1)/2]:(v[NR/2]+v[NR/2+1])/2}'; }
torch_run() {  # torch_run ANVIL_JSON [env ...]
  local run="$1"; shift
  ${@+"$@"} "$python" bench/pytorch_decoder.py --anvil-json "$run" --steps "$steps" --threads "$threads" \
    --attention "$attention" ${compile[@]+"${compile[@]}"} 2>/dev/null
}
ratios=() tuned_ratios=()
best_anvil=0 best_torch=0 best_tuned=0 mem_anvil=0 mem_torch=0 mem_tuned=0
for r in $(seq "$rounds"); do
  a=$("$anvil" bench train "$config" ${overrides[@]+"${overrides[@]}"} --steps "$steps" ${warmup[@]+"${warmup[@]}"} \
    2>/dev/null | tail -1)
  [ "$r" -gt 1 ] || describe "$a"
  t=$(torch_run "$a")
  echo "round $r: anvil $a"
  echo "round $r: torch $t"
  ta=$(echo "$a" | field tokens_per_s); tt=$(echo "$t" | field tokens_per_s)
  ratios+=("$(awk -v a="$ta" -v t="$tt" 'BEGIN{printf "%.3f", a/t}')")
  best_anvil=$(max "$ta" "$best_anvil"); best_torch=$(max "$tt" "$best_torch")
  mem_anvil=$(max "$(echo "$a" | field "$memory")" "$mem_anvil")
  mem_torch=$(max "$(echo "$t" | field "$memory")" "$mem_torch")
  if [ ${#tuned[@]} -gt 0 ]; then
    u=$(torch_run "$a" "${tuned[@]}")
    echo "round $r: torch tuned $u"
    tu=$(echo "$u" | field tokens_per_s)
    tuned_ratios+=("$(awk -v a="$ta" -v t="$tu" 'BEGIN{printf "%.3f", a/t}')")
    best_tuned=$(max "$tu" "$best_tuned")
    mem_tuned=$(max "$(echo "$u" | field "$memory")" "$mem_tuned")
  fi
done
echo "per-round ratios (anvil/PyTorch): ${ratios[*]}"
awk -v a="$best_anvil" -v t="$best_torch" -v m="$(median "${ratios[@]}")" \
  'BEGIN{printf "best tokens/s: anvil %.0f, PyTorch %.0f; median ratio %.2fx\n", a, t, m}'
awk -v a="$mem_anvil" -v t="$mem_torch" -v w="$memory" \
  'BEGIN{printf "peak memory (%s): anvil %.0f MiB, PyTorch %.0f MiB; ratio %.2f\n", w, a, t, a/t}'
if [ ${#tuned[@]} -gt 0 ]; then
  echo "tuned PyTorch: ${tuned[*]:1}"
  echo "per-round ratios (anvil/tuned PyTorch): ${tuned_ratios[*]}"
  awk -v a="$best_anvil" -v t="$best_tuned" -v m="$(median "${tuned_ratios[@]}")" \
    'BEGIN{printf "best tokens/s: anvil %.0f, tuned PyTorch %.0f; median ratio %.2fx\n", a, t, m}'
  awk -v a="$mem_anvil" -v t="$mem_tuned" -v w="$memory" \
    'BEGIN{printf "peak memory (%s): anvil %.0f MiB, tuned PyTorch %.0f MiB; ratio %.2f\n", w, a, t, a/t}'
fi
