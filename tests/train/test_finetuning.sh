#!/usr/bin/env bash
# Fine-tuning as a user does it: pretrain a small model, then fine-tune it (load_path, weights
# only) on instruction records in JSON lines, written here from the Brown corpus (name the genre
# of a passage; prompt/response and chat records), read directly or prepared to MDS first. The
# eval loss on held-out records falls; the fine-tuning run keeps the determinism contract
# (microbatch, world size, ZeRO stage, JSONL read directly or prepared); a dataset written as
# LLM Foundry writes one trains; bad records and settings are one-line errors.
# Usage: test_finetuning.sh ANVIL_BIN SOURCE_DIR
set -uo pipefail
anvil="$1" src="$2"
source "$src/tests/lib.sh"
start_test

pretrain_for_finetuning "$anvil" "$src" || { failures=1; exit 1; }
have_mpirun || skip "the 2-rank runs (no mpirun): the digests below compare the 1-rank runs"

# tests/configs/tiny-sft.yaml from the pretrained weights alone, in deterministic mode.
sft=("$src/tests/configs/tiny-sft.yaml" variables.records="$tmp/records" variables.tokenizer="$tmp/vocab"
     variables.pretrained="$tmp/pre" load_weights_only=true deterministic_mode=true)

# The user's run: records read directly, eval loss before, midway and after.
if "$anvil" train "${sft[@]}" run_dir="$tmp/sft" > "$tmp/sft.out" 2>&1; then
  read -r before mid after <<< "$(eval_losses "$tmp/sft")"
  if /usr/bin/python3 -c "import sys; b, a = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if a < 0.7 * b else 1)" \
       "$before" "$after"; then
    pass "fine-tuning from the pretrained checkpoint: held-out response loss $before -> $mid -> $after"
  else
    fail "the held-out loss did not fall enough: $before -> $mid -> $after"
  fi
  grep -q "loaded the weights of $tmp/pre" "$tmp/sft/train.log" && pass "started from the pretrained weights" \
    || fail "load_path not loaded"
  if grep -q "prepared into $tmp/sft/finetuning_data/train: 1350 record(s): [0-9]* example(s)" "$tmp/sft/train.log" &&
     grep -q "truncated" "$tmp/sft/train.log" && [ -f "$tmp/sft/finetuning_data/train/chat_template.json" ]; then
    pass "the records' fate is logged: $(grep -o '1350 record(s).*' "$tmp/sft/train.log" | head -1)"
  else
    fail "preparation report"; grep "records" "$tmp/sft/train.log"
  fi
  # anvil eval scores the held-out examples as the run's evaluation does.
  ckpt=$(ls -d "$tmp/sft/checkpoints"/step-* | tail -1)
  got=$("$anvil" eval "$ckpt" --data "$tmp/sft/finetuning_data" --split eval 2>/dev/null | tail -1 |
        /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["loss"])')
  if /usr/bin/python3 -c "import sys; sys.exit(0 if abs(float(sys.argv[1]) - float(sys.argv[2])) < 1e-4 else 1)" \
       "${got:-nan}" "$after"; then
    pass "anvil eval on the prepared validation split: $got (the run's last eval: $after)"
  else
    fail "anvil eval gave '$got', the run's last eval $after"
  fi
  # An independent reader of the exported model, with Foundry's collator written from its
  # definition (masking, EOS, transformers' shift), gets the same held-out loss.
  "$anvil" export "$ckpt" "$tmp/hf" > /dev/null 2>&1
  ref=$(/usr/bin/python3 "$src/tests/interop/hf_reference.py" loss "$tmp/hf" "$tmp/sft/finetuning_data/eval" 1000 |
        /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["loss"])')
  if /usr/bin/python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if abs(a - b) < 1e-5 * b else 1)" \
       "${ref:-nan}" "$after"; then
    pass "PyTorch on the exported model, examples made as Foundry's collator makes them: $ref"
  else
    fail "the reference's held-out loss is '$ref', anvil's $after"
  fi
else
  fail "fine-tuning run"; tail -5 "$tmp/sft.out"
fi

# The determinism contract holds for fine-tuning runs: 6 steps, cut as microbatches of 8 or 2,
# on 1 rank or 2 (ZeRO-2), from JSON lines or from the same records prepared to MDS.
short=(max_duration=6ba eval_interval=6ba eval_first=false)
"$anvil" train "${sft[@]}" "${short[@]}" run_dir="$tmp/d8" > "$tmp/d8.out" 2>&1
"$anvil" train "${sft[@]}" "${short[@]}" device_train_microbatch_size=2 train_loader.num_workers=2 \
  run_dir="$tmp/d2" > "$tmp/d2.out" 2>&1
