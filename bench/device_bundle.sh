#!/usr/bin/env bash
# Packs what build/cuda-release's binaries need from Debian into one folder that travels to a
# machine without those packages (a lent GPU machine runs another distribution): every shared
# library the binaries, Open MPI's launcher and its plugins load, except the C runtime, the C++
# runtime and CUDA's own libraries, which such a machine has in newer versions; and Open MPI's
# tree (launcher, plugins, help texts) at the paths Debian installs it, relocated with OPAL_PREFIX.
# Usage: bench/device_bundle.sh [DIR]   (default .devlibs); then, on the other machine,
#        source DIR/env.sh   (sets LD_LIBRARY_PATH, PATH, OPAL_PREFIX and PMIx's plugin path)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${1:-$root/.devlibs}"
bin="$root/build/cuda-release/bin"
[ -x "$bin/anvil" ] || { echo "no $bin/anvil: build the cuda-release preset first" >&2; exit 1; }
arch_lib=/usr/lib/x86_64-linux-gnu
rm -rf "$dir"
mkdir -p "$dir/usr/bin" "$dir/usr/share" "$dir$arch_lib"
cp -a "$arch_lib/openmpi" "$arch_lib/pmix2" "$dir$arch_lib/"
cp -a /usr/share/openmpi "$dir/usr/share/"
cp /usr/bin/orterun /usr/bin/orted /usr/bin/ompi_info "$dir/usr/bin/"
ln -s orterun "$dir/usr/bin/mpirun"
# The libraries every loaded object needs, resolved here; the C and C++ runtimes and CUDA's
# libraries are left to the other machine.
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libresolv\.|libstdc\+\+|libgcc_s|libcuda\.|libcudart|libcublas|libnccl|libnvidia)'
objects=("$bin"/* /usr/bin/orterun /usr/bin/orted
         $(find "$arch_lib/openmpi" "$arch_lib/pmix2" -name '*.so*' -type f))
for o in "${objects[@]}"; do ldd "$o" 2>/dev/null || true; done |
  awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r name path; do
    grep -qE "$skip" <<< "$name" || cp -L "$path" "$dir$arch_lib/$name"
  done
cat > "$dir/env.sh" <<'ENV'
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
echo "bundle: $(du -sh "$dir" | cut -f1) in $dir"
