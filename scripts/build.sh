#!/usr/bin/env bash
# Configures and builds anvil (the cpu-release preset) into build/; the CLI lands in build/bin/anvil.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
cmake --preset cpu-release > build-configure.log 2>&1 || { cat build-configure.log; exit 1; }
rm -f build-configure.log
cmake --build build -j"$(nproc)" 2>&1 | grep -E "error:|warning:|Error " || true
[ -x build/bin/anvil ] || { echo "build failed: run 'cmake --build build' to see why" >&2; exit 1; }