have_mpirun && mpirun_anvil 2 "$anvil" train "${sft[@]}" "${short[@]}" distributed.zero_stage=2 run_dir="$tmp/dp2" \
  > "$tmp/dp2.out" 2>&1
"$anvil" data prepare --format finetuning --tokenizer "$tmp/vocab" --max-seq-len 128 --out "$tmp/ftmds" \
  "$tmp/records" > "$tmp/prep.out" 2>&1
"$anvil" train "${sft[@]}" "${short[@]}" train_loader.dataset.hf_name=null \
  train_loader.dataset.local="$tmp/ftmds" eval_loader.dataset.hf_name=null eval_loader.dataset.local="$tmp/ftmds" \
  run_dir="$tmp/mds" > "$tmp/mds.out" 2>&1
d8=$(checkpoint_digest "$tmp/d8")
if [ -n "$d8" ] && [ "$d8" = "$(checkpoint_digest "$tmp/d2")" ] && { ! have_mpirun || [ "$d8" = "$(checkpoint_digest "$tmp/dp2")" ]; } &&
   [ "$d8" = "$(checkpoint_digest "$tmp/mds")" ]; then
  pass "one weights digest for microbatch 8 and 2, 1 rank and 2 ranks (ZeRO-2), JSONL and prepared MDS: ${d8:0:16}"
else
  fail "fine-tuning digests differ: $d8 / $(checkpoint_digest "$tmp/d2") / $(checkpoint_digest "$tmp/dp2") / $(checkpoint_digest "$tmp/mds")"
  tail -2 "$tmp/d2.out" "$tmp/dp2.out" "$tmp/mds.out"
fi

# Packed examples (packing_ratio): the same contract, and the packing is reported.
packed=("${short[@]}" train_loader.dataset.packing_ratio=1.5)
"$anvil" train "${sft[@]}" "${packed[@]}" run_dir="$tmp/p8" > "$tmp/p8.out" 2>&1
"$anvil" train "${sft[@]}" "${packed[@]}" device_train_microbatch_size=2 train_loader.num_workers=2 \
  run_dir="$tmp/p2" > "$tmp/p2.out" 2>&1
have_mpirun && mpirun_anvil 2 "$anvil" train "${sft[@]}" "${packed[@]}" distributed.zero_stage=3 run_dir="$tmp/pdp2" \
  > "$tmp/pdp2.out" 2>&1
p8=$(checkpoint_digest "$tmp/p8")
if [ -n "$p8" ] && [ "$p8" = "$(checkpoint_digest "$tmp/p2")" ] && { ! have_mpirun || [ "$p8" = "$(checkpoint_digest "$tmp/pdp2")" ]; } && [ "$p8" != "$d8" ] &&
   grep -q "packing (packing_ratio 1.5): [0-9]* examples in 96 sequences over the run" "$tmp/p8/train.log"; then
  pass "packed: one digest for microbatch 8 and 2 and 2 ranks (ZeRO-3): ${p8:0:16}; $(grep -o '[0-9]* examples in 96 sequences over the run, [0-9.]* per sequence' "$tmp/p8/train.log")"
else
  fail "packed digests: $p8 / $(checkpoint_digest "$tmp/p2") / $(checkpoint_digest "$tmp/pdp2")"; tail -3 "$tmp/p8.out" "$tmp/pdp2.out"
fi

# allow_pad_trimming cuts each step after the last position the global batch trains on: at
# max_seq_len 512 far shorter, with the same weights (a fresh model: the pretrained one has 128
# positions).
trim=(max_seq_len=512 load_path=null max_duration=4ba eval_interval=4ba eval_first=false)
"$anvil" train "${sft[@]}" "${trim[@]}" run_dir="$tmp/t0" > "$tmp/t0.out" 2>&1
"$anvil" train "${sft[@]}" "${trim[@]}" train_loader.dataset.allow_pad_trimming=true device_train_microbatch_size=4 \
  run_dir="$tmp/t1" > "$tmp/t1.out" 2>&1
