#!/usr/bin/env bash
# Training with kernels=gpu on a machine without a GPU: the gpu-emulated preset compiles the GPU
# sources as C++ against the emulated runtime and BLAS (src/device/emulated/), and
# tests/gpu/test_gpu_training.sh runs against it: the GPU paths of the trainer, data parallelism
# (deterministic mode, ZeRO 0-3, two ranks sharing the device), checkpoints between CPU and GPU,
# all checked for their logic (NCCL is not in this build; speed means nothing here).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
cmake --preset gpu-emulated > build-emulated-configure.log 2>&1 || { cat build-emulated-configure.log; exit 1; }
rm -f build-emulated-configure.log
cmake --build build/gpu-emulated -j"$(nproc)" --target anvil 2>&1 | grep -E "error:|warning: [^W]" || true
[ -x build/gpu-emulated/bin/anvil ] || {
  echo "the gpu-emulated build failed: run 'cmake --build build/gpu-emulated' to see why" >&2; exit 1; }
build/gpu-emulated/bin/anvil doctor
tests/gpu/test_gpu_training.sh build/gpu-emulated/bin/anvil "$root"
