#!/usr/bin/env bash
# The whole test suite: installs and builds as needed, then runs every test through CTest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
scripts/setup.sh
scripts/build.sh
cd build
OMP_NUM_THREADS=2 ctest --output-on-failure "$@"
