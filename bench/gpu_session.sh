#!/usr/bin/env bash
# What a session lent a GPU checks and measures, as one command that fits a short lease (about 10
# minutes on an H100): the GPU kernels against the reference on the hardware (the tensor-core
# product's layout and the flash attention kernels first), anvil doctor, training on the GPU
# against the CPU, then anvil against PyTorch on the models of docs/PERFORMANCE.md's GPU table,
# one round each (bench/train_vs_pytorch.sh; rerun it with --rounds 5 for a figure to record),
# deterministic_mode's cost, and against llm.c (bench/llmc_vs_anvil.sh) where its sources are here.
# Uses build/cuda-release (built here when missing: carry it to skip the build; on a machine
# without Debian's libraries, carry bench/device_bundle.sh's .devpack and source its setup.sh).
# Everything it prints also goes to OUT/gpu_session_WHAT.log; each benchmark's lines to
# OUT/bench_NAME.log, the op profile to OUT/profile_124m_bf16.log.
# Usage: bench/gpu_session.sh [OUT [checks|bench|all]]   (OUT defaults to $OUT, else
# /tmp/anvil-gpu-session; checks: the tests alone, about 4 minutes; bench: the benchmarks alone,
# about 6; all, the default: both, for a device call's 10-minute limit when nothing else is slow)
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${1:-${OUT:-/tmp/anvil-gpu-session}}"
what="${2:-all}"
case "$what" in checks|bench|all) ;; *) echo "what to run: checks, bench or all, not '$what'" >&2; exit 2 ;; esac
mkdir -p "$out"
exec > >(tee "$out/gpu_session_$what.log") 2>&1
bin=build/cuda-release/bin
step() { echo "== $(date +%T) $*"; }

step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python3 -c "import torch; print('PyTorch', torch.__version__, 'CUDA', torch.version.cuda)" 2>/dev/null ||
  echo "no PyTorch: the comparisons below will install Debian's"
if [ ! -x "$bin/anvil" ] || [ ! -x "$bin/test_gpu_ops" ]; then
  step "building cuda-release"
  cmake --preset cuda-release > /dev/null && cmake --build build/cuda-release -j"$(nproc)" --target anvil test_gpu_ops |
    grep -E "error" || true
fi

# Ordered so that a lease cut short still returns the most: the kernels against the reference,
# the op profile and the kernel times (what the speed work starts from), the headline
# comparisons, then training against the CPU, then the rest of the benchmarks.
if [ "$what" != bench ]; then
  step "tensor-core product and flash attention against the reference"
  timeout 90 "$bin/test_gpu_ops" --gtest_brief=1 --gtest_filter='Mma*:*attention*'
  step "every other GPU op"
  timeout 150 "$bin/test_gpu_ops" --gtest_brief=1 --gtest_filter='-Mma*:*attention*'
  step "doctor"
  timeout 60 "$bin/anvil" doctor
fi
# name, then train_vs_pytorch.sh's arguments
bench() {
  local name="$1"
  shift
  step "bench $name: $*"
  timeout 150 bench/train_vs_pytorch.sh "$@" > "$out/bench_$name.log" 2>&1
  tail -4 "$out/bench_$name.log"
}
gpt2_124m=(configs/bench-124m.yaml --steps 5 --rounds 1 --attention sdpa kernels=gpu max_seq_len=1024
           model.max_seq_len=1024 global_train_batch_size=8 device_train_microbatch_size=8)
# llm.c's train_gpt2cu, the issue's reference for GPT-2 124M, where its sources were brought along
# (LLMC, default .llmc: see docs/PERFORMANCE.md)
llmc="${LLMC:-.llmc}"
llmc_bench() {
  if [ -f "$llmc/train_gpt2.cu" ]; then
    step "anvil against llm.c"
    timeout 150 bench/llmc_vs_anvil.sh "$llmc" --rounds 1 --steps 10 2>&1 | tee "$out/bench_llmc.log" | tail -3
  else
    echo "no llm.c sources in $llmc: the comparison with llm.c is skipped"
  fi
}
if [ "$what" != checks ]; then
  step "op profile, GPT-2 124M amp_bf16"
  timeout 90 "$bin/anvil" bench train configs/bench-124m.yaml kernels=gpu deterministic_mode=false max_seq_len=1024 \
    model.max_seq_len=1024 global_train_batch_size=8 device_train_microbatch_size=8 precision=amp_bf16 --steps 3 \
    --profile 2>&1 | tee "$out/profile_124m_bf16.log" | tail -40
  step "kernel times, GPT-2 124M amp_bf16 (ncu)"
  timeout 90 bench/gpu_kernel_times.sh /tmp/anvil-gpu-kernels.csv 2>&1 | head -40
  bench 124m_bf16 "${gpt2_124m[@]}" precision=amp_bf16 deterministic_mode=false
  llmc_bench
fi
if [ "$what" != bench ]; then
  step "training on the GPU (tests/gpu/test_gpu_training.sh)"
  timeout 240 tests/gpu/test_gpu_training.sh "$bin/anvil" "$root"
fi
[ "$what" != checks ] || { step "done"; exit 0; }
bench 350m_bf16 configs/bench-124m.yaml --steps 3 --rounds 1 --attention sdpa kernels=gpu model.n_layers=24 \
  model.n_heads=16 model.d_model=1024 max_seq_len=2048 model.max_seq_len=2048 global_train_batch_size=8 \
  device_train_microbatch_size=8 precision=amp_bf16 deterministic_mode=false
# (--warmup 4: GPT-2 124M's second step runs again when its gradients outgrow their first fixed-point scale)
bench 124m_bf16_deterministic "${gpt2_124m[@]}" --warmup 4 precision=amp_bf16 deterministic_mode=true
bench 124m_bf16_compiled "${gpt2_124m[@]}" --compile precision=amp_bf16 deterministic_mode=false
bench 124m_fp32 "${gpt2_124m[@]}" precision=fp32 deterministic_mode=false
step "done"