cut=$(grep -o 'cut to [0-9]* of max_seq_len 512' "$tmp/t1/train.log" | cut -d' ' -f3)
if [ -n "$(checkpoint_digest "$tmp/t0")" ] && [ "$(checkpoint_digest "$tmp/t0")" = "$(checkpoint_digest "$tmp/t1")" ] && [ "${cut:-512}" -lt 512 ]; then
  pass "allow_pad_trimming: the first step cut to $cut of 512 tokens, the same weights as untrimmed"
else
  fail "allow_pad_trimming: $(checkpoint_digest "$tmp/t0") vs $(checkpoint_digest "$tmp/t1"), cut '$cut'"; tail -3 "$tmp/t1.out"
fi
grep -q "prepared $tmp/ftmds/train from 1 file(s): 1350 record(s)" "$tmp/prep.out" \
  && pass "data prepare --format finetuning: $(head -1 "$tmp/prep.out" | cut -c1-120)" || { fail "prepare"; cat "$tmp/prep.out"; }

# A dataset written as LLM Foundry's conversion script writes one (turns with attention_mask).
/usr/bin/python3 - "$src/tests/data" "$tmp/ftmds/validation" "$tmp/foundry.jsonl" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[1])
import mds_reference
_, samples, _ = mds_reference.read_samples(sys.argv[2])
with open(sys.argv[3], "w") as f:
    for s in samples:
        turns = [{"input_ids": t["input_ids"], "attention_mask": [1] * len(t["input_ids"]), "labels": t["labels"]}
                 for t in s["turns"]]
        f.write(json.dumps({"turns": turns}) + "\n")
PY
/usr/bin/python3 "$src/tests/data/mds_reference.py" --write-turns "$tmp/foundry.jsonl" "$tmp/foundry/validation"
if "$anvil" train "${sft[@]}" "${short[@]}" max_duration=2ba eval_loader.dataset.hf_name=null \
     eval_loader.dataset.local="$tmp/foundry" eval_first=true run_dir="$tmp/foundry-run" > "$tmp/foundry.out" 2>&1 &&
   [ "$(eval_losses "$tmp/foundry-run" | cut -d' ' -f1)" = "${before:-none}" ]; then
  pass "a turns dataset written as Foundry writes it evaluates as anvil's own before training: $before"
else
  fail "Foundry-written dataset"; tail -3 "$tmp/foundry.out"
fi

# Bad records and settings: one line each, naming what is wrong.
mkdir -p "$tmp/bad"
printf '%s\n' '{"prompt": "a", "response": "b"}' \
  '{"messages": [{"role": "user", "content": "hi"}, {"role": "bot", "content": "hello"}]}' > "$tmp/bad/train.jsonl"
expect_error "a chat record with an unknown role" "train.jsonl:2: message 1: unknown role 'bot'" \
  "$anvil" train "${sft[@]}" train_loader.dataset.hf_name="$tmp/bad" run_dir="$tmp/bad-run"
expect_error "Foundry's preprocessing_fn" "preprocessing_fn 'my.mod:fn' names Python code" \
  "$anvil" train "${sft[@]}" train_loader.dataset.preprocessing_fn=my.mod:fn run_dir="$tmp/e1"
expect_error "a hub dataset name" "does not download from the Hugging Face hub" \
  "$anvil" train "${sft[@]}" train_loader.dataset.hf_name=tatsu-lab/alpaca run_dir="$tmp/e2"
expect_error "a text loader on fine-tuning examples" "read it with train_loader.name: finetuning" \
  "$anvil" train "$src/tests/configs/tiny-gpt2.yaml" "${pretrain[@]}" train_loader.dataset.local="$tmp/ftmds" \
  run_dir="$tmp/e3"
expect_error "a finetuning loader on pretraining text" "the dataset holds token sequences" \
  "$anvil" train "${sft[@]}" train_loader.dataset.hf_name=null train_loader.dataset.local="$tmp/data" \
  run_dir="$tmp/e4"
expect_error "an unknown target policy" "target_prompts 'some' is not known" \
  "$anvil" train "${sft[@]}" train_loader.dataset.target_prompts=some run_dir="$tmp/e5"
expect_error "packing_ratio auto" "auto (profiling for a ratio) is not supported" \
  "$anvil" train "${sft[@]}" train_loader.dataset.packing_ratio=auto run_dir="$tmp/e6"
expect_error "packing the eval loader" "packing is for the train loader" \
  "$anvil" train "${sft[@]}" eval_loader.dataset.packing_ratio=2 run_dir="$tmp/e7"

[ "$failures" -eq 0 ]
