#!/usr/bin/env bash
# The GPU builds, checked on a machine without a GPU (CI's), by the CPU build's test gpu_builds:
# anvil over the CUDA backend (nvcc, cuBLASLt, NCCL; sm_80 and sm_90a), which the CPU build links to
# the modules it has built once (cmake/backends.cmake), carries code for both architectures, and its
# GPU checks run (anvil doctor, training; they skip, saying why, without a GPU; test_gpu_ops is a
# test of its own); then every GPU kernel source, and the device layer, is compiled for AMD: gfx90a and gfx940 with
# Debian's hipcc (HIP 5.2), gfx942 with clang-19 over the same HIP headers. Debian has no
# hipBLASLt, so the GEMM wrapper (src/kernels/gpu/matmul.cpp) is compiled for CUDA only here; the
# flash attention kernels are NVIDIA's alone (AMD keeps the GEMM path: docs/gpu.md).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# Usage: check-gpu-builds.sh ANVIL_CUDA_BIN
anvil_cuda="$1"
echo "== CUDA: anvil over the CUDA backend (sm_80, sm_90a)"
# The embedded device code records the architecture it was assembled for.
embedded=$(strings "$anvil_cuda")
for arch in sm_80 sm_90a; do
  grep -q -- "-arch $arch " <<< "$embedded" || { echo "no $arch code in $anvil_cuda" >&2; exit 1; }
done
"$anvil_cuda" doctor
tests/gpu/test_gpu_training.sh "$anvil_cuda" "$root"

echo "== HIP: gfx90a and gfx940 (hipcc), gfx942 (clang-19)"
sources=(src/kernels/gpu/ops.cu src/kernels/gpu/optimizer.cu src/kernels/gpu/fixed_point.cu src/device/device.cpp)
out="$root/build/hip-check"
rm -rf "$out"
mkdir -p "$out"
flags=(-x hip -std=c++17 -O2 -DANVIL_GPU -DANVIL_HIP -Isrc -Wall -Werror -Wno-unused-parameter)
bitcode=/usr/lib/x86_64-linux-gnu/amdgcn/bitcode
# HIP 5.2's device libraries predate gfx942; its ISA library is the gfx940 one with the version
# constant 9400 changed to 9402.
devlibs="$out/devlibs"
mkdir -p "$devlibs"
for f in "$bitcode"/*.bc; do ln -sf "$f" "$devlibs/"; done
/usr/lib/llvm-15/bin/llvm-dis -o - "$bitcode/oclc_isa_version_940.bc" | sed 's/i32 9400/i32 9402/' |
  /usr/lib/llvm-15/bin/llvm-as -o "$devlibs/oclc_isa_version_942.bc"
for src in "${sources[@]}"; do
  obj="$out/$(basename "$src").o"
  hipcc "${flags[@]}" --offload-arch=gfx90a --offload-arch=gfx940 -c "$src" -o "$obj"
  obj942="$out/$(basename "$src").gfx942.o"
  /usr/lib/llvm-19/bin/clang++ "${flags[@]}" --offload-arch=gfx942 --rocm-path=/usr --rocm-device-lib-path="$devlibs" \
    -c "$src" -o "$obj942"
  # Each kernel object must carry code for its targets (the device layer is host code only).
  [[ "$src" == *.cu ]] || { echo "$src: compiles for HIP (host code)"; continue; }
  for pair in "$obj:gfx90a" "$obj:gfx940" "$obj942:gfx942"; do
    o="${pair%:*}" arch="${pair##*:}"
    objcopy --dump-section .hip_fatbin="$out/fatbin" "$o" /dev/null
    bundles=$(/usr/lib/llvm-19/bin/clang-offload-bundler --list --type=o --input="$out/fatbin")
    grep -q "$arch" <<< "$bundles" ||
      { echo "$src: no $arch code in $o" >&2; exit 1; }
  done
  echo "$src: gfx90a gfx940 gfx942"
done
echo "GPU builds: OK"
