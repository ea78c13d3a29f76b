#!/usr/bin/env bash
# anvil's MPI backend uses standard MPI only: build the collectives test against MPICH (beside
# the Open MPI build) and run it under MPICH's own launcher on 1, 2 and 3 ranks. The build is
# unoptimised (-O0, ANVIL_OPTIMIZE off): it checks the MPI calls, not speed, and compiles in a
# fraction of the time.
# Usage: test_mpich.sh SOURCE_DIR
set -uo pipefail
src="$1"
if ! command -v mpicc.mpich > /dev/null || ! command -v mpiexec.mpich > /dev/null; then
  echo "FAIL: MPICH is not installed (scripts/setup.sh installs mpich and libmpich-dev)"; exit 1
fi
build=$(mktemp -d); trap 'rm -rf "$build"' EXIT
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE= -DANVIL_OPTIMIZE=OFF -DMPI_C_COMPILER=/usr/bin/mpicc.mpich \
  > "$build/configure.log" 2>&1 \
  || { echo "FAIL: configure against MPICH"; tail -20 "$build/configure.log"; exit 1; }
grep -q "Found MPI_C: .*mpich" "$build/configure.log" || { echo "FAIL: CMake did not pick MPICH"; grep MPI "$build/configure.log"; exit 1; }
cmake --build "$build" --target test_collectives -j "$(nproc)" > "$build/build.log" 2>&1 \
  || { echo "FAIL: build against MPICH"; grep -E "error|undefined" "$build/build.log" | head -20; exit 1; }
# Captured first: under pipefail, grep -q closing the pipe early can kill ldd with SIGPIPE.
linked=$(ldd "$build/bin/test_collectives")
grep -q libmpich <<< "$linked" || { echo "FAIL: test_collectives is not linked to MPICH"; exit 1; }
fail=0
for np in 1 2 3; do
  OMP_NUM_THREADS=1 mpiexec.mpich -n "$np" "$build/bin/test_collectives" || { echo "FAIL: MPICH, $np rank(s)"; fail=1; }
done
exit $fail
