#!/usr/bin/env bash
# anvil against llm.c (karpathy/llm.c's train_gpt2cu: GPT-2 124M in bf16 with its own CUDA kernels,
# the issue's speed reference) on this machine's GPU, alternating round by round: the same model
# (12 layers, 12 heads, d_model 768, vocabulary 50257, which llm.c pads to 50304 for its products;
# learned positions, tied head), sequence and
# batch, on random tokens, both initialised from scratch (llm.c's `-e d12`), llm.c without
# recomputation (`-r 0`, as anvil) and anvil in amp_bf16 with deterministic_mode off. Prints each
# side's tokens/s (llm.c's own figure for its timed steps after the first; anvil bench's JSON) and
# the ratio per round.
# LLMC: a directory holding llm.c's sources (train_gpt2.cu, llmc/, Makefile), for instance a
# snapshot of github.com/karpathy/llm.c; train_gpt2cu is built there when missing (nvcc, cuBLASLt;
# on a machine without a GPU, name its architecture: GPU_COMPUTE_CAPABILITY=90 for an H100).
# Usage: bench/llmc_vs_anvil.sh LLMC [--seq T] [--batch B] [--steps N] [--rounds R] [--build-only]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ $# -ge 1 ] || { echo "usage: bench/llmc_vs_anvil.sh LLMC [--seq T] [--batch B] [--steps N] [--rounds R] [--build-only]" >&2; exit 2; }
llmc="$(cd "$1" && pwd)"
shift
T=1024 B=8 steps=10 rounds=2 build_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build-only) build_only=1; shift ;;
    --seq) T="$2"; shift 2 ;;
    --batch) B="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    *) echo "unknown argument '$1'" >&2; exit 2 ;;
  esac
done
cd "$root"
if [ ! -x "$llmc/train_gpt2cu" ]; then
  [ -f "$llmc/train_gpt2.cu" ] || { echo "$llmc holds no llm.c sources (train_gpt2.cu)" >&2; exit 1; }
  echo "building llm.c's train_gpt2cu in $llmc"
  # CUDA 13 takes a cudaMemLocation where llm.c's snapshot passes a device number to cudaMemAdvise,
  # in its out-of-memory fallback to managed memory, which GPT-2 124M never reaches: the advice is
  # dropped so that the snapshot builds with either CUDA.
  sed -i 's/cudaCheck_(cudaMemAdvise(\*out, bytes, cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId), file, line);//' \
    "$llmc/llmc/cuda_utils.cuh"
  # NVML (llm.c's GPU-utilisation log) is linked only where its header is: llm.c compiles it out
  # without one, and a machine without a driver has no library to link.
  ldflags="-lcublas -lcublasLt"
  [ -f /usr/local/cuda/include/nvml.h ] && ldflags="$ldflags -lnvidia-ml"
  (cd "$llmc" && PATH=/usr/local/cuda/bin:$PATH make train_gpt2cu NO_MULTI_GPU=1 NO_USE_MPI=1 USE_CUDNN=0 \
     NVCC_LDFLAGS="$ldflags" > build.log 2>&1) || { tail -20 "$llmc/build.log"; exit 1; }
fi
[ "$build_only" = 0 ] || exit 0
anvil=build/cuda-release/bin/anvil
[ -x "$anvil" ] || { cmake --preset cuda-release > /dev/null && cmake --build build/cuda-release -j"$(nproc)" --target anvil > /dev/null; }
# llm.c's token file format (llmc/dataloader.h): 256 int32 of header (magic 20240520, version 1,
# token count), then uint16 tokens. Random tokens, enough for every step and its next-token shift.
tokens="$llmc/anvil_random_tokens.bin"
python3 - "$tokens" $(( (steps + 4) * B * T + 1 )) <<'EOF'
import array, random, sys
path, n = sys.argv[1], int(sys.argv[2])
header = array.array("i", [0] * 256)
header[0], header[1], header[2] = 20240520, 1, n
rng = random.Random(1234)
toks = array.array("H", (rng.randrange(50257) for _ in range(n)))
with open(path, "wb") as f:
    header.tofile(f)
    toks.tofile(f)
EOF
echo "GPT-2 124M, seq $T, batch $B, $steps steps a round; $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo 'GPU unknown')"
ratios=()
for r in $(seq "$rounds"); do
  # llm.c's tok/s column is an average over the steps after its first (an EMA, bias-corrected).
  l=$(cd "$llmc" && ./train_gpt2cu -i "$tokens" -j "$tokens" -e d12 -b "$B" -t "$T" -d $((B * T)) -x "$steps" \
        -v 100000 -m 2 -s 0 -h 0 -r 0 2>&1 | grep -E '^step' | tail -1 | sed -E 's/.* ([0-9]+) tok\/s.*/\1/')
  a=$("$anvil" bench train configs/bench-124m.yaml kernels=gpu precision=amp_bf16 deterministic_mode=false \
        max_seq_len="$T" model.max_seq_len="$T" global_train_batch_size="$B" device_train_microbatch_size="$B" \
        --steps "$steps" 2>/dev/null | tail -1 | python3 -c 'import json, sys; print(round(json.load(sys.stdin)["tokens_per_s"]))')
  ratio=$(awk -v a="$a" -v l="$l" 'BEGIN{printf "%.3f", a/l}')
  ratios+=("$ratio")
  echo "round $r: llm.c $l tokens/s, anvil $a tokens/s, anvil/llm.c $ratio"
done
echo "per-round ratios (anvil/llm.c): ${ratios[*]}"
