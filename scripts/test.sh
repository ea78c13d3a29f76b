#!/usr/bin/env bash
# The whole test suite: installs and builds as needed, then runs every test through CTest, as many
# at once as there are cores (each test says how many it keeps busy: tests/CMakeLists.txt).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
scripts/setup.sh
scripts/build.sh
cd build
OMP_NUM_THREADS=2 ctest -j"$(nproc)" --output-on-failure "$@"
