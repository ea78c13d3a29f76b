#!/usr/bin/env bash
# Runs test_collectives under mpirun on 1, 2, 3 and 4 ranks (oversubscribed on small machines),
# then checks that a rank that never arrives ends the job, within the timeout, naming that rank.
set -uo pipefail
bin="$1"
source "$(dirname "$0")/../lib.sh"
fail=0
for np in 1 2 3 4; do
  if ! mpirun_anvil "$np" "$bin"; then echo "FAIL: collectives on $np rank(s)"; fail=1; fi
done

log=$(mktemp)
start=$(date +%s)
mpirun_anvil 4 "$bin" --late-rank 1 --timeout 3 >"$log" 2>&1
rc=$?
secs=$(( $(date +%s) - start ))
if [ "$rc" -ne 0 ] && grep -q "rank(s) 1 did not arrive" "$log" && [ "$secs" -lt 60 ]; then
  echo "ok: a rank that never arrives ends the job in ${secs} s: $(grep -m1 'did not arrive' "$log")"
else
  echo "FAIL: late rank: exit $rc after ${secs} s"; cat "$log"; fail=1
fi
rm -f "$log"
exit $fail
